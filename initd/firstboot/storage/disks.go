package storage

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/coreos/ignition/v2/config/v3_6/types"

	"github.com/kilnproject/kiln/initd/blockdev"
	"github.com/kilnproject/kiln/internal/poll"
)

const mib = 1 << 20

// disks partitions each storage.disks entry with GPT, as Ignition does:
//
//   - wipeTable: the disk is to hold the listed partitions and nothing else. A disk that
//     already holds exactly them (as an earlier run left it) is kept; otherwise its
//     partition table and signatures are erased first. Without wipeTable a disk that holds
//     something other than a GPT (a DOS table, a filesystem) is refused.
//   - a partition that exists (by number, or by label when number is 0) and matches every
//     given field is kept; one that does not is replaced when wipePartitionEntry, refused
//     otherwise; shouldExist: false deletes it (wipePartitionEntry required, as Ignition
//     does) or leaves it absent;
//   - missing partitions are created with sgdisk, and Apply waits (Options.Settle) until
//     the kernel shows them in /dev.
func (a *applier) disks(ctx context.Context, st types.Storage) error {
	for i, d := range st.Disks {
		if err := a.disk(ctx, fmt.Sprintf("storage.disks[%d]", i), d); err != nil {
			return err
		}
	}
	return nil
}

// disk partitions the storage.disks entry d at field (see disks).
func (a *applier) disk(ctx context.Context, field string, d types.Disk) error {
	real, err := a.device(ctx, field+".device", d.Device)
	if err != nil {
		return err
	}
	ss := a.sectorSize(real)
	sig, err := blockdev.Probe(ctx, real)
	if err != nil {
		return fieldErr(field+".device", "%s: %w", d.Device, err)
	}
	var parts []blockdev.Partition
	if sig.PTType == "gpt" {
		if parts, err = blockdev.ReadGPT(real, ss); err != nil {
			return fieldErr(field+".device", "%w", err)
		}
	}
	wipe := false
	if deref(d.WipeTable) {
		wipe = !sig.Blank && !a.holdsExactly(parts, d.Partitions, ss)
	} else if !sig.Blank && sig.PTType != "gpt" {
		return fieldErr(field+".device", "%s holds %s, not a GPT; refusing to partition it (wipeTable: true erases it)", describeDev(d.Device, real), sig)
	}
	if wipe {
		parts = nil
	}
	plan, err := planPartitions(field, d, parts, ss)
	if err != nil {
		return err
	}
	if !wipe && len(plan.args) == 0 {
		return a.waitPartitions(ctx, field, real, plan.want)
	}
	if err := a.writable(field+".device", d.Device, real); err != nil {
		return err
	}
	if wipe {
		if err := a.wipeTable(ctx, field, d.Device, real, sig); err != nil {
			return err
		}
	}
	if len(plan.args) > 0 {
		if _, err := run(ctx, "sgdisk", append(plan.args, "--", real)...); err != nil {
			return fieldErr(field, "%w", err)
		}
		for _, n := range plan.notes {
			a.note(field, "%s on %s", n, d.Device)
		}
	}
	if err := a.rereadPartitions(ctx, field, real); err != nil {
		return err
	}
	return a.waitPartitions(ctx, field, real, plan.want)
}

// partitionPlan is what partitioning a disk takes.
type partitionPlan struct {
	args  []string // sgdisk arguments, in order
	want  []int    // the partition numbers that must show in /dev afterwards
	notes []string // what the arguments change, for the log
}

