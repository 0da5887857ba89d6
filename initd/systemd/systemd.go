// Package systemd manages systemd unit enablement offline, in a root directory that is
// not the running system: what `systemctl --root=DIR enable|disable|mask|unmask` does,
// without systemctl. The builder uses it on an image tree at bake time and kiln-init on
// the node's root at first boot.
//
// Units are looked up in /etc/systemd/system, /usr/lib/systemd/system and
// /lib/systemd/system (in that order, as systemd does). Enable follows the unit's
// [Install] section: WantedBy=, RequiredBy= and UpheldBy= become symlinks in
// /etc/systemd/system/<target>.wants|.requires|.upholds/, Alias= becomes a symlink in
// /etc/systemd/system, Also= enables the named units too. Links point at the unit file's
// absolute path as seen from the root (e.g. /lib/systemd/system/ssh.service), as
// systemctl makes them. Template units are supported: enabling getty@tty1.service links
// getty@.service under the instance name; enabling a template uses DefaultInstance=.
//
// Every function is idempotent and reports whether it changed anything. Symlinks in the
// tree are resolved with the root as "/", so nothing is read or written outside it.
//
// The builder imports this package: enabling a profile's units at bake time is node-side
// logic, and the bake runs it exactly as first boot does, so a unit enabled either way ends
// up with the same links. It is node code first and must never import builder/.
package systemd

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path"
	"slices"
	"strings"

	"github.com/kilnproject/kiln/initd/rootpath"
)

// ErrNotFound is returned (wrapped) when a unit file exists in none of the unit directories.
var ErrNotFound = errors.New("unit file not found")

// errNoInstall is returned (wrapped) by Enable for a unit without an [Install] section
// that names anything to link (a "static" unit).
var errNoInstall = errors.New("no [Install] section with WantedBy=, RequiredBy=, UpheldBy= or Alias=; it cannot be enabled")

// errMasked is returned (wrapped) by Enable for a masked unit.
var errMasked = errors.New("unit is masked")

// ConfigDir is where enablement links and masks live, relative to the root.
const ConfigDir = "etc/systemd/system"

// unitDirs are where units are looked up, most specific first, relative to the root.
func unitDirs() []string {
	return []string{ConfigDir, "usr/lib/systemd/system", "lib/systemd/system"}
}

// Install is the [Install] section of a unit file.
type Install struct {
	WantedBy        []string
	RequiredBy      []string
	UpheldBy        []string
	Alias           []string
	Also            []string
	DefaultInstance string
}

// empty reports whether the section names nothing to link: such a unit cannot be enabled.
func (in Install) empty() bool {
	return len(in.WantedBy)+len(in.RequiredBy)+len(in.UpheldBy)+len(in.Alias) == 0
}

