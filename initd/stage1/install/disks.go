package install

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/kilnproject/kiln/initd/blockdev"
	"github.com/kilnproject/kiln/initd/etcdvolume"
)

// host is where the installer looks for disks: sysfs's block directory and the device nodes.
// The zero host is the running system's (/sys/block, /dev).
type host struct {
	sysBlock string
	devDir   string
}

func (h host) sysBlockDir() string { return cmp.Or(h.sysBlock, "/sys/block") }
func (h host) deviceDir() string   { return cmp.Or(h.devDir, "/dev") }

// hostDisk is a whole disk the installer saw, and what it found on it.
type hostDisk struct {
	name string // kernel name: vda, sda, nvme0n1
	path string // device node
	size int64  // bytes
	// sectorSize is the logical sector size; the installed image's GPT is laid out for 512.
	sectorSize int
	ids        blockdev.DiskIDs
	removable  bool
	readOnly   bool
	// holds names the data found on it (blockdev.ProbeDisk); empty for an empty disk.
	holds []string
	// etcd says which node config selector names it as the etcd volume, "" when none does.
	etcd string
	// medium is set on the disk holding the boot medium the image is read from.
	medium bool
}

// String describes the disk for the console: path, size, serial, what it holds.
func (d hostDisk) String() string {
	s := fmt.Sprintf("%s (%d MiB", d.path, d.size>>20)
	if d.ids.Serial != "" {
		s += ", serial " + d.ids.Serial
	}
	if d.ids.Model != "" {
		s += ", model " + d.ids.Model
	}
	return s + ")"
}

// holding renders what the disk holds.
func (d hostDisk) holding() string {
	if len(d.holds) == 0 {
		return "empty"
	}
	return "holds " + strings.Join(d.holds, ", ")
}

// virtualPrefixes are kernel names of block devices that are no disk to install to.
var virtualPrefixes = []string{"loop", "ram", "zram", "sr", "fd", "nbd", "dm-", "md"}

// exclusion says why auto must not take d for an image of at least minSize bytes, "" when it
// may. Whether the disk holds data is judged separately.
func (d hostDisk) exclusion(minSize int64) string {
	switch {
	case d.etcd != "":
		return "etcd volume (" + d.etcd + ")"
	case d.medium:
		return "the boot medium the image is read from"
	case slices.ContainsFunc(virtualPrefixes, func(p string) bool { return strings.HasPrefix(d.name, p) }):
		return "not a disk (loop, RAM, optical or virtual device)"
	case d.removable:
		return "removable"
	case d.readOnly:
		return "read-only"
	case d.size < minSize:
		return fmt.Sprintf("smaller than the image (%d MiB)", (minSize+(1<<20)-1)>>20)
	}
	return ""
}

// scan lists the whole disks in the host's sysfs that have a size, with their ids and what
// they hold.
func (h host) scan() ([]hostDisk, error) {
	ents, err := os.ReadDir(h.sysBlockDir())
	if err != nil {
		return nil, fmt.Errorf("list disks: %w", err)
	}
	var disks []hostDisk
	for _, e := range ents {
		dir := filepath.Join(h.sysBlockDir(), e.Name())
		size, sectorSize, ok := blockdev.DiskGeometry(dir)
		if !ok {
			continue
		}
		d := hostDisk{name: e.Name(), path: filepath.Join(h.deviceDir(), e.Name()), size: size, sectorSize: sectorSize, ids: blockdev.ReadDiskIDs(dir)}
		rm, _ := blockdev.ReadSysInt(filepath.Join(dir, "removable"))
		ro, _ := blockdev.ReadSysInt(filepath.Join(dir, "ro"))
		d.removable, d.readOnly = rm == 1, ro == 1
		if d.exclusion(0) == "" {
			if d.holds, err = blockdev.ProbeDisk(d.path); err != nil {
				// Never written without being read: an unreadable disk counts as holding data.
				d.holds = []string{fmt.Sprintf("unreadable data (%v)", err)}
			}
		}
		disks = append(disks, d)
	}
	return disks, nil
}

// markMedium sets hostDisk.medium on the disk whose device node is dev (none when dev is "").
func markMedium(disks []hostDisk, dev string) {
	if dev == "" {
		return
	}
	for i := range disks {
		if disks[i].path == dev || disks[i].name == filepath.Base(dev) {
			disks[i].medium = true
		}
	}
}

// markEtcd sets hostDisk.etcd on the disks the etcd volume selector selects. It fails when the
// selector selects none of them: the installer could not then tell the etcd disk apart.
func markEtcd(disks []hostDisk, v *etcdvolume.Selection) error {
	if v == nil {
		return nil
	}
	found := false
	for i := range disks {
		if v.Selects(disks[i].ids) {
			disks[i].etcd, found = v.String(), true
		}
	}
	if !found {
		return missing(fmt.Errorf("the node config's %s selects none of the disks seen, so the installer cannot keep clear of it (%w). Disks seen:%s",
			v, errNoTarget, listDisks(disks, -1)))
	}
	return nil
}

// listDisks renders disks one a line with their ids, what they hold and, when minSize >= 0,
// why auto passes them over.
func listDisks(disks []hostDisk, minSize int64) string {
	if len(disks) == 0 {
		return "\n  no disks (is the disk driver in the image's modules?)"
	}
	var b strings.Builder
	for _, d := range disks {
		fmt.Fprintf(&b, "\n  %s: %s", d, d.holding())
		if why := d.exclusion(minSize); minSize >= 0 && why != "" {
			fmt.Fprintf(&b, "; excluded: %s", why)
		}
		if len(d.ids.Links) > 0 {
			fmt.Fprintf(&b, "; by-id %s", strings.Join(d.ids.Links, " "))
		}
	}
	return b.String()
}

// errNoTarget is matched by every refusal to choose a disk.
var errNoTarget = errors.New("no disk to install to")

// errMissing is matched by the refusals a disk that has not appeared yet may change: the disk
// named, the etcd volume or any disk auto may use is not there.
var errMissing = errors.New("a disk may still appear")

// missing marks err as one that a disk still to appear may change.
func missing(err error) error { return &missingError{err} }

type missingError struct{ err error }

func (e *missingError) Error() string        { return e.err.Error() }
func (e *missingError) Unwrap() error        { return e.err }
func (e *missingError) Is(target error) bool { return target == errMissing }