// planPartitions works out how to bring the disk d at field, holding parts, to the
// partitions it lists: which to keep, delete and create. It refuses to change or delete a
// partition without wipePartitionEntry.
func planPartitions(field string, d types.Disk, parts []blockdev.Partition, ss int) (partitionPlan, error) {
	var plan partitionPlan
	used := map[int]bool{}
	for _, p := range parts {
		used[p.Index] = true
	}
	for j, p := range d.Partitions {
		pf := fmt.Sprintf("%s.partitions[%d]", field, j)
		cur, found := findPartition(parts, p)
		shouldExist := p.ShouldExist == nil || *p.ShouldExist
		if found {
			mismatch := partitionMismatch(cur, p, ss)
			if shouldExist && mismatch == "" {
				plan.want = append(plan.want, cur.Index)
				continue
			}
			if !deref(p.WipePartitionEntry) {
				if !shouldExist {
					return plan, fieldErr(pf, "partition %d of %s exists and shouldExist is false; refusing to delete it (wipePartitionEntry: true deletes it)", cur.Index, d.Device)
				}
				return plan, fieldErr(pf, "partition %d of %s %s; refusing to change it (wipePartitionEntry: true replaces it)", cur.Index, d.Device, mismatch)
			}
			plan.args = append(plan.args, "--delete="+strconv.Itoa(cur.Index))
			delete(used, cur.Index)
			plan.notes = append(plan.notes, fmt.Sprintf("deleted partition %d", cur.Index))
			if !shouldExist {
				continue
			}
		}
		if !shouldExist {
			continue
		}
		n := p.Number
		if n == 0 {
			for n = 1; used[n]; n++ {
			}
		}
		used[n] = true
		plan.args = append(plan.args, newPartitionArgs(n, p, ss)...)
		plan.want = append(plan.want, n)
		plan.notes = append(plan.notes, fmt.Sprintf("created partition %d%s", n, labelNote(p.Label)))
	}
	return plan, nil
}

// wipeTable erases the partition table and signatures of the disk real (dev in the config),
// which held sig.
func (a *applier) wipeTable(ctx context.Context, field, dev, real string, sig blockdev.Signature) error {
	if _, err := run(ctx, "wipefs", "-a", "--", real); err != nil {
		return fieldErr(field+".wipeTable", "%w", err)
	}
	if _, err := run(ctx, "sgdisk", "--zap-all", "--", real); err != nil {
		return fieldErr(field+".wipeTable", "%w", err)
	}
	a.note(field, "erased the partition table of %s (it held %s)", dev, sig)
	return nil
}

func labelNote(l *string) string {
	if l == nil || *l == "" {
		return ""
	}
	return fmt.Sprintf(" (%s)", *l)
}

// findPartition finds p's partition in parts: by number, or by label when number is 0.
func findPartition(parts []blockdev.Partition, p types.Partition) (blockdev.Partition, bool) {
	for _, c := range parts {
		if p.Number != 0 && c.Index == p.Number || p.Number == 0 && p.Label != nil && c.Name == *p.Label {
			return c, true
		}
	}
	return blockdev.Partition{}, false
}

// partitionMismatch describes how cur differs from what p gives, or is "".
func partitionMismatch(cur blockdev.Partition, p types.Partition, ss int) string {
	perMiB := uint64(mib / ss)
	var diffs []string
	if p.Label != nil && cur.Name != *p.Label {
		diffs = append(diffs, fmt.Sprintf("is labelled %q, not %q", cur.Name, *p.Label))
	}
	if s := deref(p.StartMiB); s != 0 && cur.Start != uint64(s)*perMiB {
		diffs = append(diffs, fmt.Sprintf("starts at sector %d, not at %d MiB (sector %d)", cur.Start, s, uint64(s)*perMiB))
	}
	if s := deref(p.SizeMiB); s != 0 && cur.End-cur.Start+1 != uint64(s)*perMiB {
		diffs = append(diffs, fmt.Sprintf("holds %d sectors, not %d MiB (%d sectors)", cur.End-cur.Start+1, s, uint64(s)*perMiB))
	}
	if t := deref(p.TypeGUID); t != "" && !strings.EqualFold(cur.Type, t) {
		diffs = append(diffs, fmt.Sprintf("has type %s, not %s", cur.Type, strings.ToLower(t)))
	}
	if g := deref(p.GUID); g != "" && !strings.EqualFold(cur.GUID, g) {
		diffs = append(diffs, fmt.Sprintf("has GUID %s, not %s", cur.GUID, strings.ToLower(g)))
	}
	return strings.Join(diffs, ", ")
}

// holdsExactly reports whether parts are exactly the partitions want lists (each
// matching), as a wipeTable run leaves the disk.
func (a *applier) holdsExactly(parts []blockdev.Partition, want []types.Partition, ss int) bool {
	n := 0
	for _, p := range want {
		if p.ShouldExist != nil && !*p.ShouldExist {
			if _, found := findPartition(parts, p); found {
				return false
			}
			continue
		}
		cur, found := findPartition(parts, p)
		if !found || partitionMismatch(cur, p, ss) != "" {
			return false
		}
		n++
	}
	return n == len(parts)
}

