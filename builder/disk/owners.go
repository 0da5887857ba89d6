package disk

import (
	"bufio"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// pseudoEntry is one "path m mode uid gid" definition of a mksquashfs pseudo file.
type pseudoEntry struct {
	path     string // relative to the tree, slash separated
	mode     uint32 // permission and setuid/setgid/sticky bits
	uid, gid int
	line     int
}

// readPseudoFile parses the "m" (modify) definitions of a mksquashfs pseudo file, the only kind
// mkfs.erofs is given through MakeRootFS. Names follow mksquashfs: double quotes group, a
// backslash takes the next character literally.
func readPseudoFile(name string) ([]pseudoEntry, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, fmt.Errorf("pseudo file: %w", err)
	}
	defer f.Close()
	var out []pseudoEntry
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		e, err := parsePseudoLine(line)
		if err != nil {
			return nil, fmt.Errorf("pseudo file %s:%d: %w", name, n, err)
		}
		e.line = n
		out = append(out, e)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("pseudo file %s: %w", name, err)
	}
	return out, nil
}

func parsePseudoLine(line string) (pseudoEntry, error) {
	var name strings.Builder
	quoted, i := false, 0
	for ; i < len(line); i++ {
		c := line[i]
		switch {
		case c == '\\' && i+1 < len(line):
			i++
			name.WriteByte(line[i])
		case c == '"':
			quoted = !quoted
		case !quoted && (c == ' ' || c == '\t'):
			goto rest
		default:
			name.WriteByte(c)
		}
	}
rest:
	if quoted {
		return pseudoEntry{}, errors.New("unterminated quote in the name")
	}
	fields := strings.Fields(line[i:])
	if len(fields) == 0 {
		return pseudoEntry{}, fmt.Errorf("%q has no definition", name.String())
	}
	if fields[0] != "m" {
		return pseudoEntry{}, fmt.Errorf("definition type %q for %q: mkfs.erofs is only given \"m\" (mode uid gid) definitions", fields[0], name.String())
	}
	if len(fields) != 4 {
		return pseudoEntry{}, fmt.Errorf("%q: want \"m mode uid gid\", got %q", name.String(), strings.Join(fields, " "))
	}
	mode, err := strconv.ParseUint(fields[1], 8, 32)
	if err != nil || mode > 0o7777 {
		return pseudoEntry{}, fmt.Errorf("%q: mode %q is not octal 0..7777", name.String(), fields[1])
	}
	uid, err := strconv.ParseUint(fields[2], 10, 32)
	if err != nil {
		return pseudoEntry{}, fmt.Errorf("%q: uid %q is not a number", name.String(), fields[2])
	}
	gid, err := strconv.ParseUint(fields[3], 10, 32)
	if err != nil {
		return pseudoEntry{}, fmt.Errorf("%q: gid %q is not a number", name.String(), fields[3])
	}
	p := strings.Trim(filepathClean(name.String()), "/")
	if p == "" || p == ".." || strings.HasPrefix(p, "../") {
		return pseudoEntry{}, fmt.Errorf("%q is not a path inside the tree", name.String())
	}
	return pseudoEntry{path: p, mode: uint32(mode), uid: int(uid), gid: int(gid)}, nil
}

func filepathClean(p string) string { return filepath.ToSlash(filepath.Clean("/" + p)) }

// ownerMethod is how mkfs.erofs is made to see the pseudo file's owners and modes.
type ownerMethod int

const (
	ownersAuto     ownerMethod = iota // ownersOnTree as root, ownersFakeroot otherwise
	ownersOnTree                      // chown and chmod the tree itself (needs root)
	ownersFakeroot                    // record them in a fakeroot session that runs mkfs.erofs
)

