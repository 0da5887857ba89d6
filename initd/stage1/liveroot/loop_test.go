package liveroot

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kilnproject/kiln/internal/testkit"
)

func TestAttachReadOnly(t *testing.T) {
	testkit.RequireRoot(t, "loop devices")
	mksquashfs := testkit.Tool(t, "mksquashfs", "squashfs-tools")
	src := t.TempDir()
	os.WriteFile(filepath.Join(src, "os-release"), []byte("ID=kiln\n"), 0o644)
	img := filepath.Join(ramDir(t, 16<<20), fileName)
	testkit.Run(t, mksquashfs, src, img, "-quiet", "-noappend")

	dev, err := Attach(img)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { Detach(dev) })
	name := filepath.Base(dev)
	backing, err := os.ReadFile(filepath.Join("/sys/block", name, "loop", "backing_file"))
	if err != nil || strings.TrimSpace(string(backing)) != img {
		t.Errorf("%s backing file = %q (%v), want %s", dev, backing, err, img)
	}
	if ro, _ := os.ReadFile(filepath.Join("/sys/block", name, "ro")); strings.TrimSpace(string(ro)) != "1" {
		t.Errorf("%s is not read-only (ro=%q)", dev, ro)
	}
	// The device keeps the image after the file is unlinked, as after the initramfs is freed.
	os.Remove(img)
	mnt := t.TempDir()
	if err := unix.Mount(dev, mnt, "squashfs", unix.MS_RDONLY, ""); err != nil {
		t.Fatalf("mount %s: %v", dev, err)
	}
	got, err := os.ReadFile(filepath.Join(mnt, "os-release"))
	unix.Unmount(mnt, 0)
	if string(got) != "ID=kiln\n" {
		t.Errorf("os-release through %s = %q (%v)", dev, got, err)
	}
	if err := Detach(dev); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join("/sys/block", name, "loop", "backing_file")); len(b) != 0 {
		t.Errorf("%s still attached to %s after Detach", dev, b)
	}
}

func TestAttachMissingFile(t *testing.T) {
	testkit.RequireRoot(t, "loop devices")
	_, err := Attach(filepath.Join(t.TempDir(), "none.img"))
	if err == nil || !strings.Contains(err.Error(), "none.img: no such file") {
		t.Fatalf("Attach = %v", err)
	}
}