// newPartitionArgs are sgdisk's arguments creating partition n as p says: at startMiB (0:
// the first free aligned sector), of sizeMiB (0: the largest free block).
func newPartitionArgs(n int, p types.Partition, ss int) []string {
	perMiB := mib / ss
	start, end := "0", "0"
	if s := deref(p.StartMiB); s != 0 {
		start = strconv.Itoa(s * perMiB)
	}
	if s := deref(p.SizeMiB); s != 0 {
		end = "+" + strconv.Itoa(s*perMiB)
	}
	args := []string{fmt.Sprintf("--new=%d:%s:%s", n, start, end)}
	if l := deref(p.Label); l != "" {
		args = append(args, fmt.Sprintf("--change-name=%d:%s", n, l))
	}
	if t := deref(p.TypeGUID); t != "" {
		args = append(args, fmt.Sprintf("--typecode=%d:%s", n, t))
	}
	if g := deref(p.GUID); g != "" {
		args = append(args, fmt.Sprintf("--partition-guid=%d:%s", n, g))
	}
	return args
}

// sectorSize is the logical sector size of block device real (512 when sysfs does not say).
func (a *applier) sectorSize(real string) int {
	dir, err := blockdev.BlockDir(a.o.SysDir, real)
	if err != nil {
		return 512
	}
	if _, n, ok := blockdev.DiskGeometry(dir); ok {
		return n
	}
	return 512
}

// rereadPartitions makes the kernel see the new table: partx -u updates the partitions
// it knows and drops deleted ones; partitions it still lacks are added one by one (the
// BLKRRPART sgdisk asks for is refused while the disk is open, and some kernels do not
// parse the table on it).
func (a *applier) rereadPartitions(ctx context.Context, field, real string) error {
	if _, err := run(ctx, "partx", "-u", "--", real); err != nil {
		a.o.Log.Warn("partx -u", "device", real, "error", err)
	}
	dir, err := blockdev.BlockDir(a.o.SysDir, real)
	if err != nil {
		return fieldErr(field, "%w", err)
	}
	ss := a.sectorSize(real)
	parts, err := blockdev.ReadGPT(real, ss)
	if err != nil {
		return fieldErr(field, "%w", err)
	}
	have := kernelPartitions(dir)
	for _, p := range parts {
		if _, ok := have[p.Index]; !ok {
			if _, err := run(ctx, "partx", "-a", "--nr", strconv.Itoa(p.Index), "--", real); err != nil {
				return fieldErr(field, "tell the kernel of partition %d: %w", p.Index, err)
			}
		}
	}
	a.settle(ctx)
	return nil
}

// kernelPartitions maps the partition numbers the kernel knows of the disk in sysfs
// directory dir to their names (vdb1, nvme0n1p1, loop0p1).
func kernelPartitions(dir string) map[int]string {
	out := map[int]string{}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name(), "partition"))
		if err != nil {
			continue
		}
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			out[n] = e.Name()
		}
	}
	return out
}

// waitPartitions waits (Options.Settle) until partitions nums of disk real are in /dev.
func (a *applier) waitPartitions(ctx context.Context, field, real string, nums []int) error {
	if len(nums) == 0 {
		return nil
	}
	dir, err := blockdev.BlockDir(a.o.SysDir, real)
	if err != nil {
		return fieldErr(field, "%w", err)
	}
	var missing []int
	err = poll.Until(ctx, poll.Options{What: "partitions to appear", Timeout: a.o.Settle,
		Backoff: poll.Constant(100 * time.Millisecond), Retryable: func(error) bool { return false }},
		func(context.Context) (bool, error) {
			have := kernelPartitions(dir)
			missing = missing[:0]
			for _, n := range nums {
				name, ok := have[n]
				if !ok {
					missing = append(missing, n)
					continue
				}
				if _, err := os.Stat(filepath.Join(filepath.Dir(real), name)); err != nil {
					missing = append(missing, n)
				}
			}
			return len(missing) == 0, nil
		})
	if err != nil {
		slices.Sort(missing)
		return fieldErr(field, "partitions %v of %s did not appear in /dev within %s (%v)", missing, real, a.o.Settle, err)
	}
	return nil
}