// erofsOwners makes the pseudo file's entries the owners and modes mkfs.erofs (cmd) sees, and
// returns the command to run: as root (or with ownersOnTree) it sets them on the tree and
// returns cmd; otherwise it returns cmd wrapped in a fakeroot session that records them first,
// its script kept in dir.
func erofsOwners(ctx context.Context, cmd *exec.Cmd, tree string, entries []pseudoEntry, o RootFSOptions, dir string, log *slog.Logger) (*exec.Cmd, error) {
	method := o.owners
	if method == ownersAuto {
		method = ownersFakeroot
		if os.Geteuid() == 0 {
			method = ownersOnTree
		}
	}
	if method == ownersOnTree {
		log.Info("setting the erofs owners and modes on the tree", "entries", len(entries))
		return cmd, setOwners(tree, entries, o.PseudoFile)
	}
	fr, err := lookTool("fakeroot")
	if err != nil {
		return nil, fmt.Errorf("without root, the pseudo file's owners reach mkfs.erofs through fakeroot (or bake as root): %w", err)
	}
	script, xattrs, err := fakerootScript(tree, entries, o.PseudoFile, dir)
	if err != nil {
		return nil, err
	}
	if xattrs {
		if _, err := lookTool("setfattr"); err != nil {
			return nil, fmt.Errorf("the tree has extended attributes, which fakeroot hides from mkfs.erofs unless they are set again in its session (or bake as root): %w", err)
		}
	}
	log.Info("giving erofs its owners and modes through fakeroot", "entries", len(entries), "xattrs", xattrs)
	// -u: entries the pseudo file does not name keep their real owner, as with mksquashfs.
	// FAKEROOTDONTTRYCHOWN: the tree's real owners are left alone.
	wrapped := exec.CommandContext(ctx, fr, append([]string{"-u", "--", "sh", script}, cmd.Args...)...)
	wrapped.Env = append(withoutEnv(os.Environ(), "SOURCE_DATE_EPOCH"), "FAKEROOTDONTTRYCHOWN=1")
	return wrapped, nil
}

// setOwners gives every entry of the tree the owner and mode its last definition names (the
// last wins for hard links, as with mksquashfs) and makes the root directory root's. It needs
// root. A chown drops setuid/setgid bits and file capabilities: the mode is set afterwards and
// a security.capability attribute is put back.
func setOwners(tree string, entries []pseudoEntry, pf string) error {
	if err := os.Lchown(tree, 0, 0); err != nil {
		return fmt.Errorf("root tree: %w", err)
	}
	for _, e := range entries {
		p := filepath.Join(tree, filepath.FromSlash(e.path))
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return fmt.Errorf("pseudo file %s:%d: /%s: %w", pf, e.line, e.path, err)
		}
		symlink := st.Mode&unix.S_IFMT == unix.S_IFLNK
		if int(st.Uid) != e.uid || int(st.Gid) != e.gid {
			var caps []byte
			if !symlink {
				caps = lgetxattr(p, "security.capability")
			}
			if err := os.Lchown(p, e.uid, e.gid); err != nil {
				return fmt.Errorf("set the owner of /%s: %w", e.path, err)
			}
			if caps != nil {
				if err := unix.Lsetxattr(p, "security.capability", caps, 0); err != nil {
					return fmt.Errorf("restore the file capabilities of /%s: %w", e.path, err)
				}
			}
		}
		if !symlink {
			if err := unix.Chmod(p, e.mode); err != nil {
				return fmt.Errorf("set the mode of /%s: %w", e.path, err)
			}
		}
	}
	return nil
}

// lgetxattr returns the value of attribute name of p, nil when it has none.
func lgetxattr(p, name string) []byte {
	sz, err := unix.Lgetxattr(p, name, nil)
	if err != nil || sz <= 0 {
		return nil
	}
	buf := make([]byte, sz)
	n, err := unix.Lgetxattr(p, name, buf)
	if err != nil {
		return nil
	}
	return buf[:n]
}

