// Package storage applies an Ignition config's storage.disks, storage.raid, storage.luks
// and storage.filesystems at first boot, in that order, as Ignition does, with the real
// tools (sgdisk, mdadm, cryptsetup, mkfs.ext4, mkfs.xfs, mkfs.vfat, mkswap, blkid,
// wipefs, partx), on disks other than the boot disk.
//
// Every step checks before it acts, so a second run, or a run at every boot, changes
// nothing that is already as the config says:
//
//   - a partition that exists and matches (number, label, start, size, type and GUID, those
//     given) is kept; one that does not is an error unless wipePartitionEntry;
//   - an array whose members carry its md superblock is assembled, not created again;
//   - a LUKS volume with the wanted UUID and label is opened with its key, not formatted;
//   - a filesystem is kept only when its type, label and UUID (those given) match, else
//     refused unless wipeFilesystem.
//
// Nothing is ever written to the boot disk (the disk under /, /usr, /var, /boot or the ESP),
// nor to a device that is mounted, swapped on or held by another device. Every refusal
// names the config's JSON path. Filesystems with a path get a systemd mount unit (swap a
// swap unit), LUKS volumes an /etc/crypttab entry and their key in /etc/luks/<name> (0600),
// so that later boots set up the same storage without kiln.
package storage

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/coreos/ignition/v2/config/v3_6/types"

	"github.com/kilnproject/kiln/initd/blockdev"
	"github.com/kilnproject/kiln/initd/config"
	"github.com/kilnproject/kiln/internal/poll"
)

// Options say where and how Apply works.
type Options struct {
	// Root is the node's root, where /etc/luks, /etc/crypttab and the units are written.
	Root string
	// Live mounts the filesystems with a path, opens LUKS volumes and turns swap on in
	// the running system (first boot on the node). Without it (tests, a root that is not
	// the running one) only the devices are prepared and the files written.
	Live bool
	// SysDir is where sysfs is mounted; empty means /sys.
	SysDir string
	// BootMounts are the mount points whose disks are never touched; nil means
	// blockdev.BootMounts.
	BootMounts []string
	// Forbidden maps devices the config must not touch (the etcd volume's disk) to why,
	// e.g. "it is the etcd volume node.yaml selects (etcd.volume.byId virtio-etcd)".
	// A device on such a disk is refused too.
	Forbidden map[string]string
	// Settle bounds the wait for a device to appear (a partition after sgdisk, a
	// /dev/disk/by-partlabel link, an array, a mapped LUKS volume); default 30s.
	Settle time.Duration
	// Get fetches an http(s) key file; nil refuses them.
	Get config.Getter
	Log *slog.Logger

	// cheapKDF makes luksFormat use PBKDF2 with a 1 ms iteration time instead of
	// cryptsetup's default (argon2id, about 2 s and 1 GiB of memory per format and
	// open). It is for this package's tests only, which format many small volumes; no
	// config can set it.
	cheapKDF bool
}

// Apply sets up the config's storage section on the node and reports what it changed, one
// line each ("storage.disks[0]: created partition 1 (data) on /dev/vdb"). It stops at the
// first error, which names the JSON path. A filesystem whose mount unit the config writes
// itself (Butane's with_mount_unit) is mounted, and its unit left to the config.
func Apply(ctx context.Context, cfg types.Config, o Options) ([]string, error) {
	st := cfg.Storage
	if o.Root == "" {
		o.Root = "/"
	}
	if o.Settle <= 0 {
		o.Settle = 30 * time.Second
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	a := &applier{o: o, configUnits: map[string]bool{}}
	for _, u := range cfg.Systemd.Units {
		a.configUnits[u.Name] = true
	}
	steps := []func(context.Context, types.Storage) error{a.disks, a.raids, a.luksVolumes, a.filesystems}
	for _, step := range steps {
		if err := step(ctx, st); err != nil {
			return a.changed, err
		}
	}
	return a.changed, nil
}

// applier is one Apply run.
type applier struct {
	o       Options
	changed []string
	// configUnits are the units the config writes itself.
	configUnits map[string]bool
}

func (a *applier) note(field, format string, args ...any) {
	msg := field + ": " + fmt.Sprintf(format, args...)
	a.changed = append(a.changed, msg)
	a.o.Log.Info("storage", "change", msg)
}

func fieldErr(field string, format string, args ...any) error {
	return &config.FieldError{Path: field, Err: fmt.Errorf(format, args...)}
}

// device waits (bounded) until dev exists, then resolves its links to the device node
// and refuses it when it is on the boot disk or a forbidden disk. It does not mind a
// device in use: see writable.
func (a *applier) device(ctx context.Context, field, dev string) (string, error) {
	var real string
	err := poll.Until(ctx, poll.Options{What: dev + " to appear", Timeout: a.o.Settle,
		Backoff: poll.Constant(100 * time.Millisecond), Retryable: func(error) bool { return false }},
		func(context.Context) (bool, error) {
			r, err := filepath.EvalSymlinks(dev)
			if errors.Is(err, fs.ErrNotExist) {
				return false, nil
			}
			real = r
			return err == nil, err
		})
	if err != nil {
		return "", fieldErr(field, "%s did not appear within %s (%v)", dev, a.o.Settle, err)
	}
	why, err := blockdev.OnBootDisk(a.o.SysDir, real, a.o.BootMounts)
	if err != nil {
		return "", fieldErr(field, "%s: %w", dev, err)
	}
	if why != "" {
		return "", fieldErr(field, "%s %s; kiln never touches the boot disk", describeDev(dev, real), why)
	}
	for f, reason := range a.o.Forbidden {
		if d := blockdev.SharedDisk(a.o.SysDir, real, f); d != "" {
			return "", fieldErr(field, "%s is on %s (disk %s), which %s; the config's storage may not touch it", describeDev(dev, real), f, d, reason)
		}
	}
	return real, nil
}

// writable refuses a device that is in use: mounted, swapped on, held by device-mapper or
// RAID (or, for a disk, one of its partitions is). Call it before anything that writes to
// the device.
func (a *applier) writable(field, dev, real string) error {
	why, err := blockdev.DeviceUse(a.o.SysDir, real, "", a.o.BootMounts)
	if err != nil {
		return fieldErr(field, "%s: %w", dev, err)
	}
	if why != "" {
		return fieldErr(field, "%s %s; refusing to change it", describeDev(dev, real), why)
	}
	return nil
}

func describeDev(dev, real string) string {
	if dev == real {
		return dev
	}
	return fmt.Sprintf("%s (%s)", dev, real)
}

// run runs a tool; see blockdev.RunTool.
func run(ctx context.Context, name string, args ...string) ([]byte, error) {
	return blockdev.RunTool(ctx, name, args...)
}

// settle lets udev finish creating the /dev/disk links of what just changed, when udev
// runs (udevadm is there); without udev it does nothing.
func (a *applier) settle(ctx context.Context) {
	if !a.o.Live {
		return
	}
	if _, err := exec.LookPath("udevadm"); err != nil {
		return
	}
	if out, err := exec.CommandContext(ctx, "udevadm", "settle", "--timeout=30").CombinedOutput(); err != nil {
		a.o.Log.Warn("udevadm settle", "error", err, "output", strings.TrimSpace(string(out)))
	}
}

func deref[T any](p *T) (v T) {
	if p != nil {
		v = *p
	}
	return v
}
