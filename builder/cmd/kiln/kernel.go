package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	diskfs "github.com/diskfs/go-diskfs"
)

// espKernel is where the bake puts the slot-A kernel on the ESP.
const espKernel = "/kiln/a/vmlinuz"

// imageKernel copies the kernel out of an image's ESP into a temp file, for the KVM test boot.
// Non-raw images are read through `qemu-img dd` of the disk's first 300 MiB (GPT + ESP).
func imageKernel(ctx context.Context, image string) (string, func(), error) {
	dir, err := os.MkdirTemp("", "kiln-kernel-")
	if err != nil {
		return "", nil, err
	}
	cleanup := func() { os.RemoveAll(dir) }
	raw := image
	if ext := strings.ToLower(filepath.Ext(image)); ext != ".raw" && ext != ".img" {
		raw = filepath.Join(dir, "head.raw")
		fmtName := map[string]string{".qcow2": "qcow2", ".vmdk": "vmdk", ".vhd": "vpc"}[ext]
		if fmtName == "" {
			cleanup()
			return "", nil, fmt.Errorf("%s: unknown disk format", image)
		}
		out, err := exec.CommandContext(ctx, "qemu-img", "dd", "-f", fmtName, "-O", "raw", "bs=1M", "count=300",
			"if="+image, "of="+raw).CombinedOutput()
		if err != nil {
			cleanup()
			return "", nil, fmt.Errorf("qemu-img dd %s: %v: %s", image, err, strings.TrimSpace(string(out)))
		}
	}
	d, err := diskfs.Open(raw, diskfs.WithOpenMode(diskfs.ReadOnly))
	if err != nil {
		cleanup()
		return "", nil, fmt.Errorf("open %s: %w", image, err)
	}
	defer d.Close()
	fs, err := d.GetFilesystem(1)
	if err != nil {
		cleanup()
		return "", nil, fmt.Errorf("%s: ESP: %w", image, err)
	}
	f, err := fs.OpenFile(espKernel, os.O_RDONLY)
	if err != nil {
		cleanup()
		return "", nil, fmt.Errorf("%s: ESP %s: %w", image, espKernel, err)
	}
	dst := filepath.Join(dir, "vmlinuz")
	out, err := os.Create(dst)
	if err == nil {
		_, err = io.Copy(out, f)
		if cerr := out.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		cleanup()
		return "", nil, err
	}
	return dst, cleanup, nil
}
