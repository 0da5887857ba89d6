package blockdev

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/diskfs/go-diskfs/partition/gpt"
)

// Partition is one GPT entry.
type Partition struct {
	Index int    // 1-based partition number
	Name  string // GPT partition name (root-a, data, …)
	GUID  string // partition GUID (PARTUUID), lowercase
	Type  string // partition type GUID, lowercase
	Start uint64 // first sector
	End   uint64 // last sector (inclusive)
}

// Disk is a whole block device and what could be read of its GPT.
type Disk struct {
	Name       string // kernel name: vda, sda, nvme0n1
	Path       string // device node: /dev/vda
	Size       int64  // bytes
	SectorSize int    // logical sector size in bytes
	Partitions []Partition
	Err        error // set when the GPT could not be read
}

// String renders the disk and its partitions for logs and error messages.
func (d Disk) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s (%d bytes, %d-byte sectors)", d.Path, d.Size, d.SectorSize)
	if d.Err != nil {
		fmt.Fprintf(&b, ": no GPT: %v", d.Err)
		return b.String()
	}
	if len(d.Partitions) == 0 {
		b.WriteString(": GPT without partitions")
	}
	for _, p := range d.Partitions {
		fmt.Fprintf(&b, "\n  %d %q partuuid=%s type=%s sectors %d-%d", p.Index, p.Name, p.GUID, p.Type, p.Start, p.End)
	}
	return b.String()
}

// ReadGPT reads the partition entries of a disk image or block device.
func ReadGPT(path string, sectorSize int) ([]Partition, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	t, err := gpt.Read(f, sectorSize, sectorSize)
	if err != nil {
		return nil, fmt.Errorf("read GPT of %s: %w", path, err)
	}
	return PartitionsOf(t), nil
}

// PartitionsOf lists the used entries of a GPT read with go-diskfs, by index.
func PartitionsOf(t *gpt.Table) []Partition {
	var out []Partition
	for _, p := range t.Partitions {
		if p.Type == gpt.Unused {
			continue
		}
		out = append(out, Partition{
			Index: p.Index, Name: p.Name, GUID: strings.ToLower(p.GUID), Type: strings.ToLower(string(p.Type)),
			Start: p.Start, End: p.End,
		})
	}
	slices.SortFunc(out, func(a, b Partition) int { return a.Index - b.Index })
	return out
}

// ScanDisks lists the whole disks in sysBlock (normally /sys/block) that have a size, and reads
// each one's GPT through its node in devDir (normally /dev).
func ScanDisks(sysBlock, devDir string) ([]Disk, error) {
	ents, err := os.ReadDir(sysBlock)
	if err != nil {
		return nil, fmt.Errorf("list disks: %w", err)
	}
	var disks []Disk
	for _, e := range ents {
		name := e.Name()
		size, sectorSize, ok := DiskGeometry(filepath.Join(sysBlock, name))
		if !ok {
			continue
		}
		d := Disk{Name: name, Path: filepath.Join(devDir, name), Size: size, SectorSize: sectorSize}
		d.Partitions, d.Err = ReadGPT(d.Path, d.SectorSize)
		disks = append(disks, d)
	}
	return disks, nil
}

// DiskGeometry reads a whole disk's size in bytes and its logical sector size (512 when sysfs
// does not say) from its sysfs directory, /sys/block/<name>; ok is false for a disk without a
// size (an empty loop device, a drive without a medium).
func DiskGeometry(dir string) (size int64, sectorSize int, ok bool) {
	sectors, err := ReadSysInt(filepath.Join(dir, "size"))
	if err != nil || sectors == 0 {
		return 0, 0, false
	}
	sectorSize = 512
	if lbs, err := ReadSysInt(filepath.Join(dir, "queue", "logical_block_size")); err == nil && lbs > 0 {
		sectorSize = int(lbs)
	}
	return sectors * 512, sectorSize, true
}

// ReadSysInt reads a sysfs attribute that holds one integer.
func ReadSysInt(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}

// FindPartition returns the disk and partition whose PARTUUID is partuuid (case-insensitive).
func FindPartition(disks []Disk, partuuid string) (Disk, Partition, bool) {
	for _, d := range disks {
		for _, p := range d.Partitions {
			if strings.EqualFold(p.GUID, partuuid) {
				return d, p, true
			}
		}
	}
	return Disk{}, Partition{}, false
}

// PartitionDevice finds the kernel name of partition number index of disk (vda4, nvme0n1p4) in
// sysBlock and returns its node in devDir.
func PartitionDevice(sysBlock, devDir, disk string, index int) (string, bool) {
	ents, err := os.ReadDir(filepath.Join(sysBlock, disk))
	if err != nil {
		return "", false
	}
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), disk) {
			continue
		}
		n, err := ReadSysInt(filepath.Join(sysBlock, disk, e.Name(), "partition"))
		if err == nil && int(n) == index {
			return filepath.Join(devDir, e.Name()), true
		}
	}
	return "", false
}
