package update

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kilnproject/kiln/initd/blockdev"
	"github.com/kilnproject/kiln/internal/cmdline"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

// Slot is one of the two root partitions.
type Slot struct {
	// Letter is a or b; Name the partition's GPT name (root-a, root-b).
	Letter, Name string
	// Device is the partition's node, PARTUUID its GUID, Size its size in bytes.
	Device, PARTUUID string
	Size             int64
}

// Disk is what an update touches on the boot disk: the ESP (mounted at ESPDir) and the two
// slots, one of them booted.
type Disk struct {
	ESPDir string
	Slots  map[string]Slot
	// Booted is the letter of the slot the node runs from.
	Booted string
}

// Other is the slot that is not booted: the one an update writes.
func (d Disk) Other() Slot {
	if d.Booted == "a" {
		return d.Slots["b"]
	}
	return d.Slots["a"]
}

// slotLetter maps a root partition's name to its slot letter.
func slotLetter(name string) (string, bool) {
	switch name {
	case nodeimage.RootAName:
		return "a", true
	case nodeimage.RootBName:
		return "b", true
	}
	return "", false
}

// System is where a node's disks and kernel state are: normally /sys/block, /dev and
// /proc/cmdline.
type System struct {
	SysBlock, DevDir, Cmdline string
}

// HostSystem is the running node's.
var HostSystem = System{SysBlock: "/sys/block", DevDir: "/dev", Cmdline: cmdline.ProcPath}

// FindDisk finds the disk the node booted from by the root=PARTUUID= of its kernel command
// line and returns its slots and the ESP's device. A network (live) boot has no slots to
// update: it is refused.
func (s System) FindDisk() (Disk, string, error) {
	line, err := cmdline.Read(s.Cmdline)
	if err != nil {
		return Disk{}, "", err
	}
	root, _ := line.Lookup("root")
	partuuid, _ := strings.CutPrefix(root, "PARTUUID=")
	if partuuid == "" {
		return Disk{}, "", errors.New("the node did not boot from a disk (no root=PARTUUID= on the kernel command line): a live boot is updated by booting the new image, not in place")
	}
	disks, err := blockdev.ScanDisks(s.SysBlock, s.DevDir)
	if err != nil {
		return Disk{}, "", err
	}
	bd, booted, ok := blockdev.FindPartition(disks, partuuid)
	if !ok {
		return Disk{}, "", fmt.Errorf("no disk holds the booted root partition %s", partuuid)
	}
	d := Disk{Slots: map[string]Slot{}}
	var esp string
	for _, p := range bd.Partitions {
		dev, found := blockdev.PartitionDevice(s.SysBlock, s.DevDir, bd.Name, p.Index)
		if p.Name == nodeimage.ESPName && found {
			esp = dev
		}
		letter, isSlot := slotLetter(p.Name)
		if !isSlot {
			continue
		}
		if !found {
			return Disk{}, "", fmt.Errorf("%s: the kernel has no node for partition %d (%s)", bd.Path, p.Index, p.Name)
		}
		d.Slots[letter] = Slot{Letter: letter, Name: p.Name, Device: dev, PARTUUID: p.GUID,
			Size: int64(p.End-p.Start+1) * int64(bd.SectorSize)}
		if p.GUID == booted.GUID {
			d.Booted = letter
		}
	}
	switch {
	case d.Booted == "":
		return Disk{}, "", fmt.Errorf("%s: the booted partition %q is neither %s nor %s", bd.Path, booted.Name, nodeimage.RootAName, nodeimage.RootBName)
	case len(d.Slots) != 2:
		return Disk{}, "", fmt.Errorf("%s: want partitions %s and %s:\n%s", bd.Path, nodeimage.RootAName, nodeimage.RootBName, bd)
	case esp == "":
		return Disk{}, "", fmt.Errorf("%s: no %s partition:\n%s", bd.Path, nodeimage.ESPName, bd)
	}
	return d, esp, nil
}

// espMountRoot holds the directories kiln-init mounts the ESP on while it works on it: one per
// mount, so that the boot check (which keeps its mount while it waits for the node's health)
// and a status read or an update at the same time mount and unmount their own.
const espMountRoot = "/run/kiln"

// MountESP mounts the ESP device read-write (vfat) on a new directory under /run/kiln and
// returns it and a function that unmounts it and removes the directory.
func MountESP(dev string) (string, func() error, error) {
	if err := os.MkdirAll(espMountRoot, 0o755); err != nil {
		return "", nil, err
	}
	dir, err := os.MkdirTemp(espMountRoot, "esp-")
	if err != nil {
		return "", nil, err
	}
	if err := unix.Mount(dev, dir, "vfat", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "umask=0077,quiet"); err != nil {
		os.Remove(dir)
		return "", nil, fmt.Errorf("mount the ESP %s on %s: %w", dev, dir, err)
	}
	return dir, func() error {
		if err := unix.Unmount(dir, 0); err != nil {
			return fmt.Errorf("unmount the ESP from %s: %w", dir, err)
		}
		return os.Remove(dir)
	}, nil
}

// syncDir flushes a directory (and, on vfat, the filesystem) to the disk.
func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}

// espPath joins an ESP path (/kiln/b/vmlinuz) under the ESP's mount.
func espPath(esp, p string) string { return filepath.Join(esp, filepath.FromSlash(p)) }
