package disk

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kilnproject/kiln/builder/rootfs"
	"github.com/kilnproject/kiln/internal/testkit"
)

// nobody is the unprivileged user the rootless case runs as.
const nobody = 65534

// backslashName is a systemd unit name as Debian ships them: mksquashfs reads the backslash as
// an escape unless the pseudo file doubles it.
const backslashName = `usr/lib/systemd/system/system-systemd\x2dcryptsetup.slice`

// ownedTree lays out a root tree as a bake extracts it without root (every file the baker's)
// with the owners and modes the image must have recorded beside it, as rootfs.Flatten does,
// and writes the pseudo file the bake writes. It returns the tree and the pseudo file.
func ownedTree(t *testing.T, xattrs bool) (*rootfs.Tree, string) {
	t.Helper()
	root := smallTree(t)
	for name, body := range map[string]string{
		"usr/bin/su":        "setuid root\n",
		"usr/bin/crontab":   "setgid crontab\n",
		"var/lib/big/file":  "owned by a uid above 65535\n",
		"etc/with space":    "a name with a space\n",
		backslashName:       "[Slice]\n",
		"var/mail/.keep":    "",
		"tmp/.keep":         "",
		"proc/.keep":        "",
		"var/spool/cron/.x": "",
	} {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	os.Remove(filepath.Join(root, "proc/.keep"))
	os.MkdirAll(filepath.Join(root, "var/spool/cron/crontabs"), 0o755)
	if err := os.Link(filepath.Join(root, "usr/bin/hello"), filepath.Join(root, "usr/bin/hello-again")); err != nil {
		t.Fatal(err)
	}
	// The host copy keeps special bits a non-root extraction can set (its own files).
	for name, mode := range map[string]os.FileMode{"usr/bin/su": 0o755 | os.ModeSetuid, "tmp": 0o777 | os.ModeSticky} {
		if err := os.Chmod(filepath.Join(root, name), mode); err != nil {
			t.Fatal(err)
		}
	}
	if xattrs {
		if err := unix.Lsetxattr(filepath.Join(root, "etc/hostname"), "user.kiln", []byte("hello"), 0); err != nil {
			t.Skipf("the test directory's filesystem takes no user xattrs: %v", err)
		}
	}
	tree := &rootfs.Tree{Dir: root, Owners: map[string]rootfs.Owner{
		"usr/bin/su":              {UID: 0, GID: 0, Mode: 0o755 | os.ModeSetuid},
		"usr/bin/crontab":         {UID: 0, GID: 101, Mode: 0o755 | os.ModeSetgid},
		"var/spool/cron/crontabs": {UID: 0, GID: 101, Mode: 0o730 | os.ModeSticky},
		"var/mail":                {UID: 0, GID: 8, Mode: 0o775 | os.ModeSetgid},
		"proc":                    {UID: 0, GID: 0, Mode: 0o555},
		"home/user":               {UID: 1000, GID: 1000, Mode: 0o700},
		"home/user/secret":        {UID: 1000, GID: 1000, Mode: 0o600},
		"var/lib/big/file":        {UID: 70000, GID: 70001, Mode: 0o644},
		"etc/with space":          {UID: 5, GID: 5, Mode: 0o600},
		backslashName:             {UID: 0, GID: 42, Mode: 0o640},
		"var/spool/cron/.x":       {UID: 0, GID: 101, Mode: 0o600},
		"usr/lib/kiln/data.txt":   {UID: 2, GID: 3, Mode: 0o444},
		"usr/lib/systemd/system":  {UID: 0, GID: 0, Mode: 0o755},
		"usr/lib/systemd":         {UID: 0, GID: 0, Mode: 0o755},
		"var/lib/big":             {UID: 70000, GID: 70001, Mode: 0o750},
	}}
	pf := filepath.Join(t.TempDir(), "owners.pseudo")
	f, err := os.Create(pf)
	if err != nil {
		t.Fatal(err)
	}
	if err := tree.PseudoFile(f); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return tree, pf
}

// fsEntry is one entry of an image as a user of the mounted filesystem sees it.
type fsEntry struct {
	Mode     string // as ls -l shows it
	UID, GID int
	Content  string // regular files: the bytes; symlinks: the target
	Xattrs   string // name=value, sorted, comma separated
}

// TestMakeRootFSEROFSOwners bakes the same tree, with files owned by other users, setuid,
// setgid and sticky bits, a directory without write permission, a hard link, a uid above
// 65535, names mksquashfs must unescape and an extended attribute, into squashfs and into
// erofs: as root (owners set on the tree), through fakeroot, and through fakeroot as an
// unprivileged user. Every erofs image must hold what the squashfs image holds.
func TestMakeRootFSEROFSOwners(t *testing.T) {
	testkit.Tools(t, "mksquashfs", "unsquashfs", "mkfs.erofs", "fsck.erofs", "fakeroot", "setfattr")
	ref, refPF := ownedTree(t, true)
	sq := filepath.Join(t.TempDir(), "root.squashfs")
	if err := MakeRootFS(context.Background(), ref.Dir, sq, RootFSOptions{PseudoFile: refPF}); err != nil {
		t.Fatal(err)
	}
	want := readSquashFS(t, sq)
	for name, e := range map[string]fsEntry{
		".":                       {Mode: "drwxr-xr-x"},
		"usr/bin/su":              {Mode: "-rwsr-xr-x", Content: "setuid root\n"},
		"usr/bin/crontab":         {Mode: "-rwxr-sr-x", GID: 101, Content: "setgid crontab\n"},
		"var/spool/cron/crontabs": {Mode: "drwx-wx--T", GID: 101},
		"var/mail":                {Mode: "drwxrwsr-x", GID: 8},
		"tmp":                     {Mode: "drwxrwxrwt"},
		"proc":                    {Mode: "dr-xr-xr-x"},
		"home/user/secret":        {Mode: "-rw-------", UID: 1000, GID: 1000, Content: "not for everyone\n"},
		"var/lib/big/file":        {Mode: "-rw-r--r--", UID: 70000, GID: 70001, Content: "owned by a uid above 65535\n"},
		backslashName:             {Mode: "-rw-r-----", GID: 42, Content: "[Slice]\n"},
		"etc/with space":          {Mode: "-rw-------", UID: 5, GID: 5, Content: "a name with a space\n"},
		"etc/hostname":            {Mode: "-rw-r--r--", Content: "kiln\n", Xattrs: "user.kiln=hello"},
		"bin":                     {Mode: "lrwxrwxrwx", Content: "usr/bin"},
	} {
		if want[name] != e {
			t.Errorf("squashfs reference %s = %+v, want %+v", name, want[name], e)
		}
	}

	tests := []struct {
		name   string
		owners ownerMethod
		user   bool // run as the unprivileged user, with the default method
	}{
		{name: "root, owners set on the tree", owners: ownersOnTree},
		{name: "fakeroot", owners: ownersFakeroot},
		{name: "fakeroot, unprivileged", user: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if (tc.owners == ownersOnTree || tc.user) && os.Geteuid() != 0 {
				t.Skip("needs root (to chown, or to become another user)")
			}
			tree, pf := ownedTree(t, true)
			dir := t.TempDir()
			a, b := filepath.Join(dir, "a.erofs"), filepath.Join(dir, "b.erofs")
			for _, out := range []string{a, b} {
				if tc.user {
					makeRootFSAs(t, nobody, tree.Dir, out, pf)
					continue
				}
				err := MakeRootFS(context.Background(), tree.Dir, out, RootFSOptions{Type: EROFS, PseudoFile: pf, owners: tc.owners})
				if err != nil {
					t.Fatal(err)
				}
			}
			da, _ := os.ReadFile(a)
			db, _ := os.ReadFile(b)
			if !bytes.Equal(da, db) {
				t.Errorf("two builds of the same tree differ (%d and %d bytes)", len(da), len(db))
			}
			got, nids := readEROFS(t, a)
			for _, name := range union(want, got) {
				if got[name] != want[name] {
					t.Errorf("%s: erofs has %+v, squashfs %+v", name, got[name], want[name])
				}
			}
			if nids["usr/bin/hello"] != nids["usr/bin/hello-again"] {
				t.Errorf("hard links usr/bin/hello and usr/bin/hello-again are inodes %d and %d", nids["usr/bin/hello"], nids["usr/bin/hello-again"])
			}
		})
	}
}

