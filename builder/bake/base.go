package bake

import (
	"fmt"
	"path/filepath"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/opencontainers/go-digest"
	"github.com/opencontainers/image-spec/identity"

	"github.com/kilnproject/kiln/builder/disk"
	"github.com/kilnproject/kiln/builder/output"
	"github.com/kilnproject/kiln/builder/rootfs"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

// bootFiles are the ESP's copies of the base's kernel and systemd-boot, in the work directory.
type bootFiles struct {
	kernel, bootloader string
}

// openBase opens the base image by its pinned digest and flattens it into the root tree (or
// links it from the cache of flattened bases). The
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
	tree, cached, err := b.flattenBase(img, filepath.Join(b.work, "tree"))
	if err != nil {
		return nil, bootFiles{}, fmt.Errorf("base %s: %w", src, err)
	}
	// tree: the flattened base in the cache, which later bakes link (empty when not kept).
	if cached {
		b.step("base tree linked from the cache", t, "tree", b.baseTree)
	} else {
		b.step("base flattened", t, "tree", b.baseTree)
	}

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
	sum, _, err := output.HashFile(boot.kernel)
	if err != nil {
		return nil, bootFiles{}, fmt.Errorf("base %s: kernel: %w", src, err)
	}
	md.Kernel = nodeimage.KernelInfo{Version: kernel.Version, SHA256: sum}
	return tree, boot, nil
}

// flattenBase applies the base's layers into dir, each one's uncompressed bytes checked against
// the config's diff IDs, and keeps the applied tree in the cache's base-trees/ by chain ID; a
// later bake of the same base links it from there (it reports cached). This is safe because
// every later write to the tree replaces an entry (a new file, link or directory) rather than
// writing a linked file in place, and the cache checks each tree's listing before reuse.
func (b *baker) flattenBase(img v1.Image, dir string) (tree *rootfs.Tree, cached bool, err error) {
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, false, fmt.Errorf("config: %w", err)
	}
	diffIDs := make([]digest.Digest, len(cf.RootFS.DiffIDs))
	for i, d := range cf.RootFS.DiffIDs {
		diffIDs[i] = digest.Digest(d.String())
	}
	cache := rootfs.TreeCache{Dir: filepath.Join(b.o.Cache.Root, baseTreesDir), Shared: b.shared(baseTreesDir)}
	key := identity.ChainID(diffIDs).Encoded()
	b.baseCache, b.baseKey = cache, key
	if tree, ok, err := cache.Load(key, dir); err != nil || ok {
		if ok {
			b.baseTree, err = cache.TreeDir(key)
		}
		return tree, ok, err
	}
	tree, err = rootfs.FlattenWith(img, dir, rootfs.FlattenOptions{Cache: b.o.Cache, DiffIDs: cf.RootFS.DiffIDs})
	if err != nil {
		return nil, false, err
	}
	if err := cache.Store(key, tree); err != nil {
		b.log.Warn("flattened base not cached: the next bake flattens it again", "err", err)
	} else if b.baseTree, err = cache.TreeDir(key); err != nil {
		return nil, false, err
	}
	return tree, false, nil
}

// shared is the cache repository's entries of kind for a TreeCache, or nil without one.
func (b *baker) shared(kind string) rootfs.Shared {
	if b.o.CacheRepo == nil {
		return nil
	}
	return b.o.CacheRepo.Entries(kind)
}
