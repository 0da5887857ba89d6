package stage1

import (
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/diskfs/go-diskfs/partition/gpt"
	"golang.org/x/sys/unix"

	"github.com/kilnproject/kiln/initd/blockdev"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

const (
	// minDataPartitionSize is the least free space stage 1 accepts for the data partition.
	minDataPartitionSize = 64 << 20

	partitionAlign = 1 << 20
)

// ensureDataPartition makes sure the GPT disk (image file or block device) at path has a partition
// named nodeimage.DataName. When there is none it rewrites the GPT so that it spans the whole disk
// (the backup header moves to the real last sector when the disk is larger than the image it was
// made from) and adds the partition from the first 1 MiB boundary after the last partition to the
// last 1 MiB boundary before the backup partition entries, numbered one past the highest partition
// number. It returns the partition and whether it created it. Running it again changes nothing.
func ensureDataPartition(path string, sectorSize int) (blockdev.Partition, bool, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return blockdev.Partition{}, false, fmt.Errorf("open disk: %w", err)
	}
	defer f.Close()
	size, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return blockdev.Partition{}, false, fmt.Errorf("size of %s: %w", path, err)
	}
	size -= size % int64(sectorSize)
	t, err := gpt.Read(f, sectorSize, sectorSize)
	if err != nil {
		return blockdev.Partition{}, false, fmt.Errorf("read GPT of %s: %w", path, err)
	}
	if p, ok := findPartition(blockdev.PartitionsOf(t), nodeimage.DataName); ok {
		return p, false, nil
	}
	if err := addDataPartition(f, t, size, sectorSize); err != nil {
		return blockdev.Partition{}, false, fmt.Errorf("add data partition to %s: %w", path, err)
	}
	t2, err := gpt.Read(f, sectorSize, sectorSize)
	if err != nil {
		return blockdev.Partition{}, false, fmt.Errorf("re-read GPT of %s: %w", path, err)
	}
	if p, ok := findPartition(blockdev.PartitionsOf(t2), nodeimage.DataName); ok {
		return p, true, nil
	}
	return blockdev.Partition{}, false, fmt.Errorf("re-read GPT of %s: the new %q partition is missing", path, nodeimage.DataName)
}

// findPartition returns the partition with the GPT name name.
func findPartition(parts []blockdev.Partition, name string) (blockdev.Partition, bool) {
	for _, p := range parts {
		if p.Name == name {
			return p, true
		}
	}
	return blockdev.Partition{}, false
}

// addDataPartition grows t to size bytes and adds the data partition after the last partition,
// clearing the old backup header first when it now lies inside the data partition.
func addDataPartition(f *os.File, t *gpt.Table, size int64, sectorSize int) error {
	var lastEnd uint64
	maxIndex := 0
	for _, p := range t.Partitions {
		if p.Type != gpt.Unused {
			lastEnd = max(lastEnd, p.End)
			maxIndex = max(maxIndex, p.Index)
		}
	}
	oldAlternate := uint64(0)
	if !t.RecoveredFromBackup {
		var err error
		if oldAlternate, err = alternateLBA(f, sectorSize); err != nil {
			return err
		}
	}
	t.Resize(uint64(size))
	newAlternate := uint64(size/int64(sectorSize)) - 1
	start, end, err := dataExtent(t, lastEnd, sectorSize)
	if err != nil {
		return err
	}
	// The old backup header now lies inside the data partition: clear it first, so no tool mistakes
	// it for a partition table. A power cut after this leaves a valid primary GPT and the same state.
	if oldAlternate != 0 && oldAlternate < newAlternate {
		if _, err := f.WriteAt(make([]byte, sectorSize), int64(oldAlternate)*int64(sectorSize)); err != nil {
			return fmt.Errorf("clear old backup GPT header: %w", err)
		}
		if err := f.Sync(); err != nil {
			return fmt.Errorf("sync: %w", err)
		}
	}
	t.Partitions = append(t.Partitions, dataPartition(maxIndex+1, start, end))
	return writeTable(f, t, size, sectorSize)
}

// dataPartition is the GPT entry of the data partition.
func dataPartition(index int, start, end uint64) *gpt.Partition {
	return &gpt.Partition{
		Index: index,
		Start: start,
		End:   end,
		Type:  gpt.Type(strings.ToUpper(nodeimage.TypeLinuxData)),
		Name:  nodeimage.DataName,
	}
}

