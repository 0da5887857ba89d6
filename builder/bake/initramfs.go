package bake

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/kilnproject/kiln/builder/initramfs"
	"github.com/kilnproject/kiln/builder/rootfs"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

// defaultModules are the kernel modules every initramfs carries: enough to find the root on
// virtio, SCSI or NVMe disks, to mount squashfs/erofs, ext4 and the /etc overlay, and loop for
// the root image a live boot fetches into RAM (the same initramfs boots disks and networks),
// dm_verity, through which stage 1 mounts the root, efivarfs, where it reads whether an
// update's slot is on trial, and virtio_rng: a network boot's DHCP client draws random
// transaction ids, and without RDRAND (QEMU TCG's CPU) the kernel's pool never fills in the
// initramfs, so getrandom blocks the first request for good. What they need comes with them,
// soft dependencies included (crc32c for libcrc32c, ext4 and jbd2).
var defaultModules = []string{
	"virtio_pci", "virtio_blk", "virtio_scsi", "sd_mod", "nvme",
	"squashfs", "erofs", "ext4", "overlay", "loop", "virtio_rng", "dm_verity", "efivarfs",
}

// isoModules are the modules a live boot from the iso output needs to find and read its medium:
// the SCSI CD driver (a CD on virtio-scsi) and ISO 9660. linux-image-cloud-amd64 has neither
// ahci nor USB, so a SATA CD drive, a BMC's virtual media or a USB stick needs the generic
// kernel and ahci or xhci_pci and usb_storage in the definition's modules.
func (b *baker) isoModules() []string {
	if !slices.Contains(b.def.Formats, "iso") {
		return nil
	}
	return []string{"sr_mod", "isofs"}
}

// writeInitramfs writes the initramfs to the work directory: kiln-stage1 as its init and the
// tree's modules for md's kernel, the default ones and the definition's, compressed or, when
// the cache holds the same archive, copied from the cache's initramfs/. It returns its path
// and records its digest and modules in md.
func (b *baker) writeInitramfs(tree *rootfs.Tree, md *nodeimage.Metadata) (string, error) {
	t := time.Now()
	dst := filepath.Join(b.work, "initrd.img")
	f, err := os.Create(dst)
	if err != nil {
		return "", err
	}
	spec := initramfs.Spec{
		Root: tree.Dir, KernelVersion: md.Kernel.Version, Init: b.o.Stage1,
		Modules: slices.Concat(defaultModules, b.isoModules(), b.def.Kernel.Modules),
	}
	// Compressing is most of the work; the archive of the same kiln-stage1 and modules is
	// taken from the cache.
	spec.CacheDir = filepath.Join(b.o.Cache.Root, initramfsDir)
	if b.o.CacheRepo != nil {
		spec.Shared = b.o.CacheRepo.Entries(initramfsDir)
	}
	man, err := initramfs.Write(f, spec)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", fmt.Errorf("initramfs: %w", err)
	}
	md.Initramfs = &nodeimage.InitramfsDigest{SHA256: fileSHA256(dst), Size: fileSize(dst), Modules: man.Modules}
	b.step("initramfs written", t)
	return dst, nil
}
