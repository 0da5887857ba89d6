package config

import (
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"

	"github.com/coreos/ignition/v2/config/v3_6/types"

	"github.com/kilnproject/kiln/internal/nodeimage"
)

// CheckImage refuses what the config asks of a node that the image, described by img, cannot
// give, so that a config that would fail at first boot fails before any node boots (kiln
// check-config, kiln run --config): files, directories and links on the read-only root (and
// home directories there), groups and owners that neither the image nor the config has, and
// units enabled or given drop-ins that neither the image ships nor the config writes, and
// what the config gives programs the image lacks (checkPrograms). Every
// finding is a FieldError naming the JSON path; all are returned together.
func (c *Config) CheckImage(img *nodeimage.Contents) error {
	k := newImageCheck(c, img)
	written := k.checkNodes(c.Ignition.Storage)
	k.checkUsers(c.Ignition.Passwd.Users)
	k.checkUnits(c.Ignition.Systemd.Units, written)
	c.checkPrograms(img, k.add)
	return k.err()
}

// imageCheck gathers what CheckImage finds, in the order it finds it.
type imageCheck struct {
	img    *nodeimage.Contents
	where  string   // the image's writable locations, for messages
	users  []string // the image's users and the config's
	groups []string // the image's groups, the config's and its users' own
	errs   []error
	// A finding that many fields share (a missing user or group, a missing program) is named
	// once, at its first field, with how many more name it.
	findings map[string]*finding
}

// newImageCheck starts checking c against img, knowing the users and groups either has.
func newImageCheck(c *Config, img *nodeimage.Contents) *imageCheck {
	ign := c.Ignition
	k := &imageCheck{
		img:      img,
		where:    strings.Join(img.Writable, ", "),
		users:    slices.Clone(img.Users),
		groups:   slices.Clone(img.Groups),
		findings: map[string]*finding{},
	}
	for _, g := range ign.Passwd.Groups {
		k.groups = append(k.groups, g.Name)
	}
	for _, u := range ign.Passwd.Users {
		k.users = append(k.users, u.Name)
		if u.NoUserGroup == nil || !*u.NoUserGroup {
			k.groups = append(k.groups, u.Name) // useradd makes the user's own group
		}
	}
	return k
}

// writable refuses the path p at field when it is on the image's read-only root.
func (k *imageCheck) writable(field, p string) {
	if !k.img.IsWritable(p) {
		k.errs = append(k.errs, &FieldError{Path: field, Err: fmt.Errorf("%s is on the image's read-only root; a node writes only below %s", p, k.where)})
	}
}

// add records the finding key at field, or counts field as one more naming it.
func (k *imageCheck) add(key, field string, msg func(more int) string) {
	if f := k.findings[key]; f != nil {
		f.more++
		return
	}
	f := &finding{msg: msg, err: &FieldError{Path: field}}
	k.findings[key] = f
	k.errs = append(k.errs, f.err)
}

// note records that field names a user or group (kind) that neither the image nor the
// config has.
func (k *imageCheck) note(kind, field, name string) {
	k.add(kind+" "+name, field, func(more int) string {
		msg := fmt.Sprintf("%s %q is neither in the image nor in passwd.%ss", kind, name, kind)
		if more > 0 {
			msg += fmt.Sprintf(" (%d more fields name it too)", more)
		}
		return msg
	})
}

// group refuses the group name at field unless the image or the config has it.
func (k *imageCheck) group(field, name string) {
	if name != "" && !slices.Contains(k.groups, name) {
		k.note("group", field, name)
	}
}

// owner refuses the user and group of the node at field unless the image or the config has
// them.
func (k *imageCheck) owner(field string, n types.Node) {
	if name := deref(n.User.Name); name != "" && !slices.Contains(k.users, name) {
		k.note("user", field+".user.name", name)
	}
	k.group(field+".group.name", deref(n.Group.Name))
}