// parseInstall reads the [Install] section of a unit file. Other sections, comments and
// unknown keys are skipped; list keys may repeat and hold several space-separated names;
// an empty assignment ("WantedBy=") resets the list, as in systemd.
func parseInstall(r io.Reader) (Install, error) {
	var in Install
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	inInstall := false
	var cont string // a line continued with a trailing backslash
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if cont != "" {
			line, cont = cont+" "+line, ""
		}
		if strings.HasSuffix(line, `\`) {
			cont = strings.TrimSuffix(line, `\`)
			continue
		}
		if line == "" || line[0] == '#' || line[0] == ';' {
			continue
		}
		if line[0] == '[' {
			inInstall = line == "[Install]"
			continue
		}
		if !inInstall {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			continue
		}
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		var list *[]string
		switch k {
		case "WantedBy":
			list = &in.WantedBy
		case "RequiredBy":
			list = &in.RequiredBy
		case "UpheldBy":
			list = &in.UpheldBy
		case "Alias":
			list = &in.Alias
		case "Also":
			list = &in.Also
		case "DefaultInstance":
			in.DefaultInstance = v
			continue
		default:
			continue
		}
		if v == "" {
			*list = nil
			continue
		}
		*list = append(*list, strings.Fields(v)...)
	}
	if err := sc.Err(); err != nil {
		return Install{}, fmt.Errorf("read [Install] section: %w", err)
	}
	return in, nil
}

// Unit is a unit file found in a root.
type Unit struct {
	// Name is the unit name asked for, e.g. getty@tty1.service.
	Name string
	// Path is the unit file's absolute path as seen from the root, e.g.
	// /lib/systemd/system/getty@.service (for an instance, the template's file).
	Path string
	// Install is the file's [Install] section.
	Install Install
}

// Find looks unit up in root's unit directories. A unit masked in /etc/systemd/system
// gives errMasked; a unit found nowhere gives ErrNotFound. For an instance name
// (a@b.service) the template file (a@.service) is used when there is no file for the
// instance itself.
func Find(root, unit string) (*Unit, error) {
	if err := checkName(unit); err != nil {
		return nil, err
	}
	names := []string{unit}
	if tmpl, ok := template(unit); ok {
		names = append(names, tmpl)
	}
	for _, name := range names {
		for _, dir := range unitDirs() {
			p := path.Join(dir, name)
			if dir == ConfigDir && isMaskLink(root, p) {
				return nil, fmt.Errorf("unit %s: %w (/%s links to /dev/null)", unit, errMasked, p)
			}
			f, err := openIn(root, p)
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			if err != nil {
				return nil, fmt.Errorf("unit %s: open /%s: %w", unit, p, err)
			}
			in, err := parseInstall(f)
			f.Close()
			if err != nil {
				return nil, fmt.Errorf("unit %s: /%s: %w", unit, p, err)
			}
			return &Unit{Name: unit, Path: "/" + p, Install: in}, nil
		}
	}
	return nil, fmt.Errorf("unit %s: %w (looked in /%s)", unit, ErrNotFound, strings.Join(unitDirs(), ", /"))
}

// Enable links unit as its [Install] section says (see the package doc) and enables the
// units named by Also=. Links that already point at the unit file are left alone; a
// symlink pointing elsewhere is replaced; a file or directory in the way is an error.
func Enable(root, unit string) (changed bool, err error) {
	return enable(root, unit, map[string]bool{})
}

func enable(root, unit string, seen map[string]bool) (bool, error) {
	if seen[unit] {
		return false, nil
	}
	seen[unit] = true
	u, err := Find(root, unit)
	if err != nil {
		return false, fmt.Errorf("enable: %w", err)
	}
	if u.Install.empty() && len(u.Install.Also) == 0 {
		return false, fmt.Errorf("enable: unit %s: %w", unit, errNoInstall)
	}
	name, err := instanceName(u)
	if err != nil {
		return false, fmt.Errorf("enable: %w", err)
	}
	links, err := linksFor(u, name)
	if err != nil {
		return false, fmt.Errorf("enable: %w", err)
	}
	r, err := os.OpenRoot(root)
	if err != nil {
		return false, fmt.Errorf("enable %s: %w", unit, err)
	}
	defer r.Close()
	changed := false
	for _, l := range links {
		c, err := ensureLink(r, l, u.Path)
		if err != nil {
			return changed, fmt.Errorf("enable %s: %w", unit, err)
		}
		changed = changed || c
	}
	for _, also := range u.Install.Also {
		c, err := enable(root, also, seen)
		if err != nil {
			return changed, fmt.Errorf("enable %s (Also=%s): %w", unit, also, err)
		}
		changed = changed || c
	}
	return changed, nil
}

// Disable removes every enablement link of unit in /etc/systemd/system: links named unit
// in *.wants, *.requires and *.upholds directories, its Alias= links, and any other
// symlink there that points at the unit's file. It then disables the units named by
// Also=. A unit that is not installed at all is not an error (nothing to remove); a mask
// is left in place (see Unmask).
func Disable(root, unit string) (changed bool, err error) {
	return disable(root, unit, map[string]bool{})
}

func disable(root, unit string, seen map[string]bool) (bool, error) {
	if seen[unit] {
		return false, nil
	}
	seen[unit] = true
	if err := checkName(unit); err != nil {
		return false, fmt.Errorf("disable: %w", err)
	}
	u, err := Find(root, unit)
	switch {
	case errors.Is(err, ErrNotFound), errors.Is(err, errMasked):
		u = &Unit{Name: unit}
	case err != nil:
		return false, fmt.Errorf("disable: %w", err)
	}
	r, err := os.OpenRoot(root)
	if err != nil {
		return false, fmt.Errorf("disable %s: %w", unit, err)
	}
	defer r.Close()
	victims, err := enablementLinks(r, u)
	if err != nil {
		return false, fmt.Errorf("disable %s: %w", unit, err)
	}
	changed := false
	for _, v := range victims {
		if err := r.Remove(v); err != nil {
			return changed, fmt.Errorf("disable %s: remove /%s: %w", unit, v, err)
		}
		changed = true
	}
	for _, also := range u.Install.Also {
		c, err := disable(root, also, seen)
		if err != nil {
			return changed, fmt.Errorf("disable %s (Also=%s): %w", unit, also, err)
		}
		changed = changed || c
	}
	return changed, nil
}

// Mask links /etc/systemd/system/<unit> to /dev/null, so systemd never starts the unit.
// A regular file or a different symlink at that path is an error: it would be lost.
func Mask(root, unit string) (changed bool, err error) {
	if err := checkName(unit); err != nil {
		return false, fmt.Errorf("mask: %w", err)
	}
	r, err := os.OpenRoot(root)
	if err != nil {
		return false, fmt.Errorf("mask %s: %w", unit, err)
	}
	defer r.Close()
	p := path.Join(ConfigDir, unit)
	fi, err := r.Lstat(p)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return false, fmt.Errorf("mask %s: %w", unit, err)
	case fi.Mode()&fs.ModeSymlink != 0:
		if t, err := r.Readlink(p); err == nil && t == os.DevNull {
			return false, nil
		}
		return false, fmt.Errorf("mask %s: /%s is a symlink to another unit; disable that first", unit, p)
	default:
		return false, fmt.Errorf("mask %s: /%s exists (%s); kiln does not mask over a unit file", unit, p, rootpath.TypeName(fi.Mode()))
	}
	if err := r.MkdirAll(ConfigDir, 0o755); err != nil {
		return false, fmt.Errorf("mask %s: %w", unit, err)
	}
	if err := r.Symlink(os.DevNull, p); err != nil {
		return false, fmt.Errorf("mask %s: %w", unit, err)
	}
	return true, nil
}

// Unmask removes the /dev/null link Mask made. Anything else at that path is left alone.
func Unmask(root, unit string) (changed bool, err error) {
	if err := checkName(unit); err != nil {
		return false, fmt.Errorf("unmask: %w", err)
	}
	p := path.Join(ConfigDir, unit)
	if !isMaskLink(root, p) {
		return false, nil
	}
	r, err := os.OpenRoot(root)
	if err != nil {
		return false, fmt.Errorf("unmask %s: %w", unit, err)
	}
	defer r.Close()
	if err := r.Remove(p); err != nil {
		return false, fmt.Errorf("unmask %s: %w", unit, err)
	}
	return true, nil
}

// isMasked reports whether unit is masked in /etc/systemd/system.
func isMasked(root, unit string) bool {
	return checkName(unit) == nil && isMaskLink(root, path.Join(ConfigDir, unit))
}

// isEnabled reports whether every link Enable would make for unit exists and points at
// the unit's file. A static unit (empty [Install]) is not enabled.
func isEnabled(root, unit string) (bool, error) {
	u, err := Find(root, unit)
	if errors.Is(err, ErrNotFound) || errors.Is(err, errMasked) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if u.Install.empty() {
		return false, nil
	}
	name, err := instanceName(u)
	if err != nil {
		return false, err
	}
	links, err := linksFor(u, name)
	if err != nil {
		return false, err
	}
	r, err := os.OpenRoot(root)
	if err != nil {
		return false, err
	}
	defer r.Close()
	for _, l := range links {
		if t, err := r.Readlink(l); err != nil || t != u.Path {
			return false, nil
		}
	}
	return true, nil
}

// linksFor lists the links (relative to the root) that enable u under name.
func linksFor(u *Unit, name string) ([]string, error) {
	var links []string
	for _, g := range []struct {
		by     []string
		suffix string
	}{{u.Install.WantedBy, ".wants"}, {u.Install.RequiredBy, ".requires"}, {u.Install.UpheldBy, ".upholds"}} {
		for _, by := range g.by {
			if err := checkName(by); err != nil {
				return nil, fmt.Errorf("unit %s: [Install]: %w", u.Name, err)
			}
			links = append(links, path.Join(ConfigDir, by+g.suffix, name))
		}
	}
	for _, a := range u.Install.Alias {
		if err := checkName(a); err != nil {
			return nil, fmt.Errorf("unit %s: [Install] Alias=: %w", u.Name, err)
		}
		if path.Ext(a) != path.Ext(u.Name) {
			return nil, fmt.Errorf("unit %s: [Install] Alias=%s has another unit type", u.Name, a)
		}
		links = append(links, path.Join(ConfigDir, a))
	}
	return links, nil
}

// instanceName is the name links get: the unit's name, or for a template enabled as
// such, its DefaultInstance.
func instanceName(u *Unit) (string, error) {
	prefix, ok := strings.CutSuffix(strings.TrimSuffix(u.Name, path.Ext(u.Name)), "@")
	if !ok {
		return u.Name, nil
	}
	if u.Install.DefaultInstance == "" {
		return "", fmt.Errorf("unit %s is a template without DefaultInstance=; enable an instance such as %s@foo%s", u.Name, prefix, path.Ext(u.Name))
	}
	return prefix + "@" + u.Install.DefaultInstance + path.Ext(u.Name), nil
}

// template returns the template name of an instance name: a@b.service → a@.service.
func template(unit string) (string, bool) {
	ext := path.Ext(unit)
	prefix, inst, ok := strings.Cut(strings.TrimSuffix(unit, ext), "@")
	if !ok || inst == "" {
		return "", false
	}
	return prefix + "@" + ext, true
}

// ensureLink makes link (relative to the root) a symlink to target.
func ensureLink(r *os.Root, link, target string) (bool, error) {
	fi, err := r.Lstat(link)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return false, err
	case fi.Mode()&fs.ModeSymlink != 0:
		if cur, err := r.Readlink(link); err == nil && cur == target {
			return false, nil
		}
		if err := r.Remove(link); err != nil {
			return false, fmt.Errorf("replace /%s: %w", link, err)
		}
	default:
		return false, fmt.Errorf("/%s exists (%s) where a link to %s belongs", link, rootpath.TypeName(fi.Mode()), target)
	}
	if err := r.MkdirAll(path.Dir(link), 0o755); err != nil {
		return false, fmt.Errorf("create /%s: %w", path.Dir(link), err)
	}
	if err := r.Symlink(target, link); err != nil {
		return false, fmt.Errorf("link /%s: %w", link, err)
	}
	return true, nil
}

// enablementLinks lists the symlinks under /etc/systemd/system (relative to the root)
// that enable u: links named like the unit in dependency directories, alias links, and
// links anywhere there whose target is the unit's file.
func enablementLinks(r *os.Root, u *Unit) ([]string, error) {
	top, err := readDir(r, ConfigDir)
	if err != nil {
		return nil, err
	}
	names := []string{u.Name}
	if n, err := instanceName(u); err == nil && n != u.Name {
		names = append(names, n)
	}
	var out []string
	consider := func(p, base string, inDeps bool) error {
		fi, err := r.Lstat(p)
		if err != nil || fi.Mode()&fs.ModeSymlink == 0 {
			return nil
		}
		t, err := r.Readlink(p)
		if err != nil {
			return fmt.Errorf("read link /%s: %w", p, err)
		}
		if t == os.DevNull {
			return nil // a mask, not an enablement
		}
		switch {
		case u.Path != "" && path.Clean(t) == u.Path:
		case inDeps && slices.Contains(names, base):
		case !inDeps && slices.Contains(u.Install.Alias, base) && path.Base(t) == path.Base(u.Path):
		default:
			return nil
		}
		out = append(out, p)
		return nil
	}
	for _, e := range top {
		p := path.Join(ConfigDir, e.Name())
		if e.IsDir() && isDepDir(e.Name()) {
			sub, err := readDir(r, p)
			if err != nil {
				return nil, err
			}
			for _, s := range sub {
				if err := consider(path.Join(p, s.Name()), s.Name(), true); err != nil {
					return nil, err
				}
			}
			continue
		}
		if err := consider(p, e.Name(), false); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func isDepDir(name string) bool {
	return strings.HasSuffix(name, ".wants") || strings.HasSuffix(name, ".requires") || strings.HasSuffix(name, ".upholds")
}

func readDir(r *os.Root, p string) ([]fs.DirEntry, error) {
	f, err := r.Open(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	es, err := f.ReadDir(-1)
	if err != nil {
		return nil, fmt.Errorf("read /%s: %w", p, err)
	}
	return es, nil
}

// isMaskLink reports whether p (relative to root) is a symlink to /dev/null.
func isMaskLink(root, p string) bool {
	r, err := os.OpenRoot(root)
	if err != nil {
		return false
	}
	defer r.Close()
	t, err := r.Readlink(p)
	return err == nil && t == os.DevNull
}

// openIn opens the file p (relative to root), resolving symlinks with root as "/".
func openIn(root, p string) (*os.File, error) {
	r, err := os.OpenRoot(root)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	resolved, err := rootpath.Resolve(r, p, nil)
	if err != nil {
		return nil, err
	}
	f, err := r.Open(resolved)
	if err != nil {
		return nil, err
	}
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		f.Close()
		if err == nil {
			err = fmt.Errorf("/%s is not a regular file", p)
		}
		return nil, err
	}
	return f, nil
}

// checkName refuses names that are not plain unit file names.
func checkName(unit string) error {
	switch {
	case unit == "", unit == ".", unit == "..":
		return fmt.Errorf("unit name %q is empty or a directory name", unit)
	case strings.ContainsAny(unit, "/\x00"):
		return fmt.Errorf("unit name %q contains a slash or NUL", unit)
	case path.Ext(unit) == "" || path.Ext(unit) == unit:
		return fmt.Errorf("unit name %q has no unit type suffix such as .service", unit)
	}
	return nil
}

// unitSuffixes are the unit types a unit file name ends with.
var unitSuffixes = []string{".service", ".socket", ".target", ".timer", ".mount", ".automount", ".swap", ".path", ".slice", ".scope", ".device"}

// UnitFiles lists the unit files under root: the names in every unit directory that end in
// a unit type (regular files and links, such as aliases; templates as "name@.service"),
// sorted and without duplicates. Masked units (links to /dev/null) are left out.
func UnitFiles(root string) ([]string, error) {
	r, err := os.OpenRoot(root)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	seen := map[string]bool{}
	for _, d := range unitDirs() {
		if fi, err := r.Lstat(d); err != nil || !fi.IsDir() {
			continue // absent, or /lib linking to /usr/lib
		}
		es, err := readDir(r, d)
		if err != nil {
			return nil, err
		}
		for _, e := range es {
			name := e.Name()
			if e.IsDir() || !slices.ContainsFunc(unitSuffixes, func(s string) bool { return strings.HasSuffix(name, s) }) {
				continue
			}
			if t, err := r.Readlink(path.Join(d, name)); err == nil && t == os.DevNull {
				continue
			}
			seen[name] = true
		}
	}
	return slices.Sorted(maps.Keys(seen)), nil
}
