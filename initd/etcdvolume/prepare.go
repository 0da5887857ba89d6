package etcdvolume

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"

	"github.com/kilnproject/kiln/initd/blockdev"
)

// Filesystem types Prepare can create.
const (
	fsExt4 = "ext4"
	fsXFS  = "xfs"
)

// Want is the filesystem a volume must carry.
type Want struct {
	// FSType is ext4 or xfs; empty means ext4.
	FSType string
	// Label, when set, must be the existing filesystem's label, and is given to a new one.
	Label string
	// UUID, when set, must be the existing filesystem's UUID, and is given to a new one.
	UUID string
	// Wipe allows Prepare to erase a disk that carries anything other than the wanted
	// filesystem (a partition table, another filesystem, another label) and format it.
	// A disk that already carries the wanted filesystem is kept even with Wipe, so that
	// running Prepare at every boot never destroys the data it put there.
	Wipe bool
	// MinSize, when set, is the fewest bytes the device must hold: a smaller one is
	// refused (a *tooSmallError), whatever it carries.
	MinSize int64
	// SysDir is where sysfs is mounted, which the checks on a disk about to be formatted
	// read; empty means /sys.
	SysDir string
}

// Result says what Prepare found and did.
type Result struct {
	// Formatted is true when Prepare created the filesystem; false when it accepted one
	// that was there.
	Formatted bool
	// Wiped is true when Prepare erased signatures (Want.Wipe) before formatting.
	Wiped bool
	// FSType, Label and UUID describe the filesystem now on the device.
	FSType, Label, UUID string
}

// errRefused is matched (errors.Is) by every *refusedError.
var errRefused = errors.New("refusing to format")

// refusedError is returned when a device carries something Prepare must not format:
// a partition table, another filesystem or a filesystem with another label or UUID.
// The device is left untouched.
type refusedError struct {
	Device string
	// Found describes what is on the device, e.g. "a partition table (gpt)".
	Found string
}

func (e *refusedError) Error() string {
	return fmt.Sprintf("%s has %s; refusing to format it (wipe: true erases it)", e.Device, e.Found)
}

// Is makes errors.Is(err, errRefused) true.
func (e *refusedError) Is(target error) bool { return target == errRefused }

// ErrTooSmall is matched (errors.Is) by every *tooSmallError.
var ErrTooSmall = errors.New("device too small")

// tooSmallError is returned when a device holds fewer bytes than Want.MinSize. The device
// is left untouched.
type tooSmallError struct {
	Device    string
	Size, Min int64
}

func (e *tooSmallError) Error() string {
	return fmt.Sprintf("%s holds %s, less than the minimum of %s; refusing to use it", e.Device, sizeString(e.Size), sizeString(e.Min))
}

// Is makes errors.Is(err, ErrTooSmall) true.
func (e *tooSmallError) Is(target error) bool { return target == ErrTooSmall }

// sizeString gives n bytes in GiB or MiB (whole, or to one decimal) and in bytes: "1 GiB
// (1073741824 bytes)".
func sizeString(n int64) string {
	unit, name := int64(1<<30), "GiB"
	if n < 1<<30 {
		unit, name = 1<<20, "MiB"
	}
	if n%unit == 0 {
		return fmt.Sprintf("%d %s (%d bytes)", n/unit, name, n)
	}
	return fmt.Sprintf("%.1f %s (%d bytes)", float64(n)/float64(unit), name, n)
}

// deviceSize is how many bytes dev (a block device or a regular file) holds.
func deviceSize(dev string) (int64, error) {
	f, err := os.Open(dev)
	if err != nil {
		return 0, fmt.Errorf("size: %w", err)
	}
	defer f.Close()
	n, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return 0, fmt.Errorf("size of %s: %w", dev, err)
	}
	return n, nil
}