// fakerootScript writes, into dir, a shell script to run under `fakeroot -u` that records the
// entries' owners and modes and the tree's extended attributes in the fakeroot session (which
// hides the real attributes from the programs it runs), then executes its arguments. It returns
// the script's path and whether it needs setfattr. Entries are grouped per owner and per mode,
// each group one NUL-separated list for xargs; for an inode named more than once (hard links)
// only its last definition counts.
func fakerootScript(tree string, entries []pseudoEntry, pf, dir string) (string, bool, error) {
	tree, err := filepath.Abs(tree) // no path in the lists may look like an option
	if err != nil {
		return "", false, err
	}
	type inode struct{ dev, ino uint64 }
	last := map[inode]int{}
	stats := make([]unix.Stat_t, len(entries))
	for i, e := range entries {
		if err := unix.Lstat(filepath.Join(tree, filepath.FromSlash(e.path)), &stats[i]); err != nil {
			return "", false, fmt.Errorf("pseudo file %s:%d: /%s: %w", pf, e.line, e.path, err)
		}
		last[inode{stats[i].Dev, stats[i].Ino}] = i
	}
	owners := map[string][]string{"0:0": {tree}}
	modes := map[string][]string{}
	for i, e := range entries {
		st := &stats[i]
		if last[inode{st.Dev, st.Ino}] != i {
			continue
		}
		p := filepath.Join(tree, filepath.FromSlash(e.path))
		key := fmt.Sprintf("%d:%d", e.uid, e.gid)
		owners[key] = append(owners[key], p)
		// chown may drop setuid/setgid, so a mode with them is always set again. The leading
		// zero makes chmod clear a directory's setgid bit too.
		if st.Mode&unix.S_IFMT != unix.S_IFLNK && (st.Mode&0o7777 != e.mode || e.mode&0o7000 != 0) {
			m := fmt.Sprintf("0%04o", e.mode)
			modes[m] = append(modes[m], p)
		}
	}
	var script strings.Builder
	script.WriteString("set -e\n")
	n := 0
	group := func(cmd string, m map[string][]string) error {
		for _, k := range slices.Sorted(maps.Keys(m)) {
			list := filepath.Join(dir, "list"+strconv.Itoa(n))
			n++
			if err := os.WriteFile(list, []byte(strings.Join(m[k], "\x00")+"\x00"), 0o600); err != nil {
				return err
			}
			fmt.Fprintf(&script, "xargs -0 -r %s %s < %s\n", cmd, k, shellQuote(list))
		}
		return nil
	}
	if err := group("chown -h", owners); err != nil {
		return "", false, err
	}
	if err := group("chmod", modes); err != nil {
		return "", false, err
	}
	attrs, err := treeXattrs(tree)
	if err != nil {
		return "", false, err
	}
	for _, a := range attrs {
		value := ""
		if len(a.value) > 0 {
			value = " -v 0x" + hex.EncodeToString(a.value)
		}
		fmt.Fprintf(&script, "setfattr -h -n %s%s -- %s\n", shellQuote(a.name), value, shellQuote(a.path))
	}
	script.WriteString("exec \"$@\"\n")
	name := filepath.Join(dir, "owners.sh")
	if err := os.WriteFile(name, []byte(script.String()), 0o600); err != nil {
		return "", false, err
	}
	return name, len(attrs) > 0, nil
}

type xattr struct {
	path, name string
	value      []byte
}

// treeXattrs lists the extended attributes of every entry of the tree, in lexical order.
func treeXattrs(tree string) ([]xattr, error) {
	var out []xattr
	buf := make([]byte, 64<<10)
	err := filepath.WalkDir(tree, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		n, err := unix.Llistxattr(p, buf)
		if errors.Is(err, unix.ENOTSUP) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("list the extended attributes of %s: %w", p, err)
		}
		var names []string
		for _, s := range strings.Split(string(buf[:n]), "\x00") {
			if s != "" {
				names = append(names, s)
			}
		}
		slices.Sort(names)
		for _, name := range names {
			out = append(out, xattr{path: p, name: name, value: lgetxattr(p, name)})
		}
		return nil
	})
	return out, err
}

// shellQuote quotes s for sh.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
