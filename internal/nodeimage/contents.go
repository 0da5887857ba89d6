package nodeimage

import (
	"path"
	"slices"
	"strings"
)

// Contents is what a node config may rely on in an image, recorded at bake so that a config
// can be checked against the image before any node boots (kiln check-config, kiln run
// --config): where a node can write, the users and groups the image has, its unit files and
// its programs.
type Contents struct {
	// Writable are the directories a node writes below, persistently: /var, each of
	// Overlays the image has as a directory (/etc always, /usr/local, /opt), /home and /root
	// when they are links into /var. Everything else is the read-only root.
	Writable []string `json:"writable"`
	// Users and Groups are the names in the image's /etc/passwd and /etc/group.
	Users  []string `json:"users"`
	Groups []string `json:"groups"`
	// Units are the unit file names the image ships (/usr/lib/systemd/system,
	// /etc/systemd/system), templates as "name@.service".
	Units []string `json:"units"`
	// ProgramDirs are the directories of the read-only root whose programs are recorded in
	// Programs: those of ProgramDirList the image has as directories. A program in another
	// directory is not known either way.
	ProgramDirs []string `json:"programDirs,omitempty"`
	// Programs are the absolute paths of the executable files and links in ProgramDirs.
	Programs []string `json:"programs,omitempty"`
	// Links are the root's top-level links into /usr on a merged-/usr image ("/bin" →
	// "/usr/bin"), by which a program path such as /bin/sh names a file in ProgramDirs.
	Links map[string]string `json:"links,omitempty"`
}

// ProgramDirList are the directories whose programs the bake records: where units, and the
// programs that read configuration from /etc, are found.
func ProgramDirList() []string {
	return []string{"/usr/bin", "/usr/sbin", "/usr/libexec", "/usr/lib/systemd", "/usr/lib/systemd/system-generators", "/bin", "/sbin"}
}

// LacksProgram reports whether the absolute path p names a program the image does not ship
// and a node cannot add: p (through Links) is in one of ProgramDirs, which are on the
// read-only root, and not in Programs. It also returns the path p resolves to. An image
// that recorded no programs lacks none.
func (c *Contents) LacksProgram(p string) (resolved string, lacks bool) {
	p = path.Clean(p)
	if !path.IsAbs(p) {
		return p, false
	}
	if top, rest, ok := strings.Cut(p[1:], "/"); ok {
		if t, ok := c.Links["/"+top]; ok {
			p = path.Join(t, rest)
		}
	}
	if !slices.Contains(c.ProgramDirs, path.Dir(p)) || c.IsWritable(p) {
		return p, false
	}
	return p, !slices.Contains(c.Programs, p)
}

// Overlay is a directory of the read-only root that stage 1 makes writable and persistent:
// an overlay whose upper and work directories are below State on the data filesystem.
type Overlay struct {
	Dir, State string
	// Required: the root must have Dir; the others get no overlay when the root lacks them.
	Required bool
}

// Overlays are the read-only root's writable directories, in mount order. The bake records
// those its tree has in Contents.Writable.
func Overlays() []Overlay {
	return []Overlay{
		{Dir: "/etc", State: StateDir + "/etc", Required: true},
		{Dir: "/usr/local", State: StateDir + "/usrlocal"},
		{Dir: "/opt", State: StateDir + "/opt"},
	}
}

// IsWritable reports whether a node can write the absolute path p: it is one of Writable or
// below one.
func (c *Contents) IsWritable(p string) bool {
	p = path.Clean(p)
	for _, w := range c.Writable {
		if p == w || strings.HasPrefix(p, w+"/") {
			return true
		}
	}
	return false
}

// HasUnit reports whether the image ships the unit name, or the template an instance
// ("getty@tty1.service") is made from.
func (c *Contents) HasUnit(name string) bool {
	if slices.Contains(c.Units, name) {
		return true
	}
	if at := strings.IndexByte(name, '@'); at > 0 {
		if dot := strings.LastIndexByte(name, '.'); dot > at {
			return slices.Contains(c.Units, name[:at+1]+name[dot:])
		}
	}
	return false
}
