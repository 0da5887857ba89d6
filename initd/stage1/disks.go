package stage1

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/diskfs/go-diskfs/partition/gpt"

	"github.com/kilnproject/kiln/internal/poll"
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

// Disk is a whole block device and what stage 1 could read of its GPT.
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
	return partitionsOf(t), nil
}

func partitionsOf(t *gpt.Table) []Partition {
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
		sectors, err := readSysInt(filepath.Join(sysBlock, name, "size"))
		if err != nil || sectors == 0 {
			continue
		}
		d := Disk{Name: name, Path: filepath.Join(devDir, name), Size: sectors * 512, SectorSize: 512}
		if lbs, err := readSysInt(filepath.Join(sysBlock, name, "queue", "logical_block_size")); err == nil && lbs > 0 {
			d.SectorSize = int(lbs)
		}
		d.Partitions, d.Err = ReadGPT(d.Path, d.SectorSize)
		disks = append(disks, d)
	}
	return disks, nil
}

func readSysInt(path string) (int64, error) {
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

// RootNotFoundError says root=PARTUUID=… matched no partition, and what was there instead.
type RootNotFoundError struct {
	PARTUUID string
	Waited   time.Duration
	Disks    []Disk
	Cmdline  string
	Modules  []ModuleError // modules that failed to load, a likely cause
}

func (e *RootNotFoundError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "root partition PARTUUID=%s not found after %s", e.PARTUUID, e.Waited.Round(time.Millisecond))
	fmt.Fprintf(&b, "\ncmdline: %s", e.Cmdline)
	if len(e.Disks) == 0 {
		b.WriteString("\ndisks: none (is the disk driver in modules.load?)")
	}
	for _, d := range e.Disks {
		fmt.Fprintf(&b, "\ndisk %s", d)
	}
	for _, m := range e.Modules {
		fmt.Fprintf(&b, "\n%s", m.Error())
	}
	return b.String()
}

// waitForRoot rescans the disks until one holds the partition, or wait has passed (0 still
// looks once).
func waitForRoot(ctx context.Context, log *slog.Logger, sysBlock, devDir, partuuid string, wait time.Duration) (Disk, Partition, []Disk, error) {
	start := time.Now()
	var (
		disks []Disk
		disk  Disk
		part  Partition
		last  string
	)
	err := poll.Until(ctx, poll.Options{
		What:      "root PARTUUID=" + partuuid,
		Timeout:   max(wait, time.Nanosecond),
		Backoff:   poll.Constant(250 * time.Millisecond),
		Retryable: func(error) bool { return false },
	}, func(context.Context) (bool, error) {
		var err error
		if disks, err = ScanDisks(sysBlock, devDir); err != nil {
			return false, err
		}
		var found bool
		if disk, part, found = FindPartition(disks, partuuid); found {
			return true, nil
		}
		if seen := disksSeen(disks); seen != last {
			log.Info("waiting for root", "partuuid", partuuid, "disks", seen)
			last = seen
		}
		return false, nil
	})
	switch {
	case errors.Is(err, poll.ErrTimeout):
		return Disk{}, Partition{}, disks, &RootNotFoundError{PARTUUID: partuuid, Waited: time.Since(start), Disks: disks}
	case ctx.Err() != nil:
		return Disk{}, Partition{}, disks, ctx.Err()
	case err != nil:
		return Disk{}, Partition{}, nil, err
	}
	log.Info("root found", "disk", disk.Path, "partition", part.Index, "name", part.Name, "partuuid", part.GUID)
	return disk, part, disks, nil
}

// disksSeen lists disks for the log, one "; " apart.
func disksSeen(disks []Disk) string {
	seen := make([]string, 0, len(disks))
	for _, d := range disks {
		seen = append(seen, d.String())
	}
	return strings.Join(seen, "; ")
}

// partitionDevice finds the kernel name of partition number index of disk (vda4, nvme0n1p4) in
// sysBlock and returns its node in devDir.
func partitionDevice(sysBlock, devDir, disk string, index int) (string, bool) {
	ents, err := os.ReadDir(filepath.Join(sysBlock, disk))
	if err != nil {
		return "", false
	}
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), disk) {
			continue
		}
		n, err := readSysInt(filepath.Join(sysBlock, disk, e.Name(), "partition"))
		if err == nil && int(n) == index {
			return filepath.Join(devDir, e.Name()), true
		}
	}
	return "", false
}

// waitForPartition waits until the kernel knows partition index of disk and its device node exists.
func waitForPartition(ctx context.Context, sysBlock, devDir, disk string, index int, wait time.Duration) (string, error) {
	var dev string
	err := poll.Until(ctx, poll.Options{
		What:    fmt.Sprintf("partition %d of %s", index, disk),
		Timeout: max(wait, time.Nanosecond),
		Backoff: poll.Constant(100 * time.Millisecond),
	}, func(context.Context) (bool, error) {
		d, ok := partitionDevice(sysBlock, devDir, disk, index)
		if !ok {
			return false, nil
		}
		_, err := os.Stat(d)
		dev = d
		return err == nil, nil
	})
	switch {
	case errors.Is(err, poll.ErrTimeout):
		return "", fmt.Errorf("partition %d of %s did not appear within %s (no %s/%s/%s<n> or %s/%s[p]%d)",
			index, disk, wait, sysBlock, disk, disk, devDir, disk, index)
	case err != nil:
		return "", ctx.Err()
	}
	return dev, nil
}
