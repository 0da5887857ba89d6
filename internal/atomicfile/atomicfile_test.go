package atomicfile

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// temporaries lists the temporary files a writer left in dir.
func temporaries(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), ".kiln-") {
			continue
		}
		left = append(left, e.Name())
	}
	return left
}

func owner(t *testing.T, fi fs.FileInfo) (int, int) {
	t.Helper()
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		t.Fatal("no stat_t")
	}
	return int(st.Uid), int(st.Gid)
}

func TestWrite(t *testing.T) {
	asRoot := os.Geteuid() == 0
	tests := []struct {
		name   string
		before func(t *testing.T, dir, dest string) // prepares dest
		opts   Options
		root   bool // needs root (chown to another user)
	}{
		{"new file", nil, Options{Mode: 0o644}, false},
		{"secret", nil, Options{Mode: 0o600}, false},
		{"setuid and sticky", nil, Options{Mode: 0o755 | fs.ModeSetuid | fs.ModeSticky}, false},
		{"no permissions", nil, Options{Mode: 0}, false},
		{"replaces a file and its mode", func(t *testing.T, dir, dest string) {
			if err := os.WriteFile(dest, []byte("old contents that are longer"), 0o666); err != nil {
				t.Fatal(err)
			}
		}, Options{Mode: 0o640}, false},
		{"owner before setgid", nil, Options{Mode: 0o750 | fs.ModeSetgid, Chown: true, UID: 1234, GID: 5678}, true},
		{"owner of a secret", func(t *testing.T, dir, dest string) {
			if err := os.WriteFile(dest, []byte("old"), 0o644); err != nil {
				t.Fatal(err)
			}
		}, Options{Mode: 0o600, Chown: true, UID: 42, GID: 43}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.root && !asRoot {
				t.Skip("chown to another user needs root")
			}
			dir := t.TempDir()
			dest := filepath.Join(dir, "f")
			if tt.before != nil {
				tt.before(t, dir, dest)
			}
			data := []byte("new\n")
			if err := Write(dest, data, tt.opts); err != nil {
				t.Fatal(err)
			}
			checkFile(t, dest, data, tt.opts)
			if left := temporaries(t, dir); len(left) > 0 {
				t.Errorf("temporary files left: %v", left)
			}
		})
	}
}

// checkFile asserts that p is a regular file holding data with the mode and owner opts give.
func checkFile(t *testing.T, p string, data []byte, opts Options) {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	mode := fi.Mode() & (fs.ModeType | fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)
	if mode != opts.Mode {
		t.Errorf("mode %v, want %v", mode, opts.Mode)
	}
	if opts.Chown {
		if uid, gid := owner(t, fi); uid != opts.UID || gid != opts.GID {
			t.Errorf("owner %d:%d, want %d:%d", uid, gid, opts.UID, opts.GID)
		}
	}
	got, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Errorf("contents %q, want %q", got, data)
	}
}

func TestWriteReplacesSymlink(t *testing.T) {
	tests := []struct{ name, target string }{
		{"to a file", "victim"},
		{"to a missing file", "missing"},
		{"to a file outside", "/etc/passwd"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			victim := filepath.Join(dir, "victim")
			if err := os.WriteFile(victim, []byte("victim\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			before, _ := os.ReadFile(tt.target)
			dest := filepath.Join(dir, "link")
			if err := os.Symlink(tt.target, dest); err != nil {
				t.Fatal(err)
			}
			if err := Write(dest, []byte("new\n"), Options{Mode: 0o644}); err != nil {
				t.Fatal(err)
			}
			checkFile(t, dest, []byte("new\n"), Options{Mode: 0o644})
			if got, _ := os.ReadFile(victim); string(got) != "victim\n" {
				t.Errorf("symlink target written: %q", got)
			}
			if after, _ := os.ReadFile(tt.target); !bytes.Equal(before, after) {
				t.Errorf("%s changed", tt.target)
			}
			if _, err := os.Lstat(filepath.Join(dir, "missing")); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("dangling symlink target created: %v", err)
			}
		})
	}
}