// checkNodes checks that every file, directory and link is written below a writable location
// with owners that exist. It returns the unit files the config writes itself, which count as
// shipped.
func (k *imageCheck) checkNodes(st types.Storage) (written map[string]bool) {
	type entry struct {
		field string
		node  types.Node
	}
	var entries []entry
	for i, f := range st.Files {
		entries = append(entries, entry{fmt.Sprintf("storage.files[%d]", i), f.Node})
	}
	for i, d := range st.Directories {
		entries = append(entries, entry{fmt.Sprintf("storage.directories[%d]", i), d.Node})
	}
	for i, l := range st.Links {
		entries = append(entries, entry{fmt.Sprintf("storage.links[%d]", i), l.Node})
	}
	written = map[string]bool{}
	for _, e := range entries {
		k.writable(e.field+".path", e.node.Path)
		k.owner(e.field, e.node)
		if dir, name := path.Split(path.Clean(e.node.Path)); dir == "/etc/systemd/system/" {
			written[name] = true
		}
	}
	return written
}

// checkUsers checks the users' groups and that the home directories they get are writable.
func (k *imageCheck) checkUsers(users []types.PasswdUser) {
	for i, u := range users {
		field := fmt.Sprintf("passwd.users[%d]", i)
		if u.PrimaryGroup != nil {
			k.group(field+".primaryGroup", *u.PrimaryGroup)
		}
		for j, g := range u.Groups {
			k.group(fmt.Sprintf("%s.groups[%d]", field, j), string(g))
		}
		if u.NoCreateHome == nil || !*u.NoCreateHome {
			home := deref(u.HomeDir)
			if home == "" {
				home = "/home/" + u.Name
			}
			if !k.img.IsWritable(home) && !slices.Contains(k.img.Users, u.Name) {
				k.errs = append(k.errs, &FieldError{Path: field + ".homeDir", Err: fmt.Errorf("home directory %s is on the image's read-only root; a node writes only below %s", home, k.where)})
			}
		}
	}
}

// checkUnits refuses units enabled or given drop-ins that neither the image ships nor the
// config writes (written: the unit files among its storage entries).
func (k *imageCheck) checkUnits(units []types.Unit, written map[string]bool) {
	for i, u := range units {
		field := fmt.Sprintf("systemd.units[%d]", i)
		if u.Contents != nil || written[u.Name] || k.img.HasUnit(u.Name) || (u.Mask != nil && *u.Mask) {
			continue
		}
		switch {
		case u.Enabled != nil && *u.Enabled:
			k.errs = append(k.errs, &FieldError{Path: field + ".enabled", Err: fmt.Errorf("%s is not a unit the image ships and the config gives it no contents", u.Name)})
		case len(u.Dropins) > 0:
			k.errs = append(k.errs, &FieldError{Path: field + ".dropins", Err: fmt.Errorf("drop-ins for %s, which is not a unit the image ships and the config gives no contents", u.Name)})
		}
	}
}

// err is every finding, in order, each shared one with how many more fields name it.
func (k *imageCheck) err() error {
	for _, f := range k.findings {
		f.err.Err = errors.New(f.msg(f.more))
	}
	return errors.Join(k.errs...)
}

// finding is one reason a config does not fit the image, named at the first field it concerns.
type finding struct {
	msg  func(more int) string
	more int // later fields it concerns too
	err  *FieldError
}

// SSHUnit is the ssh server's unit in the default base (Debian's openssh-server), shipped
// disabled.
const SSHUnit = "ssh.service"

// EnableSSHForKeys enables SSHUnit when a user of the config has ssh keys, the config says
// nothing about the unit itself and the image ships it: a config that authorizes keys asks for
// ssh access, as on Fedora CoreOS, where sshd always runs. A config that does not want the
// server while giving keys says `enabled: false` for it. It reports whether it enabled it.
func (c *Config) EnableSSHForKeys(shipped bool) bool {
	if !shipped {
		return false
	}
	named := slices.ContainsFunc(c.Ignition.Systemd.Units, func(u types.Unit) bool { return u.Name == SSHUnit })
	if len(c.SSHUsers()) == 0 || named {
		return false
	}
	on := true
	c.Ignition.Systemd.Units = append(c.Ignition.Systemd.Units, types.Unit{Name: SSHUnit, Enabled: &on})
	return true
}

// SSHUsers names the config's users that have ssh keys, in order.
func (c *Config) SSHUsers() []string {
	var users []string
	for _, u := range c.Ignition.Passwd.Users {
		if len(u.SSHAuthorizedKeys) > 0 {
			users = append(users, u.Name)
		}
	}
	return users
}
