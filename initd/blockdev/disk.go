package blockdev

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// defaultSysDir is where sysfs is mounted; /sys/dev/block/<major>:<minor> leads to each
// block device's directory.
const defaultSysDir = "/sys"

// sysfs is the root of the sysfs tree the disk checks read.
type sysfs string

// sysfsAt is the sysfs tree at dir; empty means defaultSysDir.
func sysfsAt(dir string) sysfs {
	if dir == "" {
		return defaultSysDir
	}
	return sysfs(dir)
}

// swapsPath lists the active swap areas.
const swapsPath = "/proc/swaps"

// WholeDiskUse describes why dev may not be a volume that takes a whole disk, or returns
// "" when it may: it is a partition, the boot disk (it holds /), or in use — mounted
// anywhere but mountPath (when set), swapped on, held by device-mapper or RAID, itself or
// through one of its partitions. A regular file (a disk image) is not a disk and has no use
// to report. sysDir is where sysfs is mounted ("" for /sys).
func WholeDiskUse(sysDir, dev, mountPath string) (string, error) {
	return sysfsAt(sysDir).diskUse(dev, mountPath)
}

// diskUse describes why dev may not be the volume, or returns "" when it may.
func (sys sysfs) diskUse(dev, mountPath string) (string, error) {
	var st unix.Stat_t
	if err := unix.Stat(dev, &st); err != nil {
		return "", fmt.Errorf("stat: %w", err)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		return "", nil
	case unix.S_IFBLK:
	default:
		return "is not a block device", nil
	}
	id := majMin(st.Rdev)
	dir, err := sys.blockDir(id)
	if err != nil {
		return "", err
	}
	name := filepath.Base(dir)
	if isPartition(dir) {
		return fmt.Sprintf("is partition %s of disk %s, not a whole disk", name, filepath.Base(filepath.Dir(dir))), nil
	}
	mounts, err := readMountInfo(mountInfoPath)
	if err != nil {
		return "", err
	}
	if root, ok := mountedAt(mounts, "/"); ok {
		for _, d := range sys.underlyingDisks(root.majMin) {
			if d == name {
				return fmt.Sprintf("is the boot disk (it holds /, %s)", root.source), nil
			}
		}
	}
	swaps, err := swapDevices()
	if err != nil {
		return "", err
	}
	if why := sys.usedBy(dir, id, mounts, swaps, mountPath); why != "" {
		return why, nil
	}
	return sys.partitionUse(dir, mounts, swaps)
}

// partitionUse describes how a partition of the disk in sysfs directory dir is in use
// (see usedBy), or returns "" when none is.
func (sys sysfs) partitionUse(dir string, mounts []mountEntry, swaps map[string]string) (string, error) {
	parts, err := partitions(dir)
	if err != nil {
		return "", err
	}
	for _, p := range parts {
		pid, err := readTrim(filepath.Join(dir, p, "dev"))
		if err != nil {
			return "", err
		}
		if why := sys.usedBy(filepath.Join(dir, p), pid, mounts, swaps, ""); why != "" {
			return fmt.Sprintf("has partition %s, which %s", p, why), nil
		}
	}
	return "", nil
}

// usedBy describes how the block device in sysfs directory dir (major:minor id) is in
// use: held by another block device (device-mapper, RAID), swapped on, or mounted
// anywhere but mountPath.
func (sys sysfs) usedBy(dir, id string, mounts []mountEntry, swaps map[string]string, mountPath string) string {
	holders, _ := os.ReadDir(filepath.Join(dir, "holders"))
	if len(holders) > 0 {
		var names []string
		for _, h := range holders {
			names = append(names, sys.describeHolder(h.Name()))
		}
		return fmt.Sprintf("is in use by %s (%s/holders is not empty)", strings.Join(names, ", "), dir)
	}
	if file, ok := swaps[id]; ok {
		return fmt.Sprintf("is in use as swap (%s)", file)
	}
	var at []string
	for _, m := range mounts {
		if m.majMin == id && (mountPath == "" || m.mountPoint != path.Clean(mountPath)) {
			at = append(at, m.mountPoint)
		}
	}
	if len(at) > 0 {
		slices.Sort(at)
		return "is mounted at " + strings.Join(slices.Compact(at), ", ")
	}
	return ""
}

// describeHolder names a holder as an operator knows it: dm-0 (device-mapper vg-lv),
// md0 (RAID).
func (sys sysfs) describeHolder(name string) string {
	if dm, err := readTrim(filepath.Join(string(sys), "class/block", name, "dm/name")); err == nil && dm != "" {
		return fmt.Sprintf("%s (device-mapper %s)", name, dm)
	}
	if strings.HasPrefix(name, "md") {
		return name + " (RAID)"
	}
	return name
}

func majMin(rdev uint64) string {
	return fmt.Sprintf("%d:%d", unix.Major(rdev), unix.Minor(rdev))
}

// blockDir is the sysfs directory of the block device with major:minor id, e.g.
// /sys/devices/pci0000:00/…/block/vda or …/block/vda/vda1 for a partition.
func (sys sysfs) blockDir(id string) (string, error) {
	dir, err := filepath.EvalSymlinks(filepath.Join(string(sys), "dev/block", id))
	if err != nil {
		return "", fmt.Errorf("block device %s in sysfs: %w", id, err)
	}
	return dir, nil
}

// isPartition reports whether the sysfs block directory dir is a partition's.
func isPartition(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, "partition"))
	return err == nil
}

// partitions lists the partitions of the disk whose sysfs directory is dir.
func partitions(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("list partitions: %w", err)
	}
	var out []string
	for _, e := range entries {
		if e.IsDir() && isPartition(filepath.Join(dir, e.Name())) {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// underlyingDisks returns the names of the whole disks under the block device with
// major:minor id: itself, the disk of a partition, and the disks under each slave of a
// device-mapper or RAID device, recursively. A device without sysfs entry (a virtual
// filesystem's 0:N) has none.
func (sys sysfs) underlyingDisks(id string) []string {
	dir, err := sys.blockDir(id)
	if err != nil {
		return nil
	}
	var out []string
	seen := map[string]bool{}
	var walk func(dir string, depth int)
	walk = func(dir string, depth int) {
		if depth > 16 || seen[dir] {
			return
		}
		seen[dir] = true
		if isPartition(dir) {
			out = append(out, filepath.Base(filepath.Dir(dir)))
			return
		}
		slaves, _ := os.ReadDir(filepath.Join(dir, "slaves"))
		if len(slaves) == 0 {
			out = append(out, filepath.Base(dir))
			return
		}
		for _, s := range slaves {
			if d, err := filepath.EvalSymlinks(filepath.Join(dir, "slaves", s.Name())); err == nil {
				walk(d, depth+1)
			}
		}
	}
	walk(dir, 0)
	return out
}

// swapDevices maps the major:minor of each block device swapped on to its name in
// /proc/swaps. Swap files are left out: a file's disk is mounted anyway.
func swapDevices() (map[string]string, error) {
	data, err := os.ReadFile(swapsPath)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read swaps: %w", err)
	}
	out := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for first := true; sc.Scan(); first = false {
		f := strings.Fields(sc.Text())
		if first || len(f) < 2 || f[1] != "partition" {
			continue
		}
		file := unescapeOctal(f[0])
		var st unix.Stat_t
		if unix.Stat(file, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFBLK {
			out[majMin(st.Rdev)] = file
		}
	}
	return out, nil
}

func readTrim(file string) (string, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(data)), nil
}