// TestMakeRootFSRootlessIdentical bakes the same tree, owners recorded beside it, into
// squashfs and erofs as root and as an unprivileged user who owns the tree (its setuid bits
// dropped by the chown, as a rootless extraction has them): each pair must be byte-identical,
// names with backslashes (systemd's \x2d escapes) included.
func TestMakeRootFSRootlessIdentical(t *testing.T) {
	testkit.RequireRoot(t, "to bake as root and to become another user")
	testkit.Tools(t, "mksquashfs", "mkfs.erofs", "fakeroot", "setfattr")
	for _, typ := range []string{SquashFS, EROFS} {
		t.Run(typ, func(t *testing.T) {
			tree, pf := ownedTree(t, false)
			dir := t.TempDir()
			asRoot, rootless := filepath.Join(dir, "root."+typ), filepath.Join(dir, "rootless."+typ)
			if err := MakeRootFS(context.Background(), tree.Dir, asRoot, RootFSOptions{Type: typ, PseudoFile: pf}); err != nil {
				t.Fatal(err)
			}
			makeRootFSTypeAs(t, nobody, typ, tree.Dir, rootless, pf)
			a, err := os.ReadFile(asRoot)
			if err != nil {
				t.Fatal(err)
			}
			b, err := os.ReadFile(rootless)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(a, b) {
				t.Errorf("%s baked as root (%d bytes) and without root (%d bytes) differ", typ, len(a), len(b))
			}
		})
	}
}

