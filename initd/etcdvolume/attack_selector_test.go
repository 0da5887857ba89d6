package etcdvolume

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kilnproject/kiln/initd/etcdvolume/etcdvolumetest"
)

// The attack: an etcd volume selector (serial, by-id name, AWS tags, GCE disk name) that
// leads to the boot disk, a partition, or a disk something else uses. wipe: true must not
// turn that into an erased disk. These tests use real loop devices (root only), real
// mkfs, mount and swapon, and the machine's own boot disk; device-mapper and RAID holders
// are a sysfs tree of the test's own (see fakeHolder).

// mountAt makes an ext4 filesystem labelled label on dev (unless label is "") and mounts
// dev on a new directory, which it returns.
func mountAt(t *testing.T, dev, label string) string {
	t.Helper()
	if label != "" {
		etcdvolumetest.ShTrim(t, "mkfs.ext4", "-q", "-F", "-L", label, dev)
	}
	dir := t.TempDir()
	etcdvolumetest.ShTrim(t, "mount", "-t", "ext4", dev, dir)
	t.Cleanup(func() { exec.Command("umount", dir).Run() })
	return dir
}

// fakeHolder returns a sysfs tree, for the checks to read, in which holder (dm-0, a
// device-mapper device named etcd-vg-data, or md0, a RAID) holds the loop disk dev, or its
// partition p1 when part. This kernel has neither device-mapper nor RAID, and a holder is
// nothing more to the checks than an entry in holders/.
func fakeHolder(t *testing.T, dev string, part bool, holder string) string {
	t.Helper()
	root := t.TempDir()
	mkdir := func(dir string) {
		if err := os.MkdirAll(filepath.Join(root, dir), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	link := func(target, name string) {
		mkdir(filepath.Dir(name))
		if err := os.Symlink(target, filepath.Join(root, name)); err != nil {
			t.Fatal(err)
		}
	}
	write := func(name, data string) {
		if err := os.WriteFile(filepath.Join(root, name), []byte(data+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	id := func(dev string) string {
		var st unix.Stat_t
		if err := unix.Stat(dev, &st); err != nil {
			t.Fatal(err)
		}
		return fmt.Sprintf("%d:%d", unix.Major(st.Rdev), unix.Minor(st.Rdev))
	}
	disk := filepath.Base(dev)
	held := "devices/virtual/block/" + disk
	mkdir(held + "/holders")
	link("../../"+held, "dev/block/"+id(dev))
	if part {
		p := disk + "p1"
		held += "/" + p
		mkdir(held + "/holders")
		write(held+"/partition", "1")
		write(held+"/dev", id(dev+"p1"))
		link("../../devices/virtual/block/"+disk+"/"+p, "dev/block/"+id(dev+"p1"))
	}
	mkdir("devices/virtual/block/" + holder)
	link(filepath.Join(root, "devices/virtual/block", holder), held+"/holders/"+holder)
	link("../../devices/virtual/block/"+holder, "class/block/"+holder)
	if strings.HasPrefix(holder, "dm-") {
		mkdir("devices/virtual/block/" + holder + "/dm")
		write("devices/virtual/block/"+holder+"/dm/name", "etcd-vg-data")
	}
	return root
}

// rootDevice returns the device mounted on /, and the whole disk holding it (the same
// when / is on a whole disk). It skips the test when / is not on a block device.
func rootDevice(t *testing.T) (dev, disk string) {
	t.Helper()
	dev = etcdvolumetest.ShTrim(t, "findmnt", "-n", "-o", "SOURCE", "/")
	if fi, err := os.Stat(dev); err != nil || fi.Mode()&os.ModeDevice == 0 || fi.Mode()&os.ModeCharDevice != 0 {
		t.Skipf("/ is on %q, not a block device", dev)
	}
	disk = dev
	if parent := etcdvolumetest.ShTrim(t, "lsblk", "-n", "-d", "-o", "PKNAME", dev); parent != "" {
		disk = "/dev/" + parent
	}
	return dev, disk
}

// signatures is what blkid -p finds on dev, to show it unchanged.
func signatures(dev string) string {
	out, err := exec.Command("blkid", "-p", "-o", "export", dev).CombinedOutput()
	return fmt.Sprintf("%s (%v)", out, err)
}

// selectorCase is a device a by-id selector may lead to, and whether the selector must refuse it.
type selectorCase struct {
	name string
	// setup returns the device the selector's link leads to and the volume's mount
	// path.
	setup func(t *testing.T) (dev, mountPath string)
	// reason is in the error; "" means the disk is accepted.
	reason string
	// direct also hands the device to Prepare (loop devices only: never the boot disk).
	direct bool
	// holder, when set, holds the device (its partition p1 when holderPart) in a sysfs
	// tree of the test's own (see fakeHolder), which the checks read.
	holder     string
	holderPart bool
}

var selectorCases = []selectorCase{
	{
		name: "boot disk",
		setup: func(t *testing.T) (string, string) {
			_, disk := rootDevice(t)
			return disk, ""
		},
		reason: "is the boot disk (it holds /",
	},
	{
		name: "partition holding /",
		setup: func(t *testing.T) (string, string) {
			dev, disk := rootDevice(t)
			if dev == disk {
				t.Skipf("/ is on the whole disk %s", disk)
			}
			return dev, ""
		},
		reason: " of disk ",
	},
	{
		name: "partition of a free disk",
		setup: func(t *testing.T) (string, string) {
			return etcdvolumetest.LoopDisk(t, true) + "p1", ""
		},
		reason: " of disk loop",
		direct: true,
	},
	{
		name: "mounted disk",
		setup: func(t *testing.T) (string, string) {
			dev := etcdvolumetest.LoopDisk(t, false)
			mountAt(t, dev, "data")
			return dev, ""
		},
		reason: "is mounted at /",
		direct: true,
	},
	{
		name: "volume mounted at its mount path and elsewhere",
		setup: func(t *testing.T) (string, string) {
			dev := etcdvolumetest.LoopDisk(t, false)
			own := mountAt(t, dev, "etcd")
			mountAt(t, dev, "")
			return dev, own
		},
		reason: "is mounted at /",
	},
	{
		name: "disk with a mounted partition",
		setup: func(t *testing.T) (string, string) {
			dev := etcdvolumetest.LoopDisk(t, true)
			mountAt(t, dev+"p1", "data")
			return dev, ""
		},
		reason: "p1, which is mounted at /",
		direct: true,
	},
	{
		name: "disk held by device-mapper",
		setup: func(t *testing.T) (string, string) {
			return etcdvolumetest.LoopDisk(t, false), ""
		},
		holder: "dm-0",
		reason: "is in use by dm-0 (device-mapper etcd-vg-data)",
		direct: true,
	},
	{
		name: "disk in a RAID",
		setup: func(t *testing.T) (string, string) {
			return etcdvolumetest.LoopDisk(t, false), ""
		},
		holder: "md0",
		reason: "is in use by md0 (RAID)",
		direct: true,
	},
	{
		name: "disk whose partition device-mapper holds",
		setup: func(t *testing.T) (string, string) {
			return etcdvolumetest.LoopDisk(t, true), ""
		},
		holder:     "dm-0",
		holderPart: true,
		reason:     "p1, which is in use by dm-0 (device-mapper etcd-vg-data)",
		direct:     true,
	},
	{
		name: "disk whose partition is in a RAID",
		setup: func(t *testing.T) (string, string) {
			return etcdvolumetest.LoopDisk(t, true), ""
		},
		holder:     "md0",
		holderPart: true,
		reason:     "p1, which is in use by md0 (RAID)",
		direct:     true,
	},
	{
		name: "swap disk",
		setup: func(t *testing.T) (string, string) {
			dev := etcdvolumetest.LoopDisk(t, false)
			etcdvolumetest.ShTrim(t, "mkswap", dev)
			etcdvolumetest.ShTrim(t, "swapon", dev)
			t.Cleanup(func() { exec.Command("swapoff", dev).Run() })
			return dev, ""
		},
		reason: "is in use as swap",
		direct: true,
	},
	{
		name: "free whole disk",
		setup: func(t *testing.T) (string, string) {
			return etcdvolumetest.LoopDisk(t, false), ""
		},
	},
	{
		name: "volume mounted at its mount path by an earlier run",
		setup: func(t *testing.T) (string, string) {
			dev := etcdvolumetest.LoopDisk(t, false)
			return dev, mountAt(t, dev, "etcd")
		},
	},
}

// TestSelectorRefusesDisksInUse: a by-id selector whose link leads to the boot disk, a
// partition, or a disk that is mounted, swapped on or held by device-mapper or RAID
// (directly or through a partition) fails with an error naming the selector and the reason, wipe: true
// or not, and the device keeps what it had. Prepare handed such a device directly refuses
// to wipe or format it too. A free whole disk, and the volume mounted at its own mount
// path by an earlier run, are accepted.
func TestSelectorRefusesDisksInUse(t *testing.T) {
	etcdvolumetest.NeedTools(t, "losetup", "sgdisk", "partx", "mkfs.ext4", "mkswap", "swapon", "blkid", "findmnt", "lsblk")
	for _, tt := range selectorCases {
		t.Run(tt.name, func(t *testing.T) { checkSelectorCase(t, tt) })
	}
}

// checkSelectorCase links the case's device under a by-id name and checks Find and Prepare
// on it, without wipe and with it.
func checkSelectorCase(t *testing.T, tt selectorCase) {
	dev, mountPath := tt.setup(t)
	var sysDir string
	if tt.holder != "" {
		sysDir = fakeHolder(t, dev, tt.holderPart, tt.holder)
	}
	links := t.TempDir()
	if err := os.Symlink(dev, filepath.Join(links, "virtio-etcd-main")); err != nil {
		t.Fatal(err)
	}
	before := signatures(dev)
	for _, wipe := range []bool{false, true} {
		want := Want{FSType: fsExt4, Label: "etcd", Wipe: wipe, SysDir: sysDir}
		finder := ByID{Serial: "etcd-main", DevDir: links, SysDir: sysDir, MountPath: mountPath, Timeout: time.Minute, Poll: 10 * time.Millisecond}
		if tt.reason == "" {
			checkSelectorAccepts(t, finder, dev, want)
			continue
		}
		checkSelectorRefuses(t, finder, dev, want, tt)
		if after := signatures(dev); after != before {
			t.Errorf("wipe %v: %s changed:\nbefore %s\nafter  %s", wipe, dev, before, after)
		}
	}
}

// checkSelectorAccepts checks that Find leads to dev and Prepare formats it.
func checkSelectorAccepts(t *testing.T, finder ByID, dev string, want Want) {
	t.Helper()
	ctx := context.Background()
	got, err := finder.Find(ctx)
	if err != nil || got != dev {
		t.Fatalf("wipe %v: Find = %q, %v; want %s", want.Wipe, got, err, dev)
	}
	res, err := Prepare(ctx, got, want)
	if err != nil || res.FSType != fsExt4 || res.Label != "etcd" {
		t.Fatalf("wipe %v: Prepare = %+v, %v", want.Wipe, res, err)
	}
}

// checkSelectorRefuses checks that Find refuses dev naming the selector and the case's
// reason, and that Prepare handed dev directly refuses it too when the case says so.
func checkSelectorRefuses(t *testing.T, finder ByID, dev string, want Want, tt selectorCase) {
	t.Helper()
	ctx := context.Background()
	wipe := want.Wipe
	got, err := finder.Find(ctx)
	if err == nil {
		// Never hand what Find returned to Prepare: it may be this machine's boot disk.
		t.Errorf("wipe %v: Find accepted %s", wipe, got)
	} else {
		t.Log(err)
		if !errors.Is(err, ErrUnsafeDisk) || !strings.Contains(err.Error(), "by-id volume serial etcd-main: "+dev+" ") ||
			!strings.Contains(err.Error(), tt.reason) {
			t.Errorf("wipe %v: Find error %q; want it to name the selector, %s and %q", wipe, err, dev, tt.reason)
		}
	}
	if tt.direct {
		_, err := Prepare(ctx, dev, want)
		if err == nil || wipe && !errors.Is(err, ErrUnsafeDisk) {
			t.Errorf("wipe %v: Prepare(%s) = %v; want it refused", wipe, dev, err)
		}
	}
}