// Prepare makes dev carry the wanted filesystem without ever formatting a disk with data:
//
//   - smaller than want.MinSize: a *tooSmallError and the device untouched;
//   - blank (blkid -p finds no signature): mkfs (mkfs.ext4 -F -m0, or mkfs.xfs) with
//     the label and UUID;
//   - the wanted type, with the wanted label and UUID when they are set: kept, after
//     e2fsck -p for ext4 (skipped while the device is mounted). XFS needs no check: the
//     kernel replays its log at mount, as fsck.xfs says;
//   - anything else, a partition table, another filesystem, another label or UUID,
//     conflicting signatures: a *refusedError and the device untouched, unless
//     want.Wipe, which erases every signature (wipefs -a) and formats.
//
// Before it wipes or formats a block device Prepare makes sure it is a whole disk that
// nothing uses: not the boot disk, not a partition, not mounted, swapped on or held by
// device-mapper or RAID, nor any of its partitions. Otherwise it returns an
// error matching ErrUnsafeDisk and leaves the device untouched, whatever want.Wipe says.
//
// Prepare is idempotent and safe to run again after a power cut at any point.
// mke2fs zeroes the old superblock area first and writes the primary superblock last,
// after an fsync, so an interrupted mkfs.ext4 leaves a device blkid reports as blank and
// the next run formats it again. mkfs.xfs instead writes its superblock early with the
// "mkfs in progress" flag and clears the flag at the end; the kernel refuses to mount
// such a filesystem, so it never held data, and Prepare formats it again when its
// label and UUID are the wanted ones (it is refused otherwise). An interrupted wipefs
// leaves a disk that is refused again, and wiped again when want.Wipe.
func Prepare(ctx context.Context, dev string, want Want) (Result, error) {
	if want.FSType == "" {
		want.FSType = fsExt4
	}
	if want.FSType != fsExt4 && want.FSType != fsXFS {
		return Result{}, fmt.Errorf("prepare %s: filesystem type %q is not supported (ext4 or xfs)", dev, want.FSType)
	}
	if want.MinSize > 0 {
		size, err := deviceSize(dev)
		if err != nil {
			return Result{}, fmt.Errorf("prepare %s: %w", dev, err)
		}
		if size < want.MinSize {
			return Result{}, &tooSmallError{Device: dev, Size: size, Min: want.MinSize}
		}
	}
	sig, err := blockdev.ProbeExact(ctx, dev)
	if err != nil {
		return Result{}, fmt.Errorf("prepare %s: %w", dev, err)
	}
	if sig.Blank {
		if err := CheckDisk(want.SysDir, "", dev, ""); err != nil {
			return Result{}, fmt.Errorf("prepare: %w", err)
		}
		return format(ctx, dev, want, false, false)
	}
	if found := mismatch(sig, want); found != "" {
		if !want.Wipe {
			return Result{}, &refusedError{Device: dev, Found: found}
		}
		if err := CheckDisk(want.SysDir, "", dev, ""); err != nil {
			return Result{}, fmt.Errorf("prepare: %w", err)
		}
		if _, err := blockdev.RunTool(ctx, "wipefs", "-a", dev); err != nil {
			return Result{}, fmt.Errorf("prepare %s: wipe (it had %s): %w", dev, found, err)
		}
		return format(ctx, dev, want, true, false)
	}
	if want.FSType == fsXFS {
		interrupted, err := xfsMkfsInProgress(dev)
		if err != nil {
			return Result{}, fmt.Errorf("prepare %s: %w", dev, err)
		}
		if interrupted {
			if err := CheckDisk(want.SysDir, "", dev, ""); err != nil {
				return Result{}, fmt.Errorf("prepare: %w", err)
			}
			return format(ctx, dev, want, false, true)
		}
	}
	if err := check(ctx, dev, sig.Type); err != nil {
		return Result{}, fmt.Errorf("prepare %s: %w", dev, err)
	}
	return Result{FSType: sig.Type, Label: sig.Label, UUID: sig.UUID}, nil
}

