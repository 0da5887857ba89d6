package storage

import (
	"context"
	"fmt"
	"path"
	"path/filepath"
	"strings"

	"github.com/coreos/ignition/v2/config/v3_6/types"

	"github.com/kilnproject/kiln/initd/blockdev"
)

// filesystems makes each storage.filesystems entry, by Ignition's reuse rules:
//
//   - a blank device is formatted (mkfs.ext4, mkfs.xfs, mkfs.vfat, mkswap) with the label,
//     UUID and options given;
//   - a filesystem of the wanted format whose label and UUID (those given) match is kept;
//   - anything else is refused, naming what the device holds, unless wipeFilesystem, which
//     erases it (wipefs -a) and formats. What kiln formatted for this entry in an earlier
//     run (recorded in /var/lib/kiln/storage.json) is kept even with wipeFilesystem.
//
// A filesystem with a path gets a mount unit (/etc/systemd/system/<path>.mount, What= its
// /dev/disk/by-uuid name, wanted by local-fs.target and before containerd and kubelet),
// unless the config writes that unit itself (Butane's with_mount_unit),
// and with Options.Live it is mounted now, so that the config's files may be written onto
// it. A swap area gets a swap unit and, with Options.Live, is turned on.
func (a *applier) filesystems(ctx context.Context, st types.Storage) error {
	for i, f := range st.Filesystems {
		if err := a.filesystem(ctx, fmt.Sprintf("storage.filesystems[%d]", i), f); err != nil {
			return err
		}
	}
	return nil
}

// filesystem makes the storage.filesystems entry f at field (see filesystems).
func (a *applier) filesystem(ctx context.Context, field string, f types.Filesystem) error {
	real, err := a.device(ctx, field+".device", f.Device)
	if err != nil {
		return err
	}
	format, label, uuid := deref(f.Format), deref(f.Label), deref(f.UUID)
	if format == "vfat" && uuid != "" && !strings.Contains(uuid, "-") {
		uuid = uuid[:4] + "-" + uuid[4:] // blkid shows FAT volume ids as XXXX-XXXX
	}
	sig, err := a.ensureFilesystem(ctx, field, f, real, format, label, uuid)
	if err != nil {
		return err
	}
	what := blockdev.ByUUIDPath(sig.UUID)
	if format == "swap" {
		return a.swap(ctx, field, what, real)
	}
	return a.mountFilesystem(ctx, field, f, real, what, format)
}

// ensureFilesystem keeps the filesystem on real when it is the one wanted (format, label,
// uuid) or kiln formatted it for this entry, and formats real otherwise, refusing to erase
// anything but a blank device unless wipeFilesystem; it returns what real holds then.
func (a *applier) ensureFilesystem(ctx context.Context, field string, f types.Filesystem, real, format, label, uuid string) (blockdev.Signature, error) {
	sig, err := blockdev.Probe(ctx, real)
	if err != nil {
		return sig, fieldErr(field+".device", "%s: %w", f.Device, err)
	}
	mismatch := filesystemMismatch(sig, format, label, uuid)
	if mismatch != "" && !deref(f.WipeFilesystem) {
		return sig, fieldErr(field+".device", "%s %s; refusing to format it (wipeFilesystem: true erases it)", describeDev(f.Device, real), mismatch)
	}
	st, err := loadState(a.o.Root)
	if err != nil {
		return sig, fieldErr(field, "%w", err)
	}
	stateKey := "filesystem " + f.Device
	ours := !sig.Blank && mismatch == "" && st.Made[stateKey] == strings.ToLower(sig.UUID)
	if reformat := sig.Blank || mismatch != "" || deref(f.WipeFilesystem) && !ours; !reformat {
		return sig, nil
	}
	was := sig
	if sig, err = a.formatFilesystem(ctx, field, f, real, mkfsArgs(format, label, uuid), was.Blank); err != nil {
		return sig, err
	}
	st.Made[stateKey] = strings.ToLower(sig.UUID)
	if err := st.save(a.o.Root); err != nil {
		return sig, fieldErr(field, "%w", err)
	}
	if was.Blank {
		a.note(field, "formatted %s as %s (UUID %s)", f.Device, format, sig.UUID)
	} else {
		a.note(field, "erased %s (it held %s) and formatted it as %s (UUID %s)", f.Device, was, format, sig.UUID)
	}
	return sig, nil
}

// filesystemMismatch says how what the device holds (sig) is not the filesystem wanted
// (format, label, uuid), or is "" when it is (or the device is blank).
func filesystemMismatch(sig blockdev.Signature, format, label, uuid string) string {
	switch {
	case sig.Blank:
	case sig.Type != format:
		return fmt.Sprintf("holds %s, not %s", sig, format)
	case label != "" && sig.Label != label:
		return fmt.Sprintf("holds %s, not labelled %q", sig, label)
	case uuid != "" && !strings.EqualFold(sig.UUID, uuid):
		return fmt.Sprintf("holds %s, not UUID %s", sig, uuid)
	}
	return ""
}

