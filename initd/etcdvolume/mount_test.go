package etcdvolume

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kilnproject/kiln/initd/blockdev"
	"github.com/kilnproject/kiln/internal/testkit"
)

// TestPrepareAndMountLoop runs the first-boot sequence on a loop device: prepare, mount,
// write, and again (the next boot): the data is still there.
func TestPrepareAndMountLoop(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for loop devices and mount")
	}
	testkit.Tools(t, "losetup", "blkid", "mkfs.ext4", "e2fsck")
	img := testkit.SparseFile(t, 64<<20)
	out, err := exec.Command("losetup", "--find", "--show", img).Output()
	if err != nil {
		t.Skipf("no loop device: %v", err)
	}
	loop := strings.TrimSpace(string(out))
	t.Cleanup(func() { exec.Command("losetup", "-d", loop).Run() })
	where := filepath.Join(t.TempDir(), "etcd")
	t.Cleanup(func() { unix.Unmount(where, unix.MNT_DETACH) })

	ctx := context.Background()
	want := Want{FSType: "ext4", Label: "etcd"}
	res, err := Prepare(ctx, loop, want)
	if err != nil || !res.Formatted {
		t.Fatalf("Prepare = %+v, %v", res, err)
	}
	if err := blockdev.Mount(loop, where, res.FSType); err != nil {
		t.Fatalf("Mount: %v", err)
	}
	if err := blockdev.Mount(loop, where, res.FSType); err != nil {
		t.Fatalf("Mount again (already mounted there): %v", err)
	}
	if err := os.WriteFile(filepath.Join(where, "db"), []byte(etcdData), 0o600); err != nil {
		t.Fatal(err)
	}
	// While it is mounted, Prepare accepts it without running e2fsck on a live fs.
	if again, err := Prepare(ctx, loop, want); err != nil || again.Formatted {
		t.Fatalf("Prepare of the mounted device = %+v, %v", again, err)
	}
	if err := unix.Unmount(where, 0); err != nil {
		t.Fatal(err)
	}
	if again, err := Prepare(ctx, loop, want); err != nil || again.Formatted || again.UUID != res.UUID {
		t.Fatalf("Prepare at the next boot = %+v, %v", again, err)
	}
	if err := blockdev.Mount(loop, where, "ext4"); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(where, "db")); err != nil || string(got) != etcdData {
		t.Errorf("data after remount = %q, %v", got, err)
	}
	// Something else mounted there is an error, not a second mount.
	other := testkit.SparseFile(t, 64<<20)
	testkit.Run(t, "mkfs.ext4", "-q", "-F", other)
	out, err = exec.Command("losetup", "--find", "--show", other).Output()
	if err != nil {
		t.Fatal(err)
	}
	loop2 := strings.TrimSpace(string(out))
	t.Cleanup(func() { exec.Command("losetup", "-d", loop2).Run() })
	if err := blockdev.Mount(loop2, where, "ext4"); err == nil || !strings.Contains(err.Error(), "is mounted there already") {
		t.Errorf("Mount of another device on %s: %v", where, err)
	}
	if err := blockdev.Mount(img, where, "ext4"); err == nil || !strings.Contains(err.Error(), "not a block device") {
		t.Errorf("Mount of a regular file: %v", err)
	}
}