func union(a, b map[string]fsEntry) []string {
	var names []string
	for n := range a {
		names = append(names, n)
	}
	for n := range b {
		if _, ok := a[n]; !ok {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	return names
}

// extractEROFS extracts an erofs image with fsck.erofs and returns the directory.
func extractEROFS(t *testing.T, img string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "x")
	run(t, "fsck.erofs", "--extract="+dir, img)
	return dir
}

// TestMakeRootFSHelperProcess is MakeRootFS in a process of its own (run by makeRootFSAs as
// another user); it skips when not started that way.
func TestMakeRootFSHelperProcess(t *testing.T) {
	arg := os.Getenv("KILN_DISK_TEST_MAKEROOTFS")
	if arg == "" {
		t.Skip("run by TestMakeRootFSEROFSOwners as another user")
	}
	var a struct{ Tree, Out, PseudoFile, Type string }
	if err := json.Unmarshal([]byte(arg), &a); err != nil {
		t.Fatal(err)
	}
	if err := MakeRootFS(context.Background(), a.Tree, a.Out, RootFSOptions{Type: a.Type, PseudoFile: a.PseudoFile}); err != nil {
		t.Fatal(err)
	}
}

// makeRootFSAs runs MakeRootFS (erofs, default owner method) as uid on a tree that uid owns,
// the way a bake without root sees its tree.
func makeRootFSAs(t *testing.T, uid int, tree, out, pf string) {
	t.Helper()
	makeRootFSTypeAs(t, uid, EROFS, tree, out, pf)
}

// makeRootFSTypeAs is makeRootFSAs for a root filesystem type of the caller's choice.
func makeRootFSTypeAs(t *testing.T, uid int, typ, tree, out, pf string) {
	t.Helper()
	// The test binary and every directory on the way must be reachable by uid.
	bin := filepath.Join(filepath.Dir(filepath.Dir(tree)), "disk.test")
	if _, err := os.Stat(bin); err != nil {
		run(t, "cp", os.Args[0], bin)
	}
	for _, p := range []string{tree, out, pf, bin} {
		for d := filepath.Dir(p); d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
			if err := os.Chmod(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := os.Chmod(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{tree, filepath.Dir(out)} {
		// chown -R drops setuid bits on the host copy: the pseudo file holds the modes.
		run(t, "chown", "-R", fmt.Sprintf("%d:%d", uid, uid), p)
	}
	arg, _ := json.Marshal(map[string]string{"Tree": tree, "Out": out, "PseudoFile": pf, "Type": typ})
	cmd := exec.Command(bin, "-test.run=^TestMakeRootFSHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), "KILN_DISK_TEST_MAKEROOTFS="+string(arg), "HOME=/")
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("MakeRootFS as uid %d: %v\n%s", uid, err, b)
	}
}

var unsquashfsLine = regexp.MustCompile(`^(\S{10}) (\d+)/(\d+) +\S+ \S+ \S+ squashfs-root(/.*)?$`)

// readSquashFS lists a squashfs image with unsquashfs: owners and modes from its listing,
// contents and extended attributes from an extraction.
func readSquashFS(t *testing.T, img string) map[string]fsEntry {
	t.Helper()
	out := map[string]fsEntry{}
	for _, l := range strings.Split(strings.TrimSpace(run(t, "unsquashfs", "-lln", img)), "\n") {
		m := unsquashfsLine.FindStringSubmatch(l)
		if m == nil {
			t.Fatalf("unsquashfs listing line %q", l)
		}
		name := strings.TrimPrefix(m[4], "/")
		if i := strings.Index(name, " -> "); m[1][0] == 'l' && i >= 0 {
			name = name[:i]
		}
		if name == "" {
			name = "."
		}
		uid, _ := strconv.Atoi(m[2])
		gid, _ := strconv.Atoi(m[3])
		out[name] = fsEntry{Mode: m[1], UID: uid, GID: gid}
	}
	dir := filepath.Join(t.TempDir(), "x")
	run(t, "unsquashfs", "-d", dir, img)
	addContents(t, dir, out)
	return out
}

// readEROFS reads owners, modes and extended attributes of every inode of an erofs image
// from its metadata (fsck.erofs and dump.erofs do not show setuid, setgid and sticky bits),
// and contents from an extraction with fsck.erofs.
func readEROFS(t *testing.T, img string) (map[string]fsEntry, map[string]uint64) {
	t.Helper()
	data, err := os.ReadFile(img)
	if err != nil {
		t.Fatal(err)
	}
	r, err := newErofsReader(data)
	if err != nil {
		t.Fatalf("%s: %v", img, err)
	}
	out := map[string]fsEntry{}
	if err := r.walk(r.rootNid, ".", out); err != nil {
		t.Fatalf("%s: %v", img, err)
	}
	addContents(t, extractEROFS(t, img), out)
	return out, r.nids
}

// addContents fills in file contents, symlink targets and extended attributes from an
// extracted tree.
func addContents(t *testing.T, dir string, entries map[string]fsEntry) {
	t.Helper()
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		e, ok := entries[filepath.ToSlash(rel)]
		if !ok {
			return fmt.Errorf("%s extracted but not listed", rel)
		}
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			e.Content, err = os.Readlink(p)
		case d.Type().IsRegular():
			var b []byte
			b, err = os.ReadFile(p)
			e.Content = string(b)
		}
		if err != nil {
			return err
		}
		if e.Xattrs == "" {
			e.Xattrs = hostXattrs(t, p)
		}
		entries[filepath.ToSlash(rel)] = e
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func hostXattrs(t *testing.T, p string) string {
	t.Helper()
	attrs, err := treeXattrs(p)
	if err != nil {
		t.Fatal(err)
	}
	var s []string
	for _, a := range attrs {
		if a.path == p {
			s = append(s, a.name+"="+string(a.value))
		}
	}
	return strings.Join(s, ",")
}

// erofsReader reads the metadata of an uncompressed-directory erofs image (what mkfs.erofs
// writes), after the on-disk format in the kernel's fs/erofs/erofs_fs.h.
type erofsReader struct {
	d            []byte
	bs           int
	rootNid      uint64
	meta, xattrs int
	nids         map[string]uint64 // path -> inode
}

func newErofsReader(d []byte) (*erofsReader, error) {
	if len(d) < 2048 || binary.LittleEndian.Uint32(d[1024:]) != 0xE0F5E1E2 {
		return nil, fmt.Errorf("no erofs superblock")
	}
	sb := d[1024:]
	bs := 1 << sb[12]
	return &erofsReader{d: d, bs: bs, rootNid: uint64(binary.LittleEndian.Uint16(sb[14:])),
		meta: int(binary.LittleEndian.Uint32(sb[40:])) * bs, xattrs: int(binary.LittleEndian.Uint32(sb[44:])) * bs,
		nids: map[string]uint64{}}, nil
}

var xattrPrefix = map[byte]string{1: "user.", 2: "system.posix_acl_access", 3: "system.posix_acl_default", 4: "trusted.", 6: "security."}

func (r *erofsReader) le16(o int) int { return int(binary.LittleEndian.Uint16(r.d[o:])) }
func (r *erofsReader) le32(o int) int { return int(binary.LittleEndian.Uint32(r.d[o:])) }

// walk records the inode nid as name in out and, for a directory, everything under it.
func (r *erofsReader) walk(nid uint64, name string, out map[string]fsEntry) error {
	off := r.meta + int(nid)*32
	format, icount, mode := r.le16(off), r.le16(off+2), uint32(r.le16(off+4))
	var size, isize int
	var uid, gid int
	if format&1 == 0 { // compact
		size, isize, uid, gid = r.le32(off+8), 32, r.le16(off+24), r.le16(off+26)
	} else {
		size, isize, uid, gid = int(binary.LittleEndian.Uint64(r.d[off+8:])), 64, r.le32(off+24), r.le32(off+28)
	}
	e := fsEntry{Mode: lsMode(mode), UID: uid, GID: gid}
	xsize := 0
	if icount > 0 {
		xsize = 12 + 4*(icount-1)
		e.Xattrs = r.readXattrs(off+isize, xsize)
	}
	out[name], r.nids[name] = e, nid
	if mode&unix.S_IFMT != unix.S_IFDIR {
		return nil
	}
	blocks, err := r.dirBlocks(name, off, format, size, isize+xsize)
	if err != nil {
		return err
	}
	for _, b := range blocks {
		if err := r.walkDirBlock(b, name, out); err != nil {
			return err
		}
	}
	return nil
}

// readXattrs returns the sorted, comma-joined extended attributes of the xattr body of xsize bytes at h.
func (r *erofsReader) readXattrs(h, xsize int) string {
	var attrs []string
	entry := func(p int) (int, string) {
		n, idx, vs := int(r.d[p]), r.d[p+1], r.le16(p+2)
		s := xattrPrefix[idx] + string(r.d[p+4:p+4+n]) + "=" + string(r.d[p+4+n:p+4+n+vs])
		return (4 + n + vs + 3) &^ 3, s
	}
	shared := int(r.d[h+4])
	for i := 0; i < shared; i++ {
		_, s := entry(r.xattrs + 4*r.le32(h+12+4*i))
		attrs = append(attrs, s)
	}
	for p := h + 12 + 4*shared; p < h+xsize; {
		n, s := entry(p)
		attrs = append(attrs, s)
		p += n
	}
	slices.Sort(attrs)
	return strings.Join(attrs, ",")
}

// dirBlocks returns the data blocks of the directory inode at off; inline is the size of the inode
// and its xattrs, after which an inline tail block sits.
func (r *erofsReader) dirBlocks(name string, off, format, size, inline int) ([][]byte, error) {
	layout := (format >> 1) & 7
	blk := r.le32(off + 16)
	var blocks [][]byte
	switch layout {
	case 0: // flat, every block out of line
		for o := 0; o < size; o += r.bs {
			blocks = append(blocks, r.d[blk*r.bs+o:blk*r.bs+min(o+r.bs, size)])
		}
	case 2: // flat, the last partial block inline after the inode and its xattrs
		full := size / r.bs * r.bs
		for o := 0; o < full; o += r.bs {
			blocks = append(blocks, r.d[blk*r.bs+o:blk*r.bs+o+r.bs])
		}
		if size > full {
			tail := off + inline
			blocks = append(blocks, r.d[tail:tail+size-full])
		}
	default:
		return nil, fmt.Errorf("%s: directory data layout %d", name, layout)
	}
	return blocks, nil
}

// walkDirBlock walks every entry but . and .. of the directory block b of directory name.
func (r *erofsReader) walkDirBlock(b []byte, name string, out map[string]fsEntry) error {
	n := int(binary.LittleEndian.Uint16(b[8:])) / 12
	for i := 0; i < n; i++ {
		child := binary.LittleEndian.Uint64(b[12*i:])
		start, end := int(binary.LittleEndian.Uint16(b[12*i+8:])), len(b)
		if i+1 < n {
			end = int(binary.LittleEndian.Uint16(b[12*(i+1)+8:]))
		}
		cname, _, _ := strings.Cut(string(b[start:end]), "\x00")
		if cname == "." || cname == ".." {
			continue
		}
		p := cname
		if name != "." {
			p = name + "/" + cname
		}
		if err := r.walk(child, p, out); err != nil {
			return err
		}
	}
	return nil
}

// lsMode shows a file mode the way ls -l (and unsquashfs -ll) does.
func lsMode(m uint32) string {
	types := map[uint32]byte{unix.S_IFDIR: 'd', unix.S_IFLNK: 'l', unix.S_IFREG: '-', unix.S_IFCHR: 'c',
		unix.S_IFBLK: 'b', unix.S_IFIFO: 'p', unix.S_IFSOCK: 's'}
	b := []byte{types[m&unix.S_IFMT]}
	for i, c := range "rwxrwxrwx" {
		if m&(1<<(8-i)) != 0 {
			b = append(b, byte(c))
		} else {
			b = append(b, '-')
		}
	}
	special := func(bit uint32, i int, set byte) {
		if m&bit != 0 {
			if b[i] == 'x' {
				b[i] = set
			} else {
				b[i] = set - 'a' + 'A'
			}
		}
	}
	special(unix.S_ISUID, 3, 's')
	special(unix.S_ISGID, 6, 's')
	special(unix.S_ISVTX, 9, 't')
	return string(b)
}
