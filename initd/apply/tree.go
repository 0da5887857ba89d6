// Package apply applies the parts of an Ignition config kiln supports to a node's root
// directory: files, directories, links, systemd units, users and groups.
//
// Every applier takes root (the node's "/", a temporary directory in tests), checks
// before it acts and returns the paths (as seen on the node) it changed; a second run
// with the same input changes nothing: no file is rewritten, so hashes and mtimes stay.
// Paths are resolved with root as "/": absolute symlinks in the tree point back inside
// it and ".." stops at it, so nothing is ever written outside root. Missing parent
// directories are created root-owned with mode 0755.
//
// A file is written with atomicfile: under a temporary name readable by its owner only,
// given its final mode and owner, fsync'd and renamed into place (then the directory is
// fsync'd), so a secret is never readable by others, not even for a moment, and a power
// cut leaves the old or the new file.
// Ownership is applied only when running as root (tests as another user skip it).
//
// Apply in this order, each step needing the one before: Users (creates the accounts
// that own files) → Directories → Files → Links → Units.
package apply

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"strconv"
	"strings"
	"syscall"

	"github.com/kilnproject/kiln/initd/config"
	"github.com/kilnproject/kiln/initd/rootpath"
	"github.com/kilnproject/kiln/internal/atomicfile"
)

// tree operates below a root directory. Paths given to it are node paths ("/etc/x");
// it works with root-relative paths internally. os.Root refuses anything that escapes.
type tree struct {
	root *os.Root
	// asRoot: running as root, so ownership is applied.
	asRoot bool
	// accounts is the root's /etc/passwd and /etc/group, loaded on first use.
	accounts *accounts
}

func openTree(dir string) (*tree, error) {
	r, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("open root %s: %w", dir, err)
	}
	return &tree{root: r, asRoot: os.Geteuid() == 0}, nil
}

func (t *tree) Close() error { return t.root.Close() }

// rel turns a node path into a path relative to the root.
func rel(p string) string {
	return strings.TrimPrefix(path.Clean("/"+p), "/")
}

// split returns the resolved directory (created where missing) and the base name of
// the node path p.
func (t *tree) split(p string) (dir, base string, err error) {
	r := rel(p)
	if r == "" {
		return "", "", errors.New("path is the root directory")
	}
	dir, err = t.resolve(path.Dir(r), true)
	if err != nil {
		return "", "", err
	}
	return dir, path.Base(r), nil
}

// resolve follows p (relative to the root) with the root as "/", creating missing
// directories (0755, root-owned) when create is set. The result contains no symlinks.
func (t *tree) resolve(p string, create bool) (string, error) {
	var mkdir func(string) error
	if create {
		mkdir = func(rel string) error { return t.mkdir(rel, 0o755, -1, -1) }
	}
	return rootpath.Resolve(t.root, p, mkdir)
}

// mkdir creates the directory p (relative to the root) with exactly mode (the umask
// does not apply) and, as root, owner uid:gid (-1: root).
func (t *tree) mkdir(p string, mode fs.FileMode, uid, gid int) error {
	if err := t.root.Mkdir(p, mode.Perm()); err != nil {
		return fmt.Errorf("create directory /%s: %w", p, err)
	}
	if t.asRoot {
		if err := t.root.Lchown(p, max(uid, 0), max(gid, 0)); err != nil {
			return fmt.Errorf("chown directory /%s: %w", p, err)
		}
	}
	if err := t.root.Chmod(p, mode); err != nil {
		return fmt.Errorf("chmod directory /%s: %w", p, err)
	}
	return nil
}

// writeFile atomically replaces dir/base (dir resolved, relative to the root) with
// data, owned by uid:gid (-1: root; as root only) with mode before it gets its name.
func (t *tree) writeFile(dir, base string, data []byte, mode fs.FileMode, uid, gid int) error {
	return atomicfile.WriteIn(t.root, path.Join(dir, base), data,
		atomicfile.Options{Mode: mode, Chown: t.asRoot, UID: max(uid, 0), GID: max(gid, 0)})
}

func (t *tree) syncDir(dir string) error {
	d, err := t.root.Open(dir)
	if err != nil {
		return fmt.Errorf("open directory /%s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync directory /%s: %w", dir, err)
	}
	return nil
}

