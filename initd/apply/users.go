package apply

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/coreos/ignition/v2/config/v3_6/types"

	"github.com/kilnproject/kiln/initd/rootpath"
)

// Users creates passwd.groups and passwd.users below root and installs the users' SSH
// keys. Call Validate on the config first: Users trusts names, hashes and keys.
//
// Accounts are managed with the shadow tools of the node's own base, run with
// --root ROOT (groupadd, useradd, usermod; Debian's passwd package, present in the image
// and on the build host): they take the databases' lock (/etc/.pwd.lock), keep passwd,
// shadow, group and gshadow consistent and use the root's /etc/login.defs and /etc/skel.
// This needs root privileges (the tools chroot into ROOT). Users checks the databases
// first and runs a tool only for what differs, so a second run runs none.
//
//   - A missing group is created (groupadd, with gid and --system if given). An existing
//     group with another gid is an error: kiln does not renumber groups.
//   - A missing user is created (useradd) with what the entry gives: uid, gecos, homeDir,
//     shell, primaryGroup (else a user group of its own unless noUserGroup), groups,
//     passwordHash (else "*": no password login, key login works), system, and a home
//     directory unless noCreateHome.
//   - An existing user gets the fields the entry gives that differ (usermod; homeDir
//     changes the entry, not the files); groups are added, never removed.
//   - sshAuthorizedKeys are written to ~/.ssh/authorized_keys (the file Debian's sshd
//     reads; Ignition on Fedora CoreOS uses authorized_keys.d/ignition), mode 0600 in a
//     0700 ~/.ssh, both owned by the user and its primary group. kiln owns that file: it
//     holds exactly the keys of the config, under a header saying so. A user without
//     keys in the config keeps its file untouched.
//
// It returns the node paths it changed (/etc/passwd, /etc/group… when a tool ran, and
// each authorized_keys written).
func Users(ctx context.Context, root string, users []types.PasswdUser, groups []types.PasswdGroup) ([]string, error) {
	if len(users) == 0 && len(groups) == 0 {
		return nil, nil
	}
	root, err := filepath.Abs(root)
	if err != nil {
		return nil, err
	}
	t, err := openTree(root)
	if err != nil {
		return nil, err
	}
	defer t.Close()
	db := &accountDB{t: t, root: root}
	for i, g := range groups {
		field := fmt.Sprintf("passwd.groups[%d]", i)
		if err := db.group(ctx, field, g); err != nil {
			return db.changedPaths(), fmt.Errorf("%s (%s): %w", field, g.Name, err)
		}
	}
	for i, u := range users {
		field := fmt.Sprintf("passwd.users[%d]", i)
		if err := db.user(ctx, field, u); err != nil {
			return db.changedPaths(), fmt.Errorf("%s (%s): %w", field, u.Name, err)
		}
	}
	for i, u := range users {
		field := fmt.Sprintf("passwd.users[%d]", i)
		if err := db.sshKeys(field, u); err != nil {
			return db.changedPaths(), fmt.Errorf("%s (%s): %w", field, u.Name, err)
		}
	}
	return db.changedPaths(), nil
}

// accountDB runs the shadow tools on a root and tracks what they changed.
type accountDB struct {
	t       *tree
	root    string
	ranTool bool     // a tool changed the databases
	homes   []string // home directories useradd created
	keys    []string // authorized_keys files written
}

func (db *accountDB) changedPaths() []string {
	var out []string
	if db.ranTool {
		for _, p := range []string{"/etc/passwd", "/etc/shadow", "/etc/group", "/etc/gshadow"} {
			if _, err := db.t.root.Lstat(rel(p)); err == nil {
				out = append(out, p)
			}
		}
	}
	out = append(out, db.homes...)
	return append(out, db.keys...)
}

// load re-reads the databases (after a tool ran, or the first time).
func (db *accountDB) load() (*accounts, error) {
	if db.t.accounts == nil {
		a, err := db.t.loadAccounts()
		if err != nil {
			return nil, err
		}
		db.t.accounts = a
	}
	return db.t.accounts, nil
}

