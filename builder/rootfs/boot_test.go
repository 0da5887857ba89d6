package rootfs

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// FindKernel reads the base's directories through the tree: a stray file beside the module
// directories is skipped, a module tree symlinked out of the base is an error naming it.
func TestFindKernelInTree(t *testing.T) {
	host := t.TempDir()
	if err := os.MkdirAll(filepath.Join(host, "6.1.0-host"), 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(host, "6.1.0-host", "vmlinuz"), []byte("host kernel"), 0o644)
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, dir string)
		want  string
		err   []string
	}{
		{
			name: "stray file in the module tree",
			setup: func(t *testing.T, dir string) {
				mkfile(t, dir, "boot/vmlinuz-6.1.0-1", "usr/lib/modules/6.1.0-1/modules.dep", "usr/lib/modules/README")
			},
			want: "6.1.0-1",
		},
		{
			name: "module tree symlinked out of the base",
			setup: func(t *testing.T, dir string) {
				mkfile(t, dir, "usr/lib/x")
				if err := os.Symlink(host, filepath.Join(dir, "usr/lib/modules")); err != nil {
					t.Fatal(err)
				}
			},
			err: []string{"/usr/lib/modules", host, "refused"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			tc.setup(t, dir)
			k, err := (&Tree{Dir: dir}).FindKernel()
			if len(tc.err) > 0 {
				if err == nil {
					t.Fatalf("FindKernel = %+v, want an error", k)
				}
				for _, w := range tc.err {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q does not mention %q", err, w)
					}
				}
				return
			}
			if err != nil || k.Version != tc.want {
				t.Fatalf("FindKernel = %+v, %v; want %s", k, err, tc.want)
			}
		})
	}
}

// CopyOut copies regular files only, and none past its limit: a named pipe is refused
// without waiting for a writer.
func TestCopyOutRefusesSpecialAndBigFiles(t *testing.T) {
	dir := t.TempDir()
	mkfile(t, dir, "boot/vmlinuz")
	if err := syscall.Mkfifo(filepath.Join(dir, "boot/pipe"), 0o644); err != nil {
		t.Fatal(err)
	}
	tree := &Tree{Dir: dir}
	dst := filepath.Join(t.TempDir(), "out")
	for _, tc := range []struct {
		rel   string
		limit int64
		want  string
	}{
		{"boot/pipe", 1 << 20, "/boot/pipe is a named pipe, not a regular file"},
		{"boot/vmlinuz", 3, "/boot/vmlinuz is 4 bytes, more than the 3"},
	} {
		err := tree.CopyOut("kernel", tc.rel, dst, tc.limit)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("CopyOut(%s) = %v, want an error containing %q", tc.rel, err, tc.want)
		}
		if _, err := os.Stat(dst); err == nil {
			t.Errorf("CopyOut(%s) left %s behind", tc.rel, dst)
		}
	}
	if err := tree.CopyOut("kernel", "boot/vmlinuz", dst, 4); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(dst); string(b) != "x\nyz" {
		t.Errorf("copied %q, want the tree's file", b)
	}
}

func mkfile(t *testing.T, dir string, names ...string) {
	t.Helper()
	for _, n := range names {
		p := filepath.Join(dir, n)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("x\nyz"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
