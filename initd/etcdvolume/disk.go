package etcdvolume

import (
	"errors"
	"fmt"

	"github.com/kilnproject/kiln/initd/blockdev"
)

// ErrUnsafeDisk is matched (errors.Is) by CheckDisk's error for a device the etcd volume
// must never be (the boot disk, a partition, a disk in use).
var ErrUnsafeDisk = errors.New("not a free whole disk")

// unsafeDiskError is returned when a selector leads to a device the etcd volume must
// never be: the boot disk, a partition, or a disk in use (mounted, swapped on, held by
// device-mapper or RAID, directly or through one of its partitions). Wipe does not
// change that. The device is left untouched.
type unsafeDiskError struct {
	// Selector names the selector, e.g. "by-id volume serial etcd-main"; empty when the
	// device was handed to Prepare directly.
	Selector string
	Device   string
	// Reason says what the device is, e.g. "is the boot disk (it holds /)".
	Reason string
}

func (e *unsafeDiskError) Error() string {
	msg := fmt.Sprintf("%s %s; refusing it, with or without wipe: the etcd volume must be a whole disk nothing else uses", e.Device, e.Reason)
	if e.Selector != "" {
		msg = e.Selector + ": " + msg
	}
	return msg
}

// Is makes errors.Is(err, ErrUnsafeDisk) true.
func (e *unsafeDiskError) Is(target error) bool { return target == ErrUnsafeDisk }

// CheckDisk returns an error matching ErrUnsafeDisk unless dev is a whole disk that nothing uses
// (sysDir is where sysfs is mounted, "" for /sys).
// A disk mounted at mountPath only (when set) is accepted: it is the volume, mounted by
// an earlier run. A regular file (a disk image) is not a disk and is not checked.
func CheckDisk(sysDir, selector, dev, mountPath string) error {
	reason, err := blockdev.WholeDiskUse(sysDir, dev, mountPath)
	if err != nil {
		if selector != "" {
			return fmt.Errorf("%s: check %s: %w", selector, dev, err)
		}
		return fmt.Errorf("check %s: %w", dev, err)
	}
	if reason != "" {
		return &unsafeDiskError{Selector: selector, Device: dev, Reason: reason}
	}
	return nil
}
