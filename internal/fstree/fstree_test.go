package fstree

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/kilnproject/kiln/internal/atomicfile"
)

// TestRecreate copies a tree with a nested directory, a symlink, an executable and a setuid
// file, and checks what a reader of the copy would see.
func TestRecreate(t *testing.T) {
	src := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(src, "a", "b"), 0o750))
	must(os.Chmod(filepath.Join(src, "a"), 0o750))
	must(os.WriteFile(filepath.Join(src, "a", "b", "run"), []byte("#!/bin/sh\n"), 0o755))
	must(os.WriteFile(filepath.Join(src, "su"), []byte("su"), 0o755))
	must(os.Chmod(filepath.Join(src, "su"), 0o755|fs.ModeSetuid))
	must(os.Symlink("a/b/run", filepath.Join(src, "link")))
	must(os.Mkdir(filepath.Join(src, "tmp"), 0o777))
	must(os.Chmod(filepath.Join(src, "tmp"), 0o777|fs.ModeSticky))
	must(os.Mkdir(filepath.Join(src, "shared"), 0o775))
	must(os.Chmod(filepath.Join(src, "shared"), 0o775|fs.ModeSetgid))

	for _, tc := range []struct {
		name  string
		extra fs.FileMode
		dirA  fs.FileMode
	}{
		{"exact", 0, 0o750},
		{"writable dirs", 0o700, 0o750 | 0o700},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dst := filepath.Join(t.TempDir(), "copy")
			err := Recreate(src, dst, tc.extra, func(from, to string, mode fs.FileMode) error {
				return atomicfile.Copy(from, to, atomicfile.Options{Mode: mode})
			})
			if err != nil {
				t.Fatal(err)
			}
			if fi, err := os.Stat(filepath.Join(dst, "a")); err != nil || fi.Mode().Perm() != tc.dirA {
				t.Errorf("dir a: %v, %v; want mode %v", fi.Mode(), err, tc.dirA)
			}
			if data, err := os.ReadFile(filepath.Join(dst, "a", "b", "run")); err != nil || string(data) != "#!/bin/sh\n" {
				t.Errorf("a/b/run: %q, %v", data, err)
			}
			if fi, err := os.Stat(filepath.Join(dst, "a", "b", "run")); err != nil || fi.Mode().Perm() != 0o755 {
				t.Errorf("a/b/run mode: %v, %v; want 0755", fi.Mode(), err)
			}
			if fi, err := os.Stat(filepath.Join(dst, "su")); err != nil || fi.Mode()&fs.ModeSetuid == 0 {
				t.Errorf("su lost its setuid bit: %v, %v", fi.Mode(), err)
			}
			if fi, err := os.Stat(filepath.Join(dst, "tmp")); err != nil || fi.Mode()&fs.ModeSticky == 0 {
				t.Errorf("tmp lost its sticky bit: %v, %v", fi.Mode(), err)
			}
			if fi, err := os.Stat(filepath.Join(dst, "shared")); err != nil || fi.Mode()&fs.ModeSetgid == 0 {
				t.Errorf("shared lost its setgid bit: %v, %v", fi.Mode(), err)
			}
			if target, err := os.Readlink(filepath.Join(dst, "link")); err != nil || target != "a/b/run" {
				t.Errorf("link: %q, %v", target, err)
			}
		})
	}
}

func TestRecreateRefusesOtherTypes(t *testing.T) {
	src := t.TempDir()
	if err := syscall.Mkfifo(filepath.Join(src, "fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	err := Recreate(src, filepath.Join(t.TempDir(), "copy"), 0, func(from, to string, mode fs.FileMode) error {
		return atomicfile.Copy(from, to, atomicfile.Options{Mode: mode})
	})
	if err == nil || !strings.Contains(err.Error(), "fifo: not a directory, file or symlink") {
		t.Fatalf("Recreate with a fifo: %v; want an error naming it", err)
	}
}

func TestRecreateRefusesExistingDestination(t *testing.T) {
	src, dst := t.TempDir(), t.TempDir()
	err := Recreate(src, dst, 0, func(from, to string, mode fs.FileMode) error { return nil })
	if err == nil {
		t.Fatal("Recreate into an existing directory succeeded")
	}
}

// RecreateInto keeps the directories dst holds already, their modes set as new ones', and
// refuses anything else in the way; Recreate refuses a dst that exists.
func TestRecreateInto(t *testing.T) {
	src := t.TempDir()
	for _, err := range []error{
		os.MkdirAll(filepath.Join(src, "a", "b"), 0o755),
		os.Chmod(filepath.Join(src, "a"), 0o750),
		os.WriteFile(filepath.Join(src, "a", "b", "f"), []byte("f"), 0o644),
		os.Mkdir(filepath.Join(src, "c"), 0o755),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	copyFile := func(from, to string, mode fs.FileMode) error {
		return atomicfile.Copy(from, to, atomicfile.Options{Mode: mode})
	}
	dst := filepath.Join(t.TempDir(), "dst")
	if err := os.MkdirAll(filepath.Join(dst, "a"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := Recreate(src, dst, 0, copyFile); err == nil {
		t.Error("Recreate into an existing directory succeeded")
	}
	if err := RecreateInto(src, dst, 0, copyFile, nil); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(dst, "a")); err != nil || fi.Mode().Perm() != 0o750 {
		t.Errorf("a kept: %v, %v; want mode 0750", fi.Mode(), err)
	}
	if data, err := os.ReadFile(filepath.Join(dst, "a", "b", "f")); err != nil || string(data) != "f" {
		t.Errorf("a/b/f: %q, %v", data, err)
	}
	for _, tc := range []struct {
		name string
		make func(p string) error
	}{
		{"a file", func(p string) error { return os.WriteFile(p, nil, 0o644) }},
		{"a symlink to a directory", func(p string) error { return os.Symlink(".", p) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dst := filepath.Join(t.TempDir(), "dst")
			if err := os.Mkdir(dst, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := tc.make(filepath.Join(dst, "c")); err != nil {
				t.Fatal(err)
			}
			if err := RecreateInto(src, dst, 0, copyFile, nil); err == nil {
				t.Errorf("RecreateInto over %s where src has a directory succeeded", tc.name)
			}
		})
	}
}
