package bake

import (
	"fmt"
	"path/filepath"
	"time"

	"github.com/kilnproject/kiln/builder/disk"
	"github.com/kilnproject/kiln/builder/rootfs"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

// bootFiles are the ESP's copies of the base's kernel and systemd-boot, in the work directory.
type bootFiles struct {
	kernel, bootloader string
}

// openBase opens the base image by its pinned digest and flattens it into the root tree. The
// kernel and systemd-boot are copied out for the ESP: the root tree may shadow them later. They
// are read through the tree (a symlink leading out of it is an error) and must fit the ESP. It
// records the base and the kernel in md.
func (b *baker) openBase(md *nodeimage.Metadata) (*rootfs.Tree, bootFiles, error) {
	t := time.Now()
	def := b.def
	src := rootfs.Source{Layout: def.Base.Layout, Image: def.Base.Image, Tarball: def.Base.Tarball, Digest: b.lock.BaseDigest(def.Base)}
	md.Base = nodeimage.BaseInfo{Ref: def.Base.Ref, Digest: src.Digest}
	img, err := rootfs.OpenBase(b.ctx, src, b.o.ImageFetch.Remote...)
	if err != nil {
		return nil, bootFiles{}, err
	}
	tree, err := rootfs.FlattenWith(img, filepath.Join(b.work, "tree"), rootfs.FlattenOptions{Cache: b.o.Cache})
	if err != nil {
		return nil, bootFiles{}, fmt.Errorf("base %s: %w", src, err)
	}
	b.step("base flattened", t)

	kernel, err := tree.FindKernel()
	if err != nil {
		return nil, bootFiles{}, fmt.Errorf("base %s: %w", src, err)
	}
	bootloader, err := tree.SystemdBoot()
	if err != nil {
		return nil, bootFiles{}, fmt.Errorf("base %s: %w", src, err)
	}
	espSize := def.Disk.ESPSize.Bytes()
	if espSize == 0 {
		espSize = disk.ESPSize
	}
	boot := bootFiles{kernel: filepath.Join(b.work, "vmlinuz"), bootloader: filepath.Join(b.work, "systemd-bootx64.efi")}
	if err := tree.CopyOut("kernel", kernel.Image, boot.kernel, espSize); err != nil {
		return nil, bootFiles{}, fmt.Errorf("base %s: %w", src, err)
	}
	if err := tree.CopyOut("systemd-boot", bootloader, boot.bootloader, espSize); err != nil {
		return nil, bootFiles{}, fmt.Errorf("base %s: %w", src, err)
	}
	md.Kernel = nodeimage.KernelInfo{Version: kernel.Version, SHA256: fileSHA256(boot.kernel)}
	return tree, boot, nil
}
