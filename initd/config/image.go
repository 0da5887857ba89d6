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
	ign := c.Ignition
	var errs []error
	where := strings.Join(img.Writable, ", ")
	writable := func(field, p string) {
		if !img.IsWritable(p) {
			errs = append(errs, &FieldError{Path: field, Err: fmt.Errorf("%s is on the image's read-only root; a node writes only below %s", p, where)})
		}
	}
	users := slices.Clone(img.Users)
	groups := slices.Clone(img.Groups)
	for _, g := range ign.Passwd.Groups {
		groups = append(groups, g.Name)
	}
	for _, u := range ign.Passwd.Users {
		users = append(users, u.Name)
		if u.NoUserGroup == nil || !*u.NoUserGroup {
			groups = append(groups, u.Name) // useradd makes the user's own group
		}
	}
	// A finding that many fields share (a missing user or group, a missing program) is named
	// once, at its first field, with how many more name it.
	findings := map[string]*finding{}
	add := func(key, field string, msg func(more int) string) {
		if f := findings[key]; f != nil {
			f.more++
			return
		}
		f := &finding{msg: msg, err: &FieldError{Path: field}}
		findings[key] = f
		errs = append(errs, f.err)
	}
	note := func(kind, field, name string) {
		add(kind+" "+name, field, func(more int) string {
			msg := fmt.Sprintf("%s %q is neither in the image nor in passwd.%ss", kind, name, kind)
			if more > 0 {
				msg += fmt.Sprintf(" (%d more fields name it too)", more)
			}
			return msg
		})
	}
	group := func(field, name string) {
		if name != "" && !slices.Contains(groups, name) {
			note("group", field, name)
		}
	}
	owner := func(field string, n types.Node) {
		if name := deref(n.User.Name); name != "" && !slices.Contains(users, name) {
			note("user", field+".user.name", name)
		}
		group(field+".group.name", deref(n.Group.Name))
	}

	// Every file, directory and link is written below a writable location with owners that
	// exist; unit files the config writes itself count as shipped.
	type entry struct {
		field string
		node  types.Node
	}
	var entries []entry
	for i, f := range ign.Storage.Files {
		entries = append(entries, entry{fmt.Sprintf("storage.files[%d]", i), f.Node})
	}
	for i, d := range ign.Storage.Directories {
		entries = append(entries, entry{fmt.Sprintf("storage.directories[%d]", i), d.Node})
	}
	for i, l := range ign.Storage.Links {
		entries = append(entries, entry{fmt.Sprintf("storage.links[%d]", i), l.Node})
	}
	written := map[string]bool{}
	for _, e := range entries {
		writable(e.field+".path", e.node.Path)
		owner(e.field, e.node)
		if dir, name := path.Split(path.Clean(e.node.Path)); dir == "/etc/systemd/system/" {
			written[name] = true
		}
	}
	for i, u := range ign.Passwd.Users {
		field := fmt.Sprintf("passwd.users[%d]", i)
		if u.PrimaryGroup != nil {
			group(field+".primaryGroup", *u.PrimaryGroup)
		}
		for j, g := range u.Groups {
			group(fmt.Sprintf("%s.groups[%d]", field, j), string(g))
		}
		if u.NoCreateHome == nil || !*u.NoCreateHome {
			home := deref(u.HomeDir)
			if home == "" {
				home = "/home/" + u.Name
			}
			if !img.IsWritable(home) && !slices.Contains(img.Users, u.Name) {
				errs = append(errs, &FieldError{Path: field + ".homeDir", Err: fmt.Errorf("home directory %s is on the image's read-only root; a node writes only below %s", home, where)})
			}
		}
	}
	for i, u := range ign.Systemd.Units {
		field := fmt.Sprintf("systemd.units[%d]", i)
		if u.Contents != nil || written[u.Name] || img.HasUnit(u.Name) || (u.Mask != nil && *u.Mask) {
			continue
		}
		switch {
		case u.Enabled != nil && *u.Enabled:
			errs = append(errs, &FieldError{Path: field + ".enabled", Err: fmt.Errorf("%s is not a unit the image ships and the config gives it no contents", u.Name)})
		case len(u.Dropins) > 0:
			errs = append(errs, &FieldError{Path: field + ".dropins", Err: fmt.Errorf("drop-ins for %s, which is not a unit the image ships and the config gives no contents", u.Name)})
		}
	}
	c.checkPrograms(img, add)
	for _, f := range findings {
		f.err.Err = errors.New(f.msg(f.more))
	}
	return errors.Join(errs...)
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