func TestWriteIn(t *testing.T) {
	top := t.TempDir()
	if err := os.MkdirAll(filepath.Join(top, "etc/sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	r, err := os.OpenRoot(top)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	tests := []struct {
		name    string
		wantErr bool
	}{
		{"etc/sub/file", false},
		{"top", false},
		{"./etc/../etc/other", false},
		{"../escape", true},
		{"missing/file", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := WriteIn(r, tt.name, []byte("x"), Options{Mode: 0o600})
			if tt.wantErr {
				if err == nil {
					t.Fatal("no error")
				}
				if _, err := os.Lstat(filepath.Join(filepath.Dir(top), "escape")); err == nil {
					t.Error("wrote outside the root")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			checkFile(t, filepath.Join(top, tt.name), []byte("x"), Options{Mode: 0o600})
			if left := temporaries(t, filepath.Dir(filepath.Join(top, tt.name))); len(left) > 0 {
				t.Errorf("temporary files left: %v", left)
			}
		})
	}
}

// errReader fails after some data, as a download cut short does.
type errReader struct{ n int }

func (r *errReader) Read(p []byte) (int, error) {
	if r.n <= 0 {
		return 0, errors.New("connection reset")
	}
	n := min(len(p), r.n)
	r.n -= n
	return n, nil
}

func TestFailureKeepsOld(t *testing.T) {
	tests := []struct {
		name  string
		dest  string // below the test directory; "old" holds the old file
		write func(dir, dest string) error
		root  bool
	}{
		{"reader fails", "old", func(dir, dest string) error {
			f, err := Create(dir, Options{Mode: 0o644})
			if err != nil {
				return err
			}
			defer f.Close()
			if _, err := io.Copy(f, &errReader{n: 100 << 10}); err != nil {
				return err
			}
			return f.Commit(filepath.Base(dest))
		}, false},
		{"destination is a directory", "dir", func(dir, dest string) error {
			return Write(dest, []byte("new"), Options{Mode: 0o644})
		}, false},
		{"not a file name", "old", func(dir, dest string) error {
			f, err := Create(dir, Options{Mode: 0o644})
			if err != nil {
				return err
			}
			f.Write([]byte("new"))
			return f.Commit("sub/old")
		}, false},
		{"file system full", "small/old", func(dir, dest string) error {
			return Write(dest, bytes.Repeat([]byte("x"), 1<<20), Options{Mode: 0o644})
		}, true},
		{"copy of a missing file", "old", func(dir, dest string) error {
			return Copy(filepath.Join(dir, "missing"), dest, Options{Mode: 0o644})
		}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			if tt.root {
				smallFS(t, filepath.Join(dir, "small"))
			}
			if err := os.MkdirAll(filepath.Join(dir, "dir", "keep"), 0o755); err != nil {
				t.Fatal(err)
			}
			dest := filepath.Join(dir, tt.dest)
			if err := os.WriteFile(filepath.Join(dir, "old"), []byte("old\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			if tt.root {
				if err := os.WriteFile(dest, []byte("old\n"), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			if err := tt.write(filepath.Dir(dest), dest); err == nil {
				t.Fatal("no error")
			}
			if tt.dest != "dir" {
				checkFile(t, dest, []byte("old\n"), Options{Mode: 0o600})
			} else if _, err := os.Stat(filepath.Join(dest, "keep")); err != nil {
				t.Errorf("directory changed: %v", err)
			}
			if left := temporaries(t, filepath.Dir(dest)); len(left) > 0 {
				t.Errorf("temporary files left: %v", left)
			}
		})
	}
}

// smallFS mounts a 64 KiB tmpfs on dir (root only).
func smallFS(t *testing.T, dir string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting a small file system needs root")
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=64k"); err != nil {
		t.Skipf("mount tmpfs: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
}

func TestCopy(t *testing.T) {
	tests := []struct {
		name string
		size int
		opts Options
	}{
		{"empty", 0, Options{Mode: 0o644}},
		{"small secret", 10, Options{Mode: 0o600}},
		{"large executable", 3<<20 + 7, Options{Mode: 0o755}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			data := bytes.Repeat([]byte("0123456789abcdef"), tt.size/16+1)[:tt.size]
			src := filepath.Join(dir, "src")
			if err := os.WriteFile(src, data, 0o444); err != nil {
				t.Fatal(err)
			}
			dst := filepath.Join(dir, "dst")
			if err := os.WriteFile(dst, []byte("old, to be replaced"), 0o666); err != nil {
				t.Fatal(err)
			}
			if err := Copy(src, dst, tt.opts); err != nil {
				t.Fatal(err)
			}
			checkFile(t, dst, data, tt.opts)
			if left := temporaries(t, dir); len(left) > 0 {
				t.Errorf("temporary files left: %v", left)
			}
		})
	}
}

// TestNameAppearsFinished watches the directory with inotify: once the destination's name
// appears (the rename), nothing changes the file's contents, mode or owner any more.
func TestNameAppearsFinished(t *testing.T) {
	opts := Options{Mode: 0o640 | fs.ModeSetgid}
	if os.Geteuid() == 0 {
		opts.Chown, opts.UID, opts.GID = true, 1000, 1000
	}
	dir := t.TempDir()
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		t.Skipf("inotify: %v", err)
	}
	defer unix.Close(fd)
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_ALL_EVENTS); err != nil {
		t.Fatal(err)
	}
	if err := Write(filepath.Join(dir, "f"), []byte("data\n"), opts); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, ev := range inotifyEvents(t, fd) {
		if ev.name == "f" {
			got = append(got, ev.String())
		}
	}
	if len(got) != 1 || got[0] != "IN_MOVED_TO" {
		t.Errorf("events on the destination %v, want just IN_MOVED_TO", got)
	}
	checkFile(t, filepath.Join(dir, "f"), []byte("data\n"), opts)
}

type inotifyEvent struct {
	mask uint32
	name string
}

func (e inotifyEvent) String() string {
	names := []struct {
		bit  uint32
		name string
	}{{unix.IN_MOVED_TO, "IN_MOVED_TO"}, {unix.IN_CREATE, "IN_CREATE"}, {unix.IN_MODIFY, "IN_MODIFY"},
		{unix.IN_ATTRIB, "IN_ATTRIB"}, {unix.IN_CLOSE_WRITE, "IN_CLOSE_WRITE"}, {unix.IN_OPEN, "IN_OPEN"}}
	var s []string
	for _, n := range names {
		if e.mask&n.bit != 0 {
			s = append(s, n.name)
		}
	}
	if len(s) == 0 {
		return fmt.Sprintf("%#x", e.mask)
	}
	return strings.Join(s, "|")
}

// inotifyEvents reads the events queued on fd.
func inotifyEvents(t *testing.T, fd int) []inotifyEvent {
	t.Helper()
	buf := make([]byte, 64<<10)
	n, err := unix.Read(fd, buf)
	if err != nil {
		t.Fatalf("read inotify events: %v", err)
	}
	var evs []inotifyEvent
	for off := 0; off+unix.SizeofInotifyEvent <= n; {
		raw := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
		name := buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(raw.Len)]
		evs = append(evs, inotifyEvent{mask: raw.Mask, name: string(bytes.TrimRight(name, "\x00"))})
		off += unix.SizeofInotifyEvent + int(raw.Len)
	}
	return evs
}

func TestPlaceIn(t *testing.T) {
	tests := []struct {
		name    string
		create  func(r *os.Root, tmp string) error
		wantErr bool
		check   func(t *testing.T, dest string)
	}{
		{"symlink replaces a file", func(r *os.Root, tmp string) error { return r.Symlink("/target", tmp) }, false,
			func(t *testing.T, dest string) {
				if got, err := os.Readlink(dest); err != nil || got != "/target" {
					t.Errorf("link %q, %v; want /target", got, err)
				}
			}},
		{"hard link", func(r *os.Root, tmp string) error { return r.Link("sub/other", tmp) }, false,
			func(t *testing.T, dest string) {
				if got, _ := os.ReadFile(dest); string(got) != "other\n" {
					t.Errorf("contents %q, want the other file's", got)
				}
			}},
		{"create fails after making the node", func(r *os.Root, tmp string) error {
			if err := r.Symlink("/target", tmp); err != nil {
				return err
			}
			return errors.New("chown refused")
		}, true, func(t *testing.T, dest string) { checkFile(t, dest, []byte("old\n"), Options{Mode: 0o644}) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			top := t.TempDir()
			if err := os.Mkdir(filepath.Join(top, "sub"), 0o755); err != nil {
				t.Fatal(err)
			}
			dest := filepath.Join(top, "sub", "f")
			if err := os.WriteFile(dest, []byte("old\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(top, "sub", "other"), []byte("other\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			r, err := os.OpenRoot(top)
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			err = PlaceIn(r, "sub/f", func(tmp string) error { return tt.create(r, tmp) })
			if (err != nil) != tt.wantErr {
				t.Fatalf("error %v, want error %v", err, tt.wantErr)
			}
			tt.check(t, dest)
			if left := temporaries(t, filepath.Join(top, "sub")); len(left) > 0 {
				t.Errorf("temporary files left: %v", left)
			}
		})
	}
}

// DirMode creates the missing directories of the destination; without it a missing directory
// is an error and nothing is created.
func TestWriteDirMode(t *testing.T) {
	top := t.TempDir()
	dst := filepath.Join(top, "a", "b", "file")
	if err := Write(dst, []byte("x"), Options{Mode: 0o644}); err == nil {
		t.Fatal("Write into a missing directory without DirMode succeeded")
	}
	if _, err := os.Stat(filepath.Join(top, "a")); !os.IsNotExist(err) {
		t.Fatalf("a failed Write created a directory: %v", err)
	}
	if err := Write(dst, []byte("x"), Options{Mode: 0o644, DirMode: 0o750}); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{"a", "a/b"} {
		fi, err := os.Stat(filepath.Join(top, dir))
		// The umask may take bits away, never add them.
		if err != nil || !fi.IsDir() || fi.Mode().Perm()&^0o750 != 0 || fi.Mode().Perm()&0o700 != 0o700 {
			t.Errorf("%s: %v, %v; want a directory within 0750", dir, fi.Mode(), err)
		}
	}
	if got, err := os.ReadFile(dst); err != nil || string(got) != "x" {
		t.Errorf("file: %q, %v", got, err)
	}
}

// TestUpdateIn: a file already holding the data with the mode is left alone (same inode);
// other data or another mode is replaced; missing directories are made.
func TestUpdateIn(t *testing.T) {
	dir := t.TempDir()
	root, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	inode := func() uint64 {
		fi, err := os.Stat(filepath.Join(dir, "etc/unit"))
		if err != nil {
			t.Fatal(err)
		}
		return fi.Sys().(*syscall.Stat_t).Ino
	}
	steps := []struct {
		name    string
		data    string
		mode    fs.FileMode
		changed bool
	}{
		{"new file in a missing directory", "a", 0o644, true},
		{"same data and mode", "a", 0o644, false},
		{"other mode", "a", 0o600, true},
		{"other data", "b", 0o600, true},
		{"same again", "b", 0o600, false},
	}
	var last uint64
	for _, s := range steps {
		changed, err := UpdateIn(root, "etc/unit", []byte(s.data), Options{Mode: s.mode})
		if err != nil || changed != s.changed {
			t.Fatalf("%s: UpdateIn = %v, %v; want %v", s.name, changed, err, s.changed)
		}
		got, _ := os.ReadFile(filepath.Join(dir, "etc/unit"))
		fi, _ := os.Stat(filepath.Join(dir, "etc/unit"))
		if string(got) != s.data || fi.Mode().Perm() != s.mode {
			t.Errorf("%s: file holds %q mode %v", s.name, got, fi.Mode().Perm())
		}
		if ino := inode(); !s.changed && ino != last {
			t.Errorf("%s: file was rewritten", s.name)
		} else {
			last = ino
		}
	}
}