// formatFilesystem erases real (unless blank) and makes the entry's filesystem on it with
// the mkfs command args and the entry's options; it returns what real holds then.
func (a *applier) formatFilesystem(ctx context.Context, field string, f types.Filesystem, real string, args []string, blank bool) (blockdev.Signature, error) {
	if err := a.writable(field+".device", f.Device, real); err != nil {
		return blockdev.Signature{}, err
	}
	if !blank {
		if _, err := run(ctx, "wipefs", "-a", "--", real); err != nil {
			return blockdev.Signature{}, fieldErr(field+".wipeFilesystem", "%w", err)
		}
	}
	for _, o := range f.Options {
		args = append(args, string(o))
	}
	if _, err := run(ctx, args[0], append(args[1:], "--", real)...); err != nil {
		return blockdev.Signature{}, fieldErr(field, "format %s: %w", f.Device, err)
	}
	sig, err := blockdev.Probe(ctx, real)
	if err != nil || sig.Type != deref(f.Format) {
		return sig, fieldErr(field, "after %s, blkid finds %s on %s (%v)", args[0], sig, f.Device, err)
	}
	return sig, nil
}

// mountFilesystem writes the mount unit of the filesystem on real (what: its
// /dev/disk/by-uuid name) when the entry has a path, unless the config writes that unit
// itself, and with Options.Live mounts it now.
func (a *applier) mountFilesystem(ctx context.Context, field string, f types.Filesystem, real, what, format string) error {
	where := deref(f.Path)
	if where == "" {
		return nil
	}
	where = path.Clean(where)
	var opts []string
	for _, o := range f.MountOptions {
		opts = append(opts, string(o))
	}
	name, err := blockdev.UnitName(where, "mount")
	if err != nil {
		return fieldErr(field+".path", "%w", err)
	}
	options := strings.Join(opts, ",")
	if options == "" {
		options = "defaults"
	}
	unit := mountUnit(field, what, where, format, options)
	if !a.configUnits[name] {
		changed, err := blockdev.WriteUnit(a.o.Root, name, unit)
		if err != nil {
			return fieldErr(field+".path", "mount unit %s: %w", name, err)
		}
		if changed {
			a.note(field, "%s mounts %s on %s at boot", name, f.Device, where)
		}
	}
	if !a.o.Live {
		return nil
	}
	if err := blockdev.MountOptions(ctx, real, filepath.Join(a.o.Root, where), format, strings.Join(opts, ",")); err != nil {
		return fieldErr(field+".path", "%w", err)
	}
	return nil
}

// mkfsArgs is the command making a format filesystem with label and uuid (when set).
func mkfsArgs(format, label, uuid string) []string {
	var args []string
	switch format {
	case "ext4":
		args = []string{"mkfs.ext4", "-q", "-F"}
		if label != "" {
			args = append(args, "-L", label)
		}
		if uuid != "" {
			args = append(args, "-U", uuid)
		}
	case "xfs":
		args = []string{"mkfs.xfs", "-q", "-f"}
		if label != "" {
			args = append(args, "-L", label)
		}
		if uuid != "" {
			args = append(args, "-m", "uuid="+uuid)
		}
	case "vfat":
		args = []string{"mkfs.vfat"}
		if label != "" {
			args = append(args, "-n", label)
		}
		if uuid != "" {
			args = append(args, "-i", strings.ReplaceAll(uuid, "-", ""))
		}
	case "swap":
		args = []string{"mkswap"}
		if label != "" {
			args = append(args, "-L", label)
		}
		if uuid != "" {
			args = append(args, "-U", uuid)
		}
	}
	return args
}

// swap writes the swap unit of the area what (a /dev/disk/by-uuid name) and, with
// Options.Live, turns it on.
func (a *applier) swap(ctx context.Context, field, what, real string) error {
	name, err := blockdev.UnitName(what, "swap")
	if err != nil {
		return fieldErr(field, "%w", err)
	}
	unit := swapUnit(field, what)
	changed, err := blockdev.WriteUnit(a.o.Root, name, unit)
	if err != nil {
		return fieldErr(field, "swap unit %s: %w", name, err)
	}
	if changed {
		a.note(field, "%s turns swap on at boot", name)
	}
	if !a.o.Live {
		return nil
	}
	if on, _ := blockdev.SwapOn(real); on {
		return nil
	}
	if _, err := run(ctx, "swapon", "--", real); err != nil {
		return fieldErr(field, "%w", err)
	}
	a.note(field, "turned swap on (%s)", real)
	return nil
}

// mountUnit is the mount unit of the filesystem of config entry field: what (its
// /dev/disk/by-uuid name) on where, of type format, with mount options.
func mountUnit(field, what, where, format, options string) []byte {
	return fmt.Appendf(nil, `# Written by kiln-init from the node config's %[1]s.
[Unit]
Description=%[2]s on %[3]s
Before=local-fs.target containerd.service kubelet.service

[Mount]
What=%[2]s
Where=%[3]s
Type=%[4]s
Options=%[5]s

[Install]
WantedBy=local-fs.target
`, field, what, where, format, options)
}

// swapUnit is the swap unit of the swap area of config entry field, what.
func swapUnit(field, what string) []byte {
	return fmt.Appendf(nil, `# Written by kiln-init from the node config's %[1]s.
[Unit]
Description=swap on %[2]s

[Swap]
What=%[2]s

[Install]
WantedBy=swap.target
`, field, what)
}
