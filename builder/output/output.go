// Package output turns the raw disk a bake writes into the formats users upload or boot:
// qcow2, vmdk (streamOptimized, for vSphere and AMI import), vhd (fixed, for Azure/Hyper-V) and
// GCE's disk.raw in a gzip'd oldgnu tar. Conversions use qemu-img and GNU tar, which keep the
// image sparse.
package output

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Formats are the names a definition may list, with their file suffix.
var Formats = map[string]string{
	"raw":   ".raw",
	"qcow2": ".qcow2",
	"vmdk":  ".vmdk",
	"vhd":   ".vhd",
	"gce":   ".tar.gz",
}

// Convert writes raw as format to dst. dst is replaced only when the conversion succeeds.
func Convert(ctx context.Context, raw, format, dst string) error {
	tmp := dst + ".part"
	defer os.Remove(tmp)
	var cmd *exec.Cmd
	switch format {
	case "raw":
		return fmt.Errorf("raw is the bake's own output, not a conversion")
	case "qcow2":
		cmd = exec.CommandContext(ctx, "qemu-img", "convert", "-q", "-f", "raw", "-O", "qcow2", "-o", "compat=1.1", raw, tmp)
	case "vmdk":
		cmd = exec.CommandContext(ctx, "qemu-img", "convert", "-q", "-f", "raw", "-O", "vmdk", "-o", "subformat=streamOptimized", raw, tmp)
	case "vhd":
		cmd = exec.CommandContext(ctx, "qemu-img", "convert", "-q", "-f", "raw", "-O", "vpc", "-o", "subformat=fixed,force_size=on", raw, tmp)
	case "gce":
		// GCE wants a file named disk.raw in an oldgnu tar, gzip'd; -S keeps it sparse.
		dir, err := os.MkdirTemp(filepath.Dir(dst), ".gce-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		if err := os.Link(raw, filepath.Join(dir, "disk.raw")); err != nil {
			return fmt.Errorf("gce: %w", err)
		}
		cmd = exec.CommandContext(ctx, "tar", "--format=oldgnu", "-S", "-czf", tmp, "-C", dir, "disk.raw")
	default:
		return fmt.Errorf("unknown output format %q", format)
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("convert to %s: %s: %v: %s", format, strings.Join(cmd.Args, " "), err, strings.TrimSpace(string(out)))
	}
	return os.Rename(tmp, dst)
}
