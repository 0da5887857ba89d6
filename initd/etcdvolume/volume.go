// Package etcdvolume finds and prepares the disk that holds a control-plane node's etcd
// data, as kOps' protokube and etcd-manager did. It builds on package blockdev, which knows
// block devices in general (probes, use checks, by-id names, mount units):
//
//   - A Finder locates the disk and returns its device node: ByID (a serial or a name in
//     /dev/disk/by-id, for metal and QEMU), and each cloud's own (initd/cloud/aws: EBS
//     volumes selected by tags, attached with AttachVolume; initd/cloud/gce: a persistent
//     disk by name or labels, attached with instances.attachDisk), built on CheckDisk,
//     WaitFor and the errors below. Losing an attach race to another node is normal: it
//     gives ErrAttachedElsewhere and the caller retries later.
//   - Prepare makes the disk safe to use without ever formatting one that holds data: a
//     blank disk is formatted, a disk with the wanted filesystem (and label and UUID) is
//     checked and accepted, anything else is refused unless the config says wipe.
//   - The caller mounts it with blockdev.MountUnit (every later boot, before containerd
//     and the kubelet start) and blockdev.Mount (the live system).
//   - LinkManifest links /etc/kubernetes/manifests/<name> to the etcd manifest kept on
//     the volume, so etcd cannot start on a node whose disk is missing.
package etcdvolume

import (
	"context"
	"errors"
	"time"

	"github.com/kilnproject/kiln/internal/poll"
)

// Finder locates a disk and returns its device node, e.g. /dev/nvme1n1.
type Finder interface {
	Find(ctx context.Context) (device string, err error)
}

// ErrAttachedElsewhere is returned (wrapped) when the volume is attached to another
// instance: another node won the attach race, or still holds the disk. It is the normal
// outcome of a race between nodes; retry later (the other node may release it).
var ErrAttachedElsewhere = errors.New("volume is attached to another instance")

// ErrNotFound is returned (wrapped) when no volume or device matches the selector.
var ErrNotFound = errors.New("no matching volume")

// Defaults for how long a Finder waits for an attachment or a device node to appear,
// and how often it looks.
const (
	DefaultTimeout = 2 * time.Minute
	DefaultPoll    = 500 * time.Millisecond
)

// WaitFor calls try every interval until it reports done or fails, the timeout passes or
// ctx ends. what names the awaited state in the timeout error. An error from try ends the
// wait at once: try reports "not yet" as (false, nil).
func WaitFor(ctx context.Context, timeout, interval time.Duration, what string, try func() (bool, error)) error {
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	if interval <= 0 {
		interval = DefaultPoll
	}
	return poll.Until(ctx, poll.Options{
		What:      what,
		Timeout:   timeout,
		Backoff:   poll.Constant(interval),
		Retryable: func(error) bool { return false },
	}, func(context.Context) (bool, error) { return try() })
}