// run runs tool (useradd, usermod, groupadd) chrooted into the node's root. Callers put
// "--" before the account name, so that no name from the config is read as an option.
func (db *accountDB) run(ctx context.Context, tool string, args ...string) error {
	if !db.t.asRoot {
		return fmt.Errorf("%s needs root privileges (it chroots into %s)", tool, db.root)
	}
	bin, err := exec.LookPath(tool)
	if err != nil {
		for _, dir := range []string{"/usr/sbin", "/sbin"} {
			if _, err2 := os.Stat(path.Join(dir, tool)); err2 == nil {
				bin, err = path.Join(dir, tool), nil
				break
			}
		}
		if err != nil {
			return fmt.Errorf("%s not found: %w", tool, err)
		}
	}
	cmd := exec.CommandContext(ctx, bin, append([]string{"--root", db.root}, args...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	// Whatever happened, the databases may have changed: read them again next time.
	db.t.accounts = nil
	db.ranTool = true
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", tool, strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return nil
}

func (db *accountDB) group(ctx context.Context, field string, g types.PasswdGroup) error {
	a, err := db.load()
	if err != nil {
		return err
	}
	if cur, ok := a.groups[g.Name]; ok {
		if g.Gid != nil && *g.Gid != cur.GID {
			return fmt.Errorf("%s.gid: group exists with gid %d, the config says %d; kiln does not renumber groups", field, cur.GID, *g.Gid)
		}
		return nil
	}
	var args []string
	if g.Gid != nil {
		args = append(args, "--gid", strconv.Itoa(*g.Gid))
	}
	if g.System != nil && *g.System {
		args = append(args, "--system")
	}
	return db.run(ctx, "groupadd", append(args, "--", g.Name)...)
}

func (db *accountDB) user(ctx context.Context, field string, u types.PasswdUser) error {
	a, err := db.load()
	if err != nil {
		return err
	}
	for j, g := range u.Groups {
		if _, ok := a.groups[string(g)]; !ok {
			return fmt.Errorf("%s.groups[%d]: no group %q in /etc/group (add it to passwd.groups)", field, j, g)
		}
	}
	if u.PrimaryGroup != nil {
		if _, ok := a.groups[*u.PrimaryGroup]; !ok {
			return fmt.Errorf("%s.primaryGroup: no group %q in /etc/group (add it to passwd.groups)", field, *u.PrimaryGroup)
		}
	}
	cur, exists := a.users[u.Name]
	if !exists {
		return db.addUser(ctx, u)
	}
	var args []string
	if u.UID != nil && *u.UID != cur.UID {
		args = append(args, "--uid", strconv.Itoa(*u.UID))
	}
	if u.Gecos != nil && *u.Gecos != cur.Gecos {
		args = append(args, "--comment", *u.Gecos)
	}
	if u.HomeDir != nil && path.Clean(*u.HomeDir) != cur.Home {
		args = append(args, "--home", path.Clean(*u.HomeDir))
	}
	if u.Shell != nil && *u.Shell != cur.Shell {
		args = append(args, "--shell", *u.Shell)
	}
	if u.PrimaryGroup != nil && a.groups[*u.PrimaryGroup].GID != cur.GID {
		args = append(args, "--gid", *u.PrimaryGroup)
	}
	if u.PasswordHash != nil {
		hash, err := db.shadowHash(u.Name)
		if err != nil {
			return err
		}
		if hash != *u.PasswordHash {
			args = append(args, "--password", *u.PasswordHash)
		}
	}
	var missing []string
	for _, g := range u.Groups {
		if !slices.Contains(a.groups[string(g)].Members, u.Name) && a.groups[string(g)].GID != cur.GID {
			missing = append(missing, string(g))
		}
	}
	if len(missing) > 0 {
		args = append(args, "--append", "--groups", strings.Join(missing, ","))
	}
	if len(args) == 0 {
		return nil
	}
	return db.run(ctx, "usermod", append(args, "--", u.Name)...)
}

func (db *accountDB) addUser(ctx context.Context, u types.PasswdUser) error {
	var args []string
	if u.UID != nil {
		args = append(args, "--uid", strconv.Itoa(*u.UID))
	}
	if u.Gecos != nil {
		args = append(args, "--comment", *u.Gecos)
	}
	if u.HomeDir != nil {
		args = append(args, "--home-dir", path.Clean(*u.HomeDir))
	}
	if u.Shell != nil {
		args = append(args, "--shell", *u.Shell)
	}
	switch {
	case u.PrimaryGroup != nil:
		args = append(args, "--gid", *u.PrimaryGroup)
	case u.NoUserGroup != nil && *u.NoUserGroup:
		args = append(args, "--no-user-group")
	default:
		args = append(args, "--user-group")
	}
	if len(u.Groups) > 0 {
		gs := make([]string, len(u.Groups))
		for i, g := range u.Groups {
			gs[i] = string(g)
		}
		args = append(args, "--groups", strings.Join(gs, ","))
	}
	hash := "*"
	if u.PasswordHash != nil {
		hash = *u.PasswordHash
	}
	args = append(args, "--password", hash)
	if u.System != nil && *u.System {
		args = append(args, "--system")
	}
	createHome := u.NoCreateHome == nil || !*u.NoCreateHome
	if createHome {
		args = append(args, "--create-home")
	} else {
		args = append(args, "--no-create-home")
	}
	if err := db.run(ctx, "useradd", append(args, "--", u.Name)...); err != nil {
		return err
	}
	if createHome {
		if a, err := db.load(); err == nil {
			db.homes = append(db.homes, a.users[u.Name].Home)
		}
	}
	return nil
}

// shadowHash returns the password field of name in the root's /etc/shadow.
func (db *accountDB) shadowHash(name string) (string, error) {
	hash := ""
	err := db.t.readColon("etc/shadow", 2, func(f []string) error {
		if f[0] == name {
			hash = f[1]
		}
		return nil
	})
	return hash, err
}

// authorizedKeysHeader starts every authorized_keys file kiln writes.
const authorizedKeysHeader = "# Written by kiln-init from the node config (passwd.users[].sshAuthorizedKeys).\n# Changes here are replaced at the next first-boot run.\n"

func (db *accountDB) sshKeys(field string, u types.PasswdUser) error {
	if len(u.SSHAuthorizedKeys) == 0 {
		return nil
	}
	a, err := db.load()
	if err != nil {
		return err
	}
	acct, ok := a.users[u.Name]
	if !ok {
		return fmt.Errorf("%s: user is not in /etc/passwd", field)
	}
	if !path.IsAbs(acct.Home) || path.Clean(acct.Home) == "/" {
		return fmt.Errorf("%s: home directory %q cannot hold ~/.ssh", field, acct.Home)
	}
	var b strings.Builder
	b.WriteString(authorizedKeysHeader)
	for _, k := range u.SSHAuthorizedKeys {
		b.WriteString(strings.TrimSpace(string(k)) + "\n")
	}
	home, err := db.t.resolve(rel(acct.Home), true)
	if err != nil {
		return fmt.Errorf("%s: home %s: %w", field, acct.Home, err)
	}
	sshDir := path.Join(home, ".ssh")
	fi, err := db.t.root.Lstat(sshDir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if err := db.t.mkdir(sshDir, 0o700, acct.UID, acct.GID); err != nil {
			return err
		}
	case err != nil:
		return err
	case !fi.IsDir():
		return fmt.Errorf("%s: %s/.ssh exists and is %s, not a directory", field, acct.Home, rootpath.TypeName(fi.Mode()))
	default:
		if _, err := db.t.setMeta(sshDir, fi, 0o700, false, acct.UID, acct.GID); err != nil {
			return err
		}
	}
	keysPath := path.Join(sshDir, "authorized_keys")
	data := []byte(b.String())
	nodePath := path.Join(acct.Home, ".ssh", "authorized_keys")
	if fi, err := db.t.root.Lstat(keysPath); err == nil && fi.Mode().IsRegular() && db.t.sameContents(keysPath, fi, data) {
		c, err := db.t.setMeta(keysPath, fi, 0o600, false, acct.UID, acct.GID)
		if c {
			db.keys = append(db.keys, nodePath)
		}
		return err
	}
	if err := db.t.writeFile(sshDir, "authorized_keys", data, 0o600, acct.UID, acct.GID); err != nil {
		return err
	}
	db.keys = append(db.keys, nodePath)
	return nil
}