// mismatch describes what on the device stands in the way of want, or "" when the
// device carries the wanted filesystem.
func mismatch(sig blockdev.Signature, want Want) string {
	switch {
	case sig.Ambiguous, sig.Type == "":
		return sig.String()
	case sig.PTType != "":
		return fmt.Sprintf("a partition table (%s)", sig.PTType)
	case sig.Type != want.FSType:
		return fmt.Sprintf("%s, not %s", sig, want.FSType)
	case want.Label != "" && sig.Label != want.Label:
		return fmt.Sprintf("%s, not labelled %q", sig, want.Label)
	case want.UUID != "" && !strings.EqualFold(sig.UUID, want.UUID):
		return fmt.Sprintf("%s, not UUID %s", sig, want.UUID)
	}
	return ""
}

// format creates want's filesystem on dev, which is blank (or was just wiped, or holds
// an interrupted mkfs.xfs when force), and reports what is on it afterwards.
func format(ctx context.Context, dev string, want Want, wiped, force bool) (Result, error) {
	var args []string
	switch want.FSType {
	case fsExt4:
		args = []string{"mkfs.ext4", "-q", "-F", "-m0"}
		if want.Label != "" {
			args = append(args, "-L", want.Label)
		}
		if want.UUID != "" {
			args = append(args, "-U", want.UUID)
		}
	case fsXFS:
		args = []string{"mkfs.xfs", "-q"}
		if force {
			args = append(args, "-f")
		}
		if want.Label != "" {
			args = append(args, "-L", want.Label)
		}
		if want.UUID != "" {
			args = append(args, "-m", "uuid="+want.UUID)
		}
	}
	if _, err := blockdev.RunTool(ctx, args[0], append(args[1:], dev)...); err != nil {
		return Result{}, fmt.Errorf("prepare %s: format: %w", dev, err)
	}
	sig, err := blockdev.ProbeExact(ctx, dev)
	if err != nil {
		return Result{}, fmt.Errorf("prepare %s: after format: %w", dev, err)
	}
	if found := mismatch(sig, want); found != "" || sig.Blank {
		return Result{}, fmt.Errorf("prepare %s: after %s, blkid finds %s", dev, args[0], orBlank(found, sig.Blank))
	}
	return Result{Formatted: true, Wiped: wiped, FSType: sig.Type, Label: sig.Label, UUID: sig.UUID}, nil
}

func orBlank(found string, blank bool) string {
	if blank {
		return "no filesystem"
	}
	return found
}

// check runs the filesystem's own consistency check in the mode that repairs only what
// is safe to repair unattended (e2fsck -p). A mounted device is not checked.
func check(ctx context.Context, dev, fstype string) error {
	if fstype != fsExt4 {
		return nil // xfs: the kernel replays the log at mount; xfs_repair -n gives false alarms on a dirty log
	}
	mounted, err := blockdev.Mounted(dev)
	if err != nil || mounted {
		return err
	}
	_, err = blockdev.RunTool(ctx, "e2fsck", "-p", dev)
	var exit *exec.ExitError
	// 1: errors were corrected; 2: corrected, and a mounted root would need a reboot
	// (this device is not mounted).
	if errors.As(err, &exit) && (exit.ExitCode() == 1 || exit.ExitCode() == 2) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("filesystem check found problems it may not repair unattended; repair by hand (e2fsck -f %s): %w", dev, err)
	}
	return nil
}

// xfsMkfsInProgress reports whether dev's primary XFS superblock has sb_inprogress set:
// mkfs.xfs sets it while it works and clears it when it is done.
func xfsMkfsInProgress(dev string) (bool, error) {
	f, err := os.Open(dev)
	if err != nil {
		return false, fmt.Errorf("read xfs superblock: %w", err)
	}
	defer f.Close()
	sb := make([]byte, 128)
	if _, err := io.ReadFull(f, sb); err != nil {
		return false, fmt.Errorf("read xfs superblock of %s: %w", dev, err)
	}
	const inProgressOffset = 126 // sb_inprogress in struct xfs_dsb
	return string(sb[:4]) == "XFSB" && sb[inProgressOffset] != 0, nil
}
