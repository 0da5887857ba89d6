package config

import (
	"fmt"
	"path"
	"strings"

	"github.com/kilnproject/kiln/internal/nodeimage"
)

// A readBy is a configuration directory below /etc and the program that reads it: a config
// that writes there configures that program, and on an image without it the files do
// nothing.
type readBy struct {
	dir     string // with a trailing slash
	program string // absolute path in the image
	name    string // what the program is, for messages
	// instead, when the image ships unit insteadUnit, says how the image does the same.
	insteadUnit, instead string
}

// readers are the configuration directories that configs copied from other distributions'
// documentation write for programs a kiln image may lack.
var readers = []readBy{
	{"/etc/NetworkManager/", "/usr/sbin/NetworkManager", "NetworkManager", networkd, networkdHow},
	{"/etc/sysconfig/network-scripts/", "/usr/sbin/NetworkManager", "NetworkManager (ifcfg files)", networkd, networkdHow},
	{"/etc/containers/systemd/", "/usr/lib/systemd/system-generators/podman-system-generator", "podman's quadlet generator", "", ""},
	{"/etc/docker/", "/usr/bin/dockerd", "Docker (dockerd)", "", ""},
	{"/etc/crio/", "/usr/bin/crio", "CRI-O", "", ""},
	{"/etc/zincati/", "/usr/libexec/zincati", "zincati (Fedora CoreOS updates)", "", ""},
}

// networkd is how an image without NetworkManager configures its network.
const (
	networkd    = "systemd-networkd.service"
	networkdHow = "the image configures its network with systemd-networkd (.network files in /etc/systemd/network)"
)

// execKeys are the unit settings whose value starts with the program systemd runs.
var execKeys = map[string]bool{
	"ExecCondition": true, "ExecStartPre": true, "ExecStart": true, "ExecStartPost": true,
	"ExecReload": true, "ExecStop": true, "ExecStopPost": true,
}

// execLine is a command of a unit file: the line its setting starts on, the setting and
// the program's absolute path as written.
type execLine struct {
	line         int
	key, program string
}

// execPrograms returns the commands of the unit text whose program is an absolute path
// without specifiers or variables: the ones whose file can be looked for in an image.
func execPrograms(unit string) []execLine {
	var out []execLine
	lines := strings.Split(unit, "\n")
	for i := 0; i < len(lines); i++ {
		n, l := i+1, strings.TrimSpace(lines[i])
		for strings.HasSuffix(l, `\`) && i+1 < len(lines) { // continuation lines
			i++
			l = strings.TrimSuffix(l, `\`) + " " + strings.TrimSpace(lines[i])
		}
		if l == "" || l[0] == '#' || l[0] == ';' || l[0] == '[' {
			continue
		}
		key, value, ok := strings.Cut(l, "=")
		if key = strings.TrimSpace(key); !ok || !execKeys[key] {
			continue
		}
		// Prefixes change how systemd runs the command, not which program it runs.
		value = strings.TrimLeft(strings.TrimSpace(value), "-@:+!|")
		program, _, _ := strings.Cut(value, " ")
		if len(program) > 1 && (program[0] == '"' || program[0] == '\'') {
			if end := strings.IndexByte(value[1:], program[0]); end >= 0 {
				program = value[1 : end+1]
			}
		}
		if !path.IsAbs(program) || strings.ContainsAny(program, "%$") {
			continue
		}
		out = append(out, execLine{line: n, key: key, program: program})
	}
	return out
}

// checkPrograms refuses what a config gives programs the image does not ship: units (their
// contents and drop-ins) that run a program missing from the image's read-only root, where
// no node can add it, and files, directories and links written into a directory only such
// a program reads. Each program is named once per unit, and once for all the paths of one
// directory, with how many more fields or lines name it.
func (c *Config) checkPrograms(img *nodeimage.Contents, add func(key, field string, msg func(more int) string)) {
	ign := c.Ignition
	unit := func(field, text string) {
		for _, e := range execPrograms(text) {
			resolved, lacks := img.LacksProgram(e.program)
			if !lacks {
				continue
			}
			also := ""
			if resolved != path.Clean(e.program) {
				also = " (" + resolved + ")"
			}
			add(field+" "+resolved, field, func(more int) string {
				msg := fmt.Sprintf("line %d: %s runs %s%s, which is not in the image; %s is on its read-only root, where a node cannot add it",
					e.line, e.key, e.program, also, path.Dir(resolved))
				if more > 0 {
					msg += fmt.Sprintf(" (%d more lines run it)", more)
				}
				return msg
			})
		}
	}
	check := func(field, p string) {
		p = path.Clean(p)
		for _, r := range readers {
			if !strings.HasPrefix(p+"/", r.dir) {
				continue
			}
			if _, lacks := img.LacksProgram(r.program); !lacks {
				return
			}
			add("reader "+r.dir, field, func(more int) string {
				msg := fmt.Sprintf("%s is read by %s (%s), which is not in the image: the config would do nothing", p, r.name, r.program)
				if r.insteadUnit != "" && img.HasUnit(r.insteadUnit) {
					msg += "; " + r.instead
				}
				if more > 0 {
					msg += fmt.Sprintf(" (%d more fields write there)", more)
				}
				return msg
			})
			return
		}
	}
	for i, f := range ign.Storage.Files {
		check(fmt.Sprintf("storage.files[%d].path", i), f.Path)
	}
	for i, d := range ign.Storage.Directories {
		check(fmt.Sprintf("storage.directories[%d].path", i), d.Path)
	}
	for i, l := range ign.Storage.Links {
		check(fmt.Sprintf("storage.links[%d].path", i), l.Path)
	}

	for i, u := range ign.Systemd.Units {
		field := fmt.Sprintf("systemd.units[%d]", i)
		if u.Contents != nil {
			unit(field+".contents", *u.Contents)
		}
		for j, d := range u.Dropins {
			if d.Contents != nil {
				unit(fmt.Sprintf("%s.dropins[%d].contents", field, j), *d.Contents)
			}
		}
	}
}
