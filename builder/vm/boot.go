package vm

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	diskfs "github.com/diskfs/go-diskfs"
	"github.com/diskfs/go-diskfs/filesystem"

	"github.com/kilnproject/kiln/internal/atomicfile"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

// BootFiles are an image's own kernel, initramfs and kernel command line, copied out of its ESP.
// They serve the KVM test boot and direct kernel boots that add kernel arguments (--append).
type BootFiles struct {
	Kernel, Initrd string // host paths in the directory given to ExtractBoot
	Cmdline        string // the loader entry's options line
}

// ExtractBoot copies slot A's boot files out of image into dir. Non-raw images are read through
// `qemu-img dd` of the disk's first 300 MiB (the GPT and the ESP).
func ExtractBoot(ctx context.Context, image, dir string) (*BootFiles, error) {
	raw := image
	if ext := strings.ToLower(filepath.Ext(image)); ext != ".raw" && ext != ".img" {
		format, err := imageFormat(image)
		if err != nil {
			return nil, err
		}
		raw = filepath.Join(dir, "head.raw")
		defer os.Remove(raw)
		out, err := exec.CommandContext(ctx, "qemu-img", "dd", "-f", format, "-O", "raw", "bs=1M", "count=300",
			"if="+image, "of="+raw).CombinedOutput()
		if err != nil {
			return nil, fmt.Errorf("qemu-img dd %s: %v: %s", image, err, strings.TrimSpace(string(out)))
		}
	}
	d, err := diskfs.Open(raw, diskfs.WithOpenMode(diskfs.ReadOnly))
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", image, err)
	}
	defer d.Close()
	fs, err := d.GetFilesystem(1)
	if err != nil {
		return nil, fmt.Errorf("%s: ESP: %w", image, err)
	}
	bf := &BootFiles{Kernel: filepath.Join(dir, "vmlinuz"), Initrd: filepath.Join(dir, "initrd.img")}
	if err := copyOut(fs, nodeimage.KernelPath, bf.Kernel); err != nil {
		return nil, fmt.Errorf("%s: %w", image, err)
	}
	if err := copyOut(fs, nodeimage.InitrdPath, bf.Initrd); err != nil {
		return nil, fmt.Errorf("%s: %w", image, err)
	}
	entry := filepath.Join(dir, "entry.conf")
	if err := copyOut(fs, nodeimage.LoaderEntryPath, entry); err != nil {
		return nil, fmt.Errorf("%s: %w", image, err)
	}
	text, err := os.ReadFile(entry)
	if err != nil {
		return nil, err
	}
	for _, line := range strings.Split(string(text), "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), " "); ok && k == "options" {
			bf.Cmdline = strings.TrimSpace(v)
		}
	}
	if bf.Cmdline == "" {
		return nil, fmt.Errorf("%s: ESP %s has no options line", image, nodeimage.LoaderEntryPath)
	}
	return bf, nil
}

func copyOut(fs filesystem.FileSystem, name, dst string) error {
	f, err := fs.OpenFile(name, os.O_RDONLY)
	if err != nil {
		return fmt.Errorf("ESP %s: %w", name, err)
	}
	out, err := atomicfile.Create(filepath.Dir(dst), atomicfile.Options{Mode: 0o644})
	if err != nil {
		return err
	}
	defer out.Close()
	if _, err := io.Copy(out, f); err != nil {
		return fmt.Errorf("ESP %s: %w", name, err)
	}
	return out.Commit(filepath.Base(dst))
}
