package stage1

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/kilnproject/kiln/initd/blockdev"
	"github.com/kilnproject/kiln/internal/poll"
)

// rootNotFoundError says root=PARTUUID=… matched no partition, and what was there instead.
type rootNotFoundError struct {
	partuuid string
	waited   time.Duration
	disks    []blockdev.Disk
	cmdline  string
	modules  []moduleError // modules that failed to load, a likely cause
}

func (e *rootNotFoundError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "root partition PARTUUID=%s not found after %s", e.partuuid, e.waited.Round(time.Millisecond))
	fmt.Fprintf(&b, "\ncmdline: %s", e.cmdline)
	if len(e.disks) == 0 {
		b.WriteString("\ndisks: none (is the disk driver in modules.load?)")
	}
	for _, d := range e.disks {
		fmt.Fprintf(&b, "\ndisk %s", d)
	}
	for _, m := range e.modules {
		fmt.Fprintf(&b, "\n%s", m.Error())
	}
	return b.String()
}

// waitForRoot rescans the disks until one holds the partition, or wait has passed (0 still
// looks once).
func waitForRoot(ctx context.Context, log *slog.Logger, sysBlock, devDir, partuuid string, wait time.Duration) (blockdev.Disk, blockdev.Partition, []blockdev.Disk, error) {
	start := time.Now()
	var (
		disks []blockdev.Disk
		disk  blockdev.Disk
		part  blockdev.Partition
		last  string
	)
	err := poll.Until(ctx, poll.Options{
		What:      "root PARTUUID=" + partuuid,
		Timeout:   max(wait, time.Nanosecond),
		Backoff:   poll.Constant(250 * time.Millisecond),
		Retryable: func(error) bool { return false },
	}, func(context.Context) (bool, error) {
		var err error
		if disks, err = blockdev.ScanDisks(sysBlock, devDir); err != nil {
			return false, err
		}
		var found bool
		if disk, part, found = blockdev.FindPartition(disks, partuuid); found {
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
		return blockdev.Disk{}, blockdev.Partition{}, disks, &rootNotFoundError{partuuid: partuuid, waited: time.Since(start), disks: disks}
	case ctx.Err() != nil:
		return blockdev.Disk{}, blockdev.Partition{}, disks, ctx.Err()
	case err != nil:
		return blockdev.Disk{}, blockdev.Partition{}, nil, err
	}
	log.Info("root found", "disk", disk.Path, "partition", part.Index, "name", part.Name, "partuuid", part.GUID)
	return disk, part, disks, nil
}

// disksSeen lists disks for the log, one "; " apart.
func disksSeen(disks []blockdev.Disk) string {
	seen := make([]string, 0, len(disks))
	for _, d := range disks {
		seen = append(seen, d.String())
	}
	return strings.Join(seen, "; ")
}

// waitForPartition waits until the kernel knows partition index of disk and its device node exists.
func waitForPartition(ctx context.Context, sysBlock, devDir, disk string, index int, wait time.Duration) (string, error) {
	var dev string
	err := poll.Until(ctx, poll.Options{
		What:    fmt.Sprintf("partition %d of %s", index, disk),
		Timeout: max(wait, time.Nanosecond),
		Backoff: poll.Constant(100 * time.Millisecond),
	}, func(context.Context) (bool, error) {
		d, ok := blockdev.PartitionDevice(sysBlock, devDir, disk, index)
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