// setMeta gives the existing node p (relative to the root, lstat'ed as fi) mode
// (unless keepMode) and owner (uid and gid; -1 keeps), touching only what differs. It
// reports whether it changed anything. A symlink is chowned itself and has no mode.
func (t *tree) setMeta(p string, fi fs.FileInfo, mode fs.FileMode, keepMode bool, uid, gid int) (bool, error) {
	if keepMode {
		mode = modeOf(fi)
	}
	changed := false
	if t.asRoot && (uid >= 0 || gid >= 0) {
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return false, fmt.Errorf("stat /%s: no owner information", p)
		}
		if uid < 0 {
			uid = int(st.Uid)
		}
		if gid < 0 {
			gid = int(st.Gid)
		}
		if uid != int(st.Uid) || gid != int(st.Gid) {
			if err := t.root.Lchown(p, uid, gid); err != nil {
				return false, fmt.Errorf("chown /%s: %w", p, err)
			}
			changed = true
		}
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		return changed, nil
	}
	// Re-read: chown clears setuid and setgid.
	cur, err := t.root.Lstat(p)
	if err != nil {
		return changed, fmt.Errorf("stat /%s: %w", p, err)
	}
	if modeOf(cur) != mode {
		if err := t.root.Chmod(p, mode); err != nil {
			return changed, fmt.Errorf("chmod /%s: %w", p, err)
		}
		changed = true
	}
	return changed, nil
}

// modeOf is a node's permission bits including setuid, setgid and sticky.
func modeOf(fi fs.FileInfo) fs.FileMode {
	return fi.Mode() & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)
}

// accounts are the users and groups of the root's /etc/passwd and /etc/group.
type accounts struct {
	users  map[string]passwdEntry
	groups map[string]groupEntry
}

type passwdEntry struct {
	Name       string
	UID, GID   int
	Gecos      string
	Home       string
	Shell      string
	passwdLine int
}

type groupEntry struct {
	Name    string
	GID     int
	Members []string
}

// loadAccounts reads /etc/passwd and /etc/group below the root. Missing files are
// empty databases.
func (t *tree) loadAccounts() (*accounts, error) {
	a := &accounts{users: map[string]passwdEntry{}, groups: map[string]groupEntry{}}
	err := t.readColon("etc/passwd", 7, func(f []string) error {
		uid, err1 := strconv.Atoi(f[2])
		gid, err2 := strconv.Atoi(f[3])
		if err := errors.Join(err1, err2); err != nil {
			return err
		}
		a.users[f[0]] = passwdEntry{Name: f[0], UID: uid, GID: gid, Gecos: f[4], Home: f[5], Shell: f[6]}
		return nil
	})
	if err != nil {
		return nil, err
	}
	err = t.readColon("etc/group", 4, func(f []string) error {
		gid, err := strconv.Atoi(f[2])
		if err != nil {
			return err
		}
		var members []string
		if f[3] != "" {
			members = strings.Split(f[3], ",")
		}
		a.groups[f[0]] = groupEntry{Name: f[0], GID: gid, Members: members}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return a, nil
}

// readColon calls fn with the fields of each line of a colon-separated database (such
// as /etc/passwd) that has at least n fields. Comments and blank lines are skipped.
func (t *tree) readColon(p string, n int, fn func([]string) error) error {
	f, err := t.root.Open(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read /%s: %w", p, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for line := 1; sc.Scan(); line++ {
		text := sc.Text()
		if text == "" || strings.HasPrefix(text, "#") || strings.HasPrefix(text, "+") || strings.HasPrefix(text, "-") {
			continue
		}
		fields := strings.Split(text, ":")
		if len(fields) < n {
			return fmt.Errorf("/%s:%d: want %d colon-separated fields, got %d", p, line, n, len(fields))
		}
		if err := fn(fields); err != nil {
			return fmt.Errorf("/%s:%d: %w", p, line, err)
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("read /%s: %w", p, err)
	}
	return nil
}

// owner resolves a config owner to uid and gid against the root's databases. An unset
// owner is -1 (keep, or root for new nodes).
func (t *tree) owner(field string, user, group config.Owner) (uid, gid int, err error) {
	uid, gid = -1, -1
	if user.ID != nil {
		uid = *user.ID
	}
	if group.ID != nil {
		gid = *group.ID
	}
	if user.Name == "" && group.Name == "" {
		return uid, gid, nil
	}
	if t.accounts == nil {
		if t.accounts, err = t.loadAccounts(); err != nil {
			return 0, 0, err
		}
	}
	if user.Name != "" {
		u, ok := t.accounts.users[user.Name]
		if !ok {
			return 0, 0, &config.FieldError{Path: field + ".user.name", Err: fmt.Errorf("no user %q in /etc/passwd", user.Name)}
		}
		uid = u.UID
	}
	if group.Name != "" {
		g, ok := t.accounts.groups[group.Name]
		if !ok {
			return 0, 0, &config.FieldError{Path: field + ".group.name", Err: fmt.Errorf("no group %q in /etc/group", group.Name)}
		}
		gid = g.GID
	}
	return uid, gid, nil
}
