package stage1

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/kilnproject/kiln/initd/blockdev"
	"github.com/kilnproject/kiln/initd/etcdvolume"
)

// errNotFound is wrapped by chooseNamed's error when the named device is not there (yet).
var errNotFound = errors.New("not found")

// chooseNamed resolves kiln.data.dev= (a /dev path, a /dev/disk/by-id name as
// blockdev.ReadDiskIDs derives it from sysfs, a by-id name's -part<N>) to a whole disk or a
// partition of scan's disks and checks it may hold /var: not on the etcd volume (etcd), a
// disk blank or a kiln data disk, a partition blank or ext4.
func chooseNamed(sysBlock, devDir, dataDev string, scan liveScan, etcd *etcdvolume.Selection) (varChoice, error) {
	disks := scan.disks
	kname, part, err := resolveDataDev(sysBlock, dataDev, disks)
	if err != nil {
		return varChoice{}, fmt.Errorf("kiln.data.dev=%s: %w", dataDev, err)
	}
	if slices.Contains(scan.etcd, kname) {
		return varChoice{}, fmt.Errorf("kiln.data.dev=%s: %s is the etcd volume (%s): /var never goes on it",
			dataDev, filepath.Join(devDir, kname), etcd)
	}
	if part != 0 {
		node, ok := blockdev.PartitionDevice(sysBlock, devDir, kname, part)
		if !ok {
			return varChoice{}, fmt.Errorf("kiln.data.dev=%s: partition %d of %s: %w", dataDev, part, kname, errNotFound)
		}
		fs, err := blockdev.ProbeFilesystem(node)
		if err != nil {
			return varChoice{}, fmt.Errorf("kiln.data.dev=%s: %w", dataDev, err)
		}
		if fs != blockdev.FSNone && fs != blockdev.FSExt4 {
			return varChoice{}, fmt.Errorf("kiln.data.dev=%s: %s holds %s, not ext4: refusing to put /var on it (wipe it to use it)", dataDev, node, fs)
		}
		return varChoice{kind: varNamed, partition: node, why: fmt.Sprintf("kiln.data.dev=%s names %s", dataDev, node)}, nil
	}
	for _, d := range disks {
		if d.Name != kname {
			continue
		}
		kind, what := classifyDisk(d)
		if kind == diskUsed {
			return varChoice{}, fmt.Errorf("kiln.data.dev=%s: %s %s: refusing to put /var on it (wipe it to use it)", dataDev, d.Path, what)
		}
		return varChoice{kind: varNamed, disk: d, blank: kind == diskBlank, why: fmt.Sprintf("kiln.data.dev=%s names %s", dataDev, d.Path)}, nil
	}
	return varChoice{}, fmt.Errorf("kiln.data.dev=%s: %s is not a disk stage 1 may use (read-only, or no size)", dataDev, kname)
}

// resolveDataDev finds the kernel name of the disk kiln.data.dev= names and the partition
// number, 0 for the whole disk.
func resolveDataDev(sysBlock, dataDev string, disks []blockdev.Disk) (string, int, error) {
	if name, ok := strings.CutPrefix(dataDev, "/dev/"); ok && !strings.HasPrefix(name, "disk/by-id/") {
		if _, err := os.Stat(filepath.Join(sysBlock, name)); err == nil {
			return name, 0, nil
		}
		ents, _ := filepath.Glob(filepath.Join(sysBlock, "*", name, "partition"))
		if len(ents) == 1 {
			n, err := blockdev.ReadSysInt(ents[0])
			if err == nil {
				return filepath.Base(filepath.Dir(filepath.Dir(ents[0]))), int(n), nil
			}
		}
		return "", 0, fmt.Errorf("no disk or partition %s: %w", dataDev, errNotFound)
	}
	id := strings.TrimPrefix(dataDev, "/dev/disk/by-id/")
	part := 0
	if i := strings.LastIndex(id, "-part"); i > 0 {
		if n, err := strconv.Atoi(id[i+5:]); err == nil && n > 0 {
			id, part = id[:i], n
		}
	}
	var seen []string
	for _, d := range disks {
		// udev does not run in the initramfs: the names come from sysfs, as udev would make them.
		ids := blockdev.ReadDiskIDs(filepath.Join(sysBlock, d.Name))
		if ids.SelectedByID(id) {
			return d.Name, part, nil
		}
		seen = append(seen, fmt.Sprintf("%s (%s)", d.Path, strings.Join(ids.Links, ", ")))
	}
	return "", 0, fmt.Errorf("no disk has the by-id name %s (disks: %s): %w", id, strings.Join(seen, "; "), errNotFound)
}
