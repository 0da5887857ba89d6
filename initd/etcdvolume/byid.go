package etcdvolume

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/kilnproject/kiln/initd/blockdev"
)

// ByID finds a disk through the links udev makes in /dev/disk/by-id, waiting for udev
// to create them. Exactly one of Serial and ID is set.
//
// A Serial matches the links the common disk buses make for it: virtio-<serial>
// (virtio-blk, QEMU -drive …,serial=<serial>), scsi-0QEMU_QEMU_HARDDISK_<serial> and
// scsi-SQEMU_QEMU_HARDDISK_<serial> (virtio-scsi), ata-*_<serial> and nvme-*_<serial>.
// Partition links (…-part1) never match. An ID is one name in the directory, with or
// without the /dev/disk/by-id/ prefix.
type ByID struct {
	Serial string
	ID     string
	// MountPath is the volume's mount point: a disk mounted there and nowhere else is
	// the volume, mounted by an earlier run, and is accepted. Any other use of the disk
	// found (see CheckDisk) is refused.
	MountPath string
	// DevDir is the by-id directory; empty means blockdev.ByIDDir.
	DevDir string
	// SysDir is where sysfs is mounted, which the disk checks read; empty means
	// /sys.
	SysDir string
	// Timeout bounds the wait for the link (DefaultTimeout when zero); Poll is how often
	// the directory is read (DefaultPoll when zero).
	Timeout, Poll time.Duration
}

// Find waits for the disk's link and returns the device node it resolves to, e.g.
// /dev/vdb. Links for the same serial on different devices are an error, and so is a
// device that is not a whole disk free for the volume (an error matching ErrUnsafeDisk).
func (b ByID) Find(ctx context.Context) (string, error) {
	dir := b.DevDir
	if dir == "" {
		dir = blockdev.ByIDDir
	}
	var what string
	switch {
	case (b.Serial == "") == (b.ID == ""):
		return "", errors.New("by-id volume: set exactly one of serial and id")
	case b.Serial != "":
		if strings.ContainsAny(b.Serial, "/*?[\\") {
			return "", fmt.Errorf("by-id volume: serial %q contains '/' or a glob character", b.Serial)
		}
		what = fmt.Sprintf("a disk with serial %s in %s", b.Serial, dir)
	default:
		id := strings.TrimPrefix(b.ID, blockdev.ByIDDir+"/")
		if id == "" || strings.ContainsRune(id, '/') {
			return "", fmt.Errorf("by-id volume: %q is not a name in %s", b.ID, blockdev.ByIDDir)
		}
		b.ID = id
		what = filepath.Join(dir, id)
	}
	var dev string
	err := WaitFor(ctx, b.Timeout, b.Poll, what, func() (bool, error) {
		var err error
		dev, err = b.lookup(dir)
		return dev != "", err
	})
	if err != nil {
		return "", fmt.Errorf("by-id volume: %w", err)
	}
	selector := "by-id volume serial " + b.Serial
	if b.ID != "" {
		selector = "by-id volume id " + b.ID
	}
	if err := CheckDisk(b.SysDir, selector, dev, b.MountPath); err != nil {
		return "", err
	}
	return dev, nil
}

// lookup returns the device the links resolve to, or "" when there is none yet.
func (b ByID) lookup(dir string) (string, error) {
	var names []string
	if b.ID != "" {
		names = []string{b.ID}
	} else {
		entries, err := os.ReadDir(dir)
		if errors.Is(err, fs.ErrNotExist) {
			return "", nil // udev has not created the directory yet
		}
		if err != nil {
			return "", err
		}
		for _, e := range entries {
			if blockdev.SerialLinkMatches(e.Name(), b.Serial) {
				names = append(names, e.Name())
			}
		}
	}
	devs := map[string][]string{}
	for _, name := range names {
		dev, err := filepath.EvalSymlinks(filepath.Join(dir, name))
		if errors.Is(err, fs.ErrNotExist) {
			continue // a link whose device node is not there (yet)
		}
		if err != nil {
			return "", fmt.Errorf("resolve %s: %w", filepath.Join(dir, name), err)
		}
		devs[dev] = append(devs[dev], name)
	}
	switch len(devs) {
	case 0:
		return "", nil
	case 1:
		for dev := range devs {
			return dev, nil
		}
	}
	var all []string
	for dev, names := range devs {
		all = append(all, fmt.Sprintf("%s (%s)", dev, strings.Join(names, ", ")))
	}
	slices.Sort(all)
	return "", fmt.Errorf("serial %s matches %d disks: %s", b.Serial, len(devs), strings.Join(all, "; "))
}

// Present returns the device the selector leads to now, without waiting and without the
// checks Find makes, or "" when no link matches yet: for telling whether another part of
// the node's storage is about to take the volume's disk.
func (b ByID) Present() (string, error) {
	dir := b.DevDir
	if dir == "" {
		dir = blockdev.ByIDDir
	}
	if (b.Serial == "") == (b.ID == "") {
		return "", errors.New("by-id volume: set exactly one of serial and id")
	}
	if b.ID != "" {
		b.ID = strings.TrimPrefix(b.ID, blockdev.ByIDDir+"/")
	}
	return b.lookup(dir)
}
