// Package output turns the raw disk a bake writes into the formats users upload or boot:
// qcow2, vmdk (streamOptimized, for vSphere and AMI import), vhd (fixed, for Azure/Hyper-V) and
// GCE's disk.raw in a gzip'd oldgnu tar. Conversions use qemu-img and GNU tar, which keep the
// image sparse. The pxe format is no conversion: WritePXE writes a directory of the kernel,
// initramfs and root filesystem image a network boot fetches, and CheckPXE checks one. Nor is
// iso: WriteISO writes a hybrid ISO 9660 image that boots the same files live from a CD or USB
// stick.
//
// A new format is one entry in the formats table: its name (what a definition lists), the
// suffix of its file and the command that writes it.
package output

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/kilnproject/kiln/internal/nodeimage"
)

// A Format is one kind of file a bake can write.
type Format struct {
	Name   string // what an image definition lists under formats
	Suffix string // the output file's suffix, after <image>-<role>
	// command returns the command that writes raw as this format to tmp, and what to remove
	// once it has run. Nil for raw, which is the bake's own output.
	command func(ctx context.Context, raw, tmp string) (*exec.Cmd, func(), error)
	// Dir is set for an output that is a directory (pxe), written by WritePXE from the bake's
	// kernel, initramfs and root filesystem rather than converted from the raw disk.
	Dir bool
	// Live is set for the iso output, written by WriteISO from the same files.
	Live bool
}

// formats lists every format, raw first.
var formats = []Format{
	{Name: "raw", Suffix: ".raw"},
	{Name: "qcow2", Suffix: ".qcow2", command: qemuImg("qcow2", "compat=1.1")},
	{Name: "vmdk", Suffix: ".vmdk", command: qemuImg("vmdk", "subformat=streamOptimized")},
	{Name: "vhd", Suffix: ".vhd", command: qemuImg("vpc", "subformat=fixed,force_size=on")},
	{Name: "gce", Suffix: ".tar.gz", command: gceTar},
	{Name: "pxe", Suffix: nodeimage.PXEDirSuffix, Dir: true},
	{Name: "iso", Suffix: nodeimage.ISOSuffix, Live: true},
}

// Names lists the formats a definition may name, raw first.
func Names() []string {
	names := make([]string, len(formats))
	for i, f := range formats {
		names[i] = f.Name
	}
	return names
}

// Lookup returns the format called name.
func Lookup(name string) (Format, error) {
	for _, f := range formats {
		if f.Name == name {
			return f, nil
		}
	}
	return Format{}, fmt.Errorf("unknown output format %q (one of: %s)", name, strings.Join(Names(), ", "))
}

// OfFile names the format of an output file by its suffix, or "" for none.
func OfFile(file string) string {
	for _, f := range formats {
		if strings.HasSuffix(file, f.Suffix) {
			return f.Name
		}
	}
	return ""
}

// Convert writes raw as format to dst. dst is replaced only when the conversion succeeds.
func Convert(ctx context.Context, raw, format, dst string) error {
	f, err := Lookup(format)
	if err != nil {
		return err
	}
	if f.Dir {
		return fmt.Errorf("%s is a directory written by WritePXE from the kernel, initramfs and root filesystem, not a conversion of the raw disk", format)
	}
	if f.Live {
		return fmt.Errorf("%s is written by WriteISO from the kernel, initramfs and root filesystem, not a conversion of the raw disk", format)
	}
	if f.command == nil {
		return fmt.Errorf("%s is the bake's own output, not a conversion", format)
	}
	tmp := dst + ".part"
	defer os.Remove(tmp)
	cmd, cleanup, err := f.command(ctx, raw, tmp)
	if err != nil {
		return fmt.Errorf("convert to %s: %w", format, err)
	}
	defer cleanup()
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("convert to %s: %s: %v: %s", format, strings.Join(cmd.Args, " "), err, strings.TrimSpace(string(out)))
	}
	return os.Rename(tmp, dst)
}

// qemuImg converts with qemu-img to its format fmt with the creation options opts.
func qemuImg(format, opts string) func(context.Context, string, string) (*exec.Cmd, func(), error) {
	return func(ctx context.Context, raw, tmp string) (*exec.Cmd, func(), error) {
		cmd := exec.CommandContext(ctx, "qemu-img", "convert", "-q", "-f", "raw", "-O", format, "-o", opts, raw, tmp)
		return cmd, func() {}, nil
	}
}

// GCESizeMultiple is what GCE requires disk.raw's size to be a multiple of.
const GCESizeMultiple = 1 << 30

// gceTar writes GCE's image file: a file named disk.raw in an oldgnu tar, gzip'd; -S keeps it
// sparse. The raw disk is hard-linked under that name, not copied. GCE refuses a disk.raw that
// is not a whole number of GiB, so such a disk is refused here.
func gceTar(ctx context.Context, raw, tmp string) (*exec.Cmd, func(), error) {
	fi, err := os.Stat(raw)
	if err != nil {
		return nil, nil, err
	}
	if fi.Size()%GCESizeMultiple != 0 {
		return nil, nil, fmt.Errorf("%s is %d bytes, not a whole number of GiB as GCE requires of disk.raw", raw, fi.Size())
	}
	dir, err := os.MkdirTemp(filepath.Dir(tmp), ".gce-")
	if err != nil {
		return nil, nil, err
	}
	cleanup := func() { os.RemoveAll(dir) }
	if err := os.Link(raw, filepath.Join(dir, "disk.raw")); err != nil {
		cleanup()
		return nil, nil, err
	}
	return exec.CommandContext(ctx, "tar", "--format=oldgnu", "-S", "-czf", tmp, "-C", dir, "disk.raw"), cleanup, nil
}
