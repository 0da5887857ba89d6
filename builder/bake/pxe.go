package bake

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/kilnproject/kiln/builder/disk"
	"github.com/kilnproject/kiln/builder/output"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

// writePXE writes the pxe directory <stem>-pxe to the work directory when the definition lists
// the pxe format: the kernel and initramfs that went on the ESP, the root filesystem image that
// went into root-a, and boot.ipxe. The kernel arguments are the disk's without root= and
// rootfstype=. It records the files in md and returns the directory, "" without pxe.
func (b *baker) writePXE(rootImg string, boot bootFiles, initrd string, md *nodeimage.Metadata) (string, error) {
	if !slices.Contains(b.def.Formats, "pxe") {
		return "", nil
	}
	t := time.Now()
	dir := filepath.Join(b.work, b.stem+nodeimage.PXEDirSuffix)
	info, err := output.WritePXE(dir, output.PXESource{
		Kernel: boot.kernel, Initrd: initrd, RootFS: rootImg,
		KernelArgs: disk.BootArgs(b.def.Platform, b.kernelArgs(md)),
		Title:      fmt.Sprintf("%s %s (%s)", b.def.Name, b.prof.Role, md.Kernel.Version),
	})
	if err != nil {
		return "", err
	}
	md.PXE = info
	b.step("pxe written", t)
	return dir, nil
}

// writeISO writes <stem>.iso to the work directory when the definition lists the iso format:
// the root filesystem image writePXE takes and a boot image holding systemd-boot, the kernel,
// the initramfs and a loader entry that boots them live from the medium, in a hybrid ISO 9660
// image. With iso.install it also holds raw, the finished disk image, zstd-compressed, and the
// boot image's default entry installs it to a disk (the live entry is the other one). It
// returns the file, "" without iso.
func (b *baker) writeISO(raw, rootImg string, boot bootFiles, initrd string, md *nodeimage.Metadata) (string, error) {
	if !slices.Contains(b.def.Formats, "iso") {
		return "", nil
	}
	t := time.Now()
	sum, _, err := output.HashFile(rootImg)
	if err != nil {
		return "", fmt.Errorf("iso: %w", err)
	}
	args := disk.BootArgs(b.def.Platform, b.kernelArgs(md))
	live := disk.BootImage{
		Kernel: boot.kernel, Initrd: initrd, Bootloader: boot.bootloader,
		Cmdline: output.ISOCmdline(args, sum),
		Title:   fmt.Sprintf("kiln %s %s live (%s)", b.def.Name, b.prof.Role, md.Kernel.Version),
	}
	src := output.ISOSource{RootFS: rootImg, Created: b.o.Created}
	bootImg := live
	if b.def.ISO != nil && b.def.ISO.Install != nil {
		in := b.def.ISO.Install
		src.Disk = filepath.Join(b.work, "iso-disk.raw.zst")
		defer os.Remove(src.Disk)
		ct := time.Now()
		diskSum, err := output.CompressDisk(b.ctx, raw, src.Disk)
		if err != nil {
			return "", fmt.Errorf("iso: %w", err)
		}
		b.step("iso disk image compressed", ct, "file", nodeimage.ISODiskPath)
		bootImg.Cmdline = output.ISOInstallCmdline(args, diskSum, in.Dev, in.Wipe)
		bootImg.Title = fmt.Sprintf("kiln %s %s install to %s (%s)", b.def.Name, b.prof.Role, in.Dev, md.Kernel.Version)
		bootImg.More = []disk.BootEntry{{Name: nodeimage.ISOLiveEntryName, Title: live.Title, Cmdline: live.Cmdline}}
	}
	src.BootImage = filepath.Join(b.work, "iso-efi.img")
	defer os.Remove(src.BootImage)
	if err := disk.WriteBootImage(src.BootImage, bootImg); err != nil {
		return "", fmt.Errorf("iso: %w", err)
	}
	dst := filepath.Join(b.work, b.stem+nodeimage.ISOSuffix)
	if err := output.WriteISO(b.ctx, dst, src); err != nil {
		return "", err
	}
	b.step("iso written", t)
	return dst, nil
}