// writeTable writes t to the disk f of size bytes and syncs it.
func writeTable(f *os.File, t *gpt.Table, size int64, sectorSize int) error {
	if err := t.Write(f, size); err != nil {
		return fmt.Errorf("write GPT: %w", err)
	}
	if t.ProtectiveMBR && size/int64(sectorSize)-1 > 0xFFFFFFFF {
		// go-diskfs truncates the protective MBR's size to 32 bits; it must saturate instead.
		if _, err := f.WriteAt([]byte{0xff, 0xff, 0xff, 0xff}, 446+12); err != nil {
			return fmt.Errorf("write protective MBR: %w", err)
		}
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("sync: %w", err)
	}
	return nil
}

// newDataDisk writes, in one go, a GPT holding only the data partition (the whole disk, 1 MiB
// aligned) to the blank disk at path, and returns the partition. The caller has checked that
// the disk is blank: newDataDisk overwrites whatever is there.
func newDataDisk(path string, sectorSize int) (blockdev.Partition, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return blockdev.Partition{}, fmt.Errorf("open disk: %w", err)
	}
	defer f.Close()
	size, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return blockdev.Partition{}, fmt.Errorf("size of %s: %w", path, err)
	}
	size -= size % int64(sectorSize)
	t, err := emptyTable(size, sectorSize)
	if err != nil {
		return blockdev.Partition{}, fmt.Errorf("GPT for %s: %w", path, err)
	}
	start, end, err := dataExtent(t, 0, sectorSize)
	if err != nil {
		return blockdev.Partition{}, fmt.Errorf("data partition on %s: %w", path, err)
	}
	t.Partitions = []*gpt.Partition{dataPartition(1, start, end)}
	if err := writeTable(f, t, size, sectorSize); err != nil {
		return blockdev.Partition{}, fmt.Errorf("data partition on %s: %w", path, err)
	}
	parts, err := blockdev.ReadGPT(path, sectorSize)
	if err != nil {
		return blockdev.Partition{}, err
	}
	if p, ok := findPartition(parts, nodeimage.DataName); ok {
		return p, nil
	}
	return blockdev.Partition{}, fmt.Errorf("re-read GPT of %s: the new %q partition is missing", path, nodeimage.DataName)
}

// emptyTable is a GPT without partitions laid out for a disk of size bytes. go-diskfs sets a
// table's geometry only as it writes or reads one, so it is written to a sparse file in memory
// and read back, leaving the disk untouched until the table is complete.
func emptyTable(size int64, sectorSize int) (*gpt.Table, error) {
	fd, err := unix.MemfdCreate("kiln-gpt", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("memfd: %w", err)
	}
	mem := os.NewFile(uintptr(fd), "kiln-gpt")
	defer mem.Close()
	if err := mem.Truncate(size); err != nil {
		return nil, fmt.Errorf("memfd: %w", err)
	}
	blank := &gpt.Table{LogicalSectorSize: sectorSize, PhysicalSectorSize: sectorSize, ProtectiveMBR: true}
	if err := blank.Write(mem, size); err != nil {
		return nil, err
	}
	return gpt.Read(mem, sectorSize, sectorSize)
}

// dataExtent is the data partition's first and last sector in the resized table t: from the first
// 1 MiB boundary after lastEnd to the last 1 MiB boundary before the backup entries.
func dataExtent(t *gpt.Table, lastEnd uint64, sectorSize int) (start, end uint64, err error) {
	alignSectors := uint64(partitionAlign / sectorSize)
	start = (lastEnd + 1 + alignSectors - 1) / alignSectors * alignSectors
	// End on a 1 MiB boundary too (sgdisk warns otherwise); at most 1 MiB is left unused.
	end = (t.LastDataSector()+1)/alignSectors*alignSectors - 1
	if start > end || (end-start+1)*uint64(sectorSize) < minDataPartitionSize {
		return 0, 0, fmt.Errorf("only %d bytes free after the last partition (sector %d) to the end of the disk, need %d",
			int64(end+1-min(start, end+1))*int64(sectorSize), lastEnd, minDataPartitionSize)
	}
	return start, end, nil
}

// alternateLBA reads the backup header location from the primary GPT header.
func alternateLBA(f io.ReaderAt, sectorSize int) (uint64, error) {
	hdr := make([]byte, 92)
	if _, err := f.ReadAt(hdr, int64(sectorSize)); err != nil {
		return 0, fmt.Errorf("read primary GPT header: %w", err)
	}
	if string(hdr[:8]) != "EFI PART" {
		return 0, fmt.Errorf("read primary GPT header: no EFI PART signature")
	}
	return binary.LittleEndian.Uint64(hdr[32:40]), nil
}
