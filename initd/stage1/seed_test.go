package stage1

import (
	"bytes"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

var seedTime = time.Date(2001, 2, 3, 4, 5, 6, 789, time.UTC)

// makeVarTree builds a /var-like tree with every kind of entry seed must carry over.
func makeVarTree(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to chown and mknod")
	}
	src := filepath.Join(t.TempDir(), "var")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	dir := func(p string, mode os.FileMode, uid, gid int) {
		must(os.MkdirAll(filepath.Join(src, p), 0o755))
		must(os.Chown(filepath.Join(src, p), uid, gid))
		must(os.Chmod(filepath.Join(src, p), mode))
	}
	file := func(p, content string, mode os.FileMode, uid, gid int) {
		must(os.WriteFile(filepath.Join(src, p), []byte(content), 0o600))
		must(os.Chown(filepath.Join(src, p), uid, gid))
		must(os.Chmod(filepath.Join(src, p), mode))
	}
	must(os.MkdirAll(src, 0o755))
	dir("lib/private", 0o700, 1234, 5678)
	dir("tmp", 0o777|os.ModeSticky, 0, 0)
	dir("log", 0o775|os.ModeSetgid, 0, 4)
	dir("bin", 0o755, 0, 0)
	dir("run", 0o755, 0, 0)
	file("bin/prog", "#!/bin/sh\necho hi\n", 0o755|os.ModeSetuid, 0, 0)
	must(os.Link(filepath.Join(src, "bin/prog"), filepath.Join(src, "bin/prog-hard")))
	file("lib/private/secret", "s3cret", 0o600, 1234, 5678)
	file("empty", "", 0o644, 0, 0)
	file("log/syslog", strings.Repeat("line\n", 50000), 0o640, 0, 4)
	// Sparse: 4 MiB hole then a tail.
	sp := filepath.Join(src, "lib/lastlog")
	f, err := os.Create(sp)
	must(err)
	_, err = f.WriteAt([]byte("tail"), 4<<20)
	must(err)
	must(f.Close())
	must(os.Symlink("lib/private", filepath.Join(src, "link-rel")))
	must(os.Symlink("/run/lock", filepath.Join(src, "lock")))
	must(os.Symlink("nowhere", filepath.Join(src, "dangling")))
	must(os.Lchown(filepath.Join(src, "dangling"), 42, 43))
	must(unix.Mkfifo(filepath.Join(src, "run/fifo"), 0o620))
	must(unix.Mknod(filepath.Join(src, "run/null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))))
	must(unix.Chmod(filepath.Join(src, "run/null"), 0o666))
	l, err := net.Listen("unix", filepath.Join(src, "run/sock"))
	must(err)
	t.Cleanup(func() { l.Close() })
	must(unix.Lsetxattr(filepath.Join(src, "log/syslog"), "user.kiln", []byte("yes"), 0))

	// Fixed times, children before parents.
	var paths []string
	must(filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		paths = append(paths, p)
		return err
	}))
	ts := []unix.Timespec{unix.NsecToTimespec(seedTime.UnixNano()), unix.NsecToTimespec(seedTime.UnixNano())}
	for i := len(paths) - 1; i >= 0; i-- {
		must(unix.UtimesNanoAt(unix.AT_FDCWD, paths[i], ts, unix.AT_SYMLINK_NOFOLLOW))
	}
	return src
}

// compareTrees checks that every entry of src but sockets is in dst with the same type, mode,
// owner, mtime, content, link target and device number.
func compareTrees(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		dp := filepath.Join(dst, rel)
		si, _ := os.Lstat(p)
		di, err := os.Lstat(dp)
		if si.Mode()&fs.ModeSocket != 0 {
			if err == nil {
				t.Errorf("%s: socket was copied", rel)
			}
			return nil
		}
		if err != nil {
			t.Errorf("%s: missing in copy: %v", rel, err)
			return nil
		}
		ss, ds := si.Sys().(*syscall.Stat_t), di.Sys().(*syscall.Stat_t)
		if si.Mode() != di.Mode() {
			t.Errorf("%s: mode %v, want %v", rel, di.Mode(), si.Mode())
		}
		if ss.Uid != ds.Uid || ss.Gid != ds.Gid {
			t.Errorf("%s: owner %d:%d, want %d:%d", rel, ds.Uid, ds.Gid, ss.Uid, ss.Gid)
		}
		if rel != "." && !si.ModTime().Equal(di.ModTime()) {
			t.Errorf("%s: mtime %v, want %v", rel, di.ModTime(), si.ModTime())
		}
		switch {
		case si.Mode().IsRegular():
			a, _ := os.ReadFile(p)
			b, _ := os.ReadFile(dp)
			if !bytes.Equal(a, b) {
				t.Errorf("%s: content differs (%d vs %d bytes)", rel, len(b), len(a))
			}
		case si.Mode()&fs.ModeSymlink != 0:
			a, _ := os.Readlink(p)
			b, _ := os.Readlink(dp)
			if a != b {
				t.Errorf("%s: link to %q, want %q", rel, b, a)
			}
		case si.Mode()&fs.ModeDevice != 0:
			if ss.Rdev != ds.Rdev {
				t.Errorf("%s: device %#x, want %#x", rel, ds.Rdev, ss.Rdev)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestSeed(t *testing.T) {
	tests := []struct {
		name    string
		prepare func(t *testing.T, dst string) // dst as a power cut left it
	}{
		{name: "empty data filesystem", prepare: func(t *testing.T, dst string) {}},
		{name: "over a partial copy", prepare: func(t *testing.T, dst string) {
			for _, d := range []string{"empty/sub", "lib/private"} {
				if err := os.MkdirAll(filepath.Join(dst, d), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			for p, c := range map[string]string{"bin": "was a file", "link-rel": "not a link", "lib/private/secret": "stale and longer than before"} {
				if err := os.WriteFile(filepath.Join(dst, p), []byte(c), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.Symlink("elsewhere", filepath.Join(dst, "lock")); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := makeVarTree(t)
			dst := filepath.Join(t.TempDir(), "data")
			if err := os.Mkdir(dst, 0o755); err != nil {
				t.Fatal(err)
			}
			tt.prepare(t, dst)
			if err := seed(src, dst); err != nil {
				t.Fatal(err)
			}
			compareTrees(t, src, dst)

			var a, b unix.Stat_t
			if err := unix.Lstat(filepath.Join(dst, "bin/prog"), &a); err != nil {
				t.Fatal(err)
			}
			if err := unix.Lstat(filepath.Join(dst, "bin/prog-hard"), &b); err != nil {
				t.Fatal(err)
			}
			if a.Ino != b.Ino {
				t.Error("bin/prog and bin/prog-hard are no longer one file")
			}
			var sp unix.Stat_t
			if err := unix.Stat(filepath.Join(dst, "lib/lastlog"), &sp); err != nil {
				t.Fatal(err)
			}
			if sp.Blocks*512 >= 1<<20 {
				t.Errorf("lib/lastlog uses %d bytes on disk: the hole was filled", sp.Blocks*512)
			}
			val := make([]byte, 16)
			n, err := unix.Lgetxattr(filepath.Join(dst, "log/syslog"), "user.kiln", val)
			if err != nil || string(val[:n]) != "yes" {
				t.Errorf("xattr user.kiln = %q, %v; want \"yes\"", val[:n], err)
			}
		})
	}
}

func TestSeedOnce(t *testing.T) {
	src := makeVarTree(t)
	dst := t.TempDir()
	copied, err := seedOnce(src, dst)
	if err != nil || !copied {
		t.Fatalf("first SeedOnce = %v, %v; want true, nil", copied, err)
	}
	compareTrees(t, src, dst)
	marker, err := os.ReadFile(filepath.Join(dst, seededMarker))
	if err != nil || !strings.HasPrefix(string(marker), "seeded from "+src) {
		t.Fatalf("marker %s = %q, %v", seededMarker, marker, err)
	}

	// A later boot: the node changed its /var; the image's /var changed too. Nothing is copied.
	if err := os.WriteFile(filepath.Join(dst, "log/syslog"), []byte("node's own log\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "new-in-image"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	copied, err = seedOnce(src, dst)
	if err != nil || copied {
		t.Fatalf("second SeedOnce = %v, %v; want false, nil", copied, err)
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "log/syslog")); string(b) != "node's own log\n" {
		t.Errorf("second SeedOnce overwrote log/syslog: %q", b)
	}
	if _, err := os.Lstat(filepath.Join(dst, "new-in-image")); err == nil {
		t.Error("second SeedOnce copied a new file")
	}
}

func TestSeedMissingSource(t *testing.T) {
	_, err := seedOnce(filepath.Join(t.TempDir(), "novar"), t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "novar") {
		t.Fatalf("error = %v, want it to name the missing source", err)
	}
}
