package blockdev

import (
	"fmt"
	"path/filepath"
	"slices"

	"golang.org/x/sys/unix"
)

// BootMounts are the mount points whose disks are the boot disk: the root, /usr, the data
// partition on /var and the ESP. DeviceUse refuses any device on the disks under them.
var BootMounts = []string{"/", "/usr", "/var", "/boot", "/boot/efi", "/efi"}

// DeviceUse describes why the block device dev must not be written to, or returns "" when
// it may be: it is on the boot disk (a disk under one of bootMounts, BootMounts when nil,
// itself or through device-mapper or RAID), or it is in use — mounted anywhere but
// mountPath (when set), swapped on, or held by device-mapper or RAID; for a whole disk,
// also any of its partitions. Unlike the etcd volume's check, a partition, a RAID array or
// a device-mapper device may be used. sysDir is where sysfs is mounted ("" for /sys).
// A regular file (a disk image) is not a block device and has no use to report.
func DeviceUse(sysDir, dev, mountPath string, bootMounts []string) (string, error) {
	sys := sysfsAt(sysDir)
	var st unix.Stat_t
	if err := unix.Stat(dev, &st); err != nil {
		return "", fmt.Errorf("stat %s: %w", dev, err)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		return "", nil
	case unix.S_IFBLK:
	default:
		return "is not a block device", nil
	}
	if why, err := OnBootDisk(sysDir, dev, bootMounts); why != "" || err != nil {
		return why, err
	}
	id := majMin(st.Rdev)
	dir, err := sys.blockDir(id)
	if err != nil {
		return "", err
	}
	mounts, err := readMountInfo(mountInfoPath)
	if err != nil {
		return "", err
	}
	swaps, err := swapDevices()
	if err != nil {
		return "", err
	}
	if why := sys.usedBy(dir, id, mounts, swaps, mountPath); why != "" {
		return why, nil
	}
	if isPartition(dir) {
		return "", nil
	}
	return sys.partitionUse(dir, mounts, swaps)
}

// OnBootDisk is DeviceUse's boot-disk rule alone: it describes the boot disk dev is on,
// or returns "" when it is on another disk. Unlike DeviceUse it does not mind a device in
// use, so it holds for devices kept as they are (a filesystem mounted by an earlier boot).
// dev must be a block device: anything else (a terminal behind /dev/fd/0, a regular file)
// is an error.
func OnBootDisk(sysDir, dev string, bootMounts []string) (string, error) {
	sys := sysfsAt(sysDir)
	if bootMounts == nil {
		bootMounts = BootMounts
	}
	var st unix.Stat_t
	if err := unix.Stat(dev, &st); err != nil {
		return "", fmt.Errorf("stat %s: %w", dev, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFBLK {
		return "", fmt.Errorf("%s is %s, not a block device", dev, fileKind(st.Mode))
	}
	mounts, err := readMountInfo(mountInfoPath)
	if err != nil {
		return "", err
	}
	mine := sys.underlyingDisks(majMin(st.Rdev))
	for _, bm := range bootMounts {
		m, ok := mountedAt(mounts, filepath.Clean(bm))
		if !ok {
			continue
		}
		for _, d := range sys.underlyingDisks(m.majMin) {
			if slices.Contains(mine, d) {
				return fmt.Sprintf("is on the boot disk %s (it holds %s, %s)", d, m.mountPoint, m.source), nil
			}
		}
	}
	return "", nil
}

// disksUnder names the whole disks under block device dev (itself, the disk of a
// partition, the disks under a RAID array or device-mapper device), e.g. [vdb vdc]; none
// when dev is not a block device. sysDir is where sysfs is mounted ("" for /sys).
func disksUnder(sysDir, dev string) []string {
	var st unix.Stat_t
	if err := unix.Stat(dev, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFBLK {
		return nil
	}
	return sysfsAt(sysDir).underlyingDisks(majMin(st.Rdev))
}

// SharedDisk is a whole disk both block devices a and b are on (through partitions, RAID
// arrays and device-mapper devices), "" when they share none.
func SharedDisk(sysDir, a, b string) string {
	under := disksUnder(sysDir, a)
	for _, d := range disksUnder(sysDir, b) {
		if slices.Contains(under, d) {
			return d
		}
	}
	return ""
}

// BlockDir is the sysfs directory of block device dev, e.g. /sys/devices/…/block/vdb/vdb1
// for a partition. sysDir is where sysfs is mounted ("" for /sys).
func BlockDir(sysDir, dev string) (string, error) {
	var st unix.Stat_t
	if err := unix.Stat(dev, &st); err != nil {
		return "", err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFBLK {
		return "", fmt.Errorf("%s is not a block device", dev)
	}
	return sysfsAt(sysDir).blockDir(majMin(st.Rdev))
}

// SwapOn reports whether block device dev is an active swap area (/proc/swaps).
func SwapOn(dev string) (bool, error) {
	var st unix.Stat_t
	if err := unix.Stat(dev, &st); err != nil {
		return false, err
	}
	swaps, err := swapDevices()
	if err != nil {
		return false, err
	}
	_, on := swaps[majMin(st.Rdev)]
	return on, nil
}

// fileKind names the kind of file a stat mode describes, for messages.
func fileKind(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFCHR:
		return "a character device"
	case unix.S_IFREG:
		return "a regular file"
	case unix.S_IFDIR:
		return "a directory"
	case unix.S_IFIFO:
		return "a pipe"
	case unix.S_IFSOCK:
		return "a socket"
	}
	return "not a device"
}
