package bake

import (
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"time"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/kilnproject/kiln/builder/artifact"
	"github.com/kilnproject/kiln/builder/imagestore"
	"github.com/kilnproject/kiln/builder/rootfs"
	"github.com/kilnproject/kiln/builder/spec"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

// layStore lays containerd's store for the pre-pulled images (imagestore): each image's
// layers applied into nodeimage.SnapshotsPath/<chain ID> and recorded, with the images and
// their blobs (symlinks into the layout), in nodeimage.StoreSeedPath, which first boot copies
// to containerd's root. An image whose layers hold what the applied tree cannot reproduce
// (extended attributes such as file capabilities, device nodes) is left out of the store and
// imported at first boot, as is every image with --import-images. The images are recorded in
// the namespace of the profile's runtime: the CRI's for containerd, Docker Engine's for docker
// (whose containerd image store is the node's containerd). infos (the images' records, in images' order) say which is which.
func (b *baker) layStore(tree *rootfs.Tree, k spec.Kubernetes, images []*artifact.CachedImage, infos []nodeimage.ImageInfo) error {
	if len(images) == 0 {
		return nil
	}
	if b.o.ImportImages {
		return markImported(infos, "baked with --import-images")
	}
	runtime, ok := nodeimage.RuntimeOf(k.Runtime)
	if !ok {
		return fmt.Errorf("%s: kubernetes.runtime %s: no containerd namespace known for it", k.Pos, k.Runtime)
	}
	t := time.Now()
	work, err := os.MkdirTemp(b.work, "store-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	store, index, flat, err := b.flattenImages(images, infos, filepath.Join(work, "flat"))
	if err != nil {
		return err
	}
	o := b.storeOptions(work, runtime.Namespace)
	o.KeepLayers = runtime.KeepLayers
	if err := imagestore.Write(b.ctx, o, store); err != nil {
		return fmt.Errorf("containerd store: %w", err)
	}
	if err := adoptStore(tree, o, store, flat); err != nil {
		return err
	}
	for _, i := range index {
		infos[i].Unpacked = true
	}
	b.log.Info("containerd store laid", "images", len(store), "of", len(images), "seconds", time.Since(t).Round(time.Millisecond).Seconds())
	return nil
}

// flattenImages applies each image's layers into a tree below dir, for the store. An image
// whose tree cannot be exact, or whose layers another image has too, is left to the import
// at first boot, its info saying why. It returns the images for the store, the index in
// images of each (store[i] is images[index[i]]), and their trees by chain ID.
func (b *baker) flattenImages(images []*artifact.CachedImage, infos []nodeimage.ImageInfo, dir string) (store []imagestore.Image, index []int, flat map[digest.Digest]*rootfs.Tree, err error) {
	flat = map[digest.Digest]*rootfs.Tree{}
	for i, ci := range images {
		im, sub, err := b.flattenImage(ci, filepath.Join(dir, ci.Manifest.Digest.Hex))
		var inexact *rootfs.InexactError
		if errors.As(err, &inexact) {
			infos[i].ImportReason = err.Error()
			b.log.Warn("image left to the import at first boot", "image", ci.Name, "reason", err)
			continue
		}
		if err != nil {
			return nil, nil, nil, fmt.Errorf("image %s: %w", ci.Name, err)
		}
		if _, dup := flat[im.ChainID()]; dup {
			infos[i].ImportReason = "another image of the profile has the same layers"
			continue
		}
		flat[im.ChainID()] = sub
		store = append(store, im)
		index = append(index, i)
	}
	return store, index, flat, nil
}

// storeOptions are the imagestore options of a store written below work, its images
// recorded in the runtime's namespace.
func (b *baker) storeOptions(work, namespace string) imagestore.Options {
	return imagestore.Options{
		Dir: filepath.Join(work, "store"),
		HostBlob: func(d digest.Digest) string {
			p, _ := b.o.Cache.Has(d.Encoded())
			return p
		},
		NodeBlob: func(d digest.Digest) string {
			return path.Join(nodeimage.ImagesPath, "blobs", d.Algorithm().String(), d.Encoded())
		},
		TreeDest:  func(c digest.Digest) string { return filepath.Join(work, "trees", c.Encoded()) },
		NodeTree:  func(c digest.Digest) string { return path.Join(nodeimage.SnapshotsPath, c.Encoded()) },
		Namespace: namespace,
		Labels:    nodeimage.RuntimeImageLabels(),
		Created:   b.o.Created,
	}
}

// adoptStore puts the store written with o, and the trees of its images (flat, by chain ID),
// into the image's tree, where only root enters them.
func adoptStore(tree *rootfs.Tree, o imagestore.Options, store []imagestore.Image, flat map[digest.Digest]*rootfs.Tree) error {
	for _, im := range store {
		sub := flat[im.ChainID()]
		sub.Dir = o.TreeDest(im.ChainID())
		if err := tree.Adopt(path.Join(nodeimage.SnapshotsPath, im.ChainID().Encoded()), sub); err != nil {
			return fmt.Errorf("image %s: %w", im.Name, err)
		}
	}
	if err := tree.Adopt(nodeimage.StoreSeedPath, &rootfs.Tree{Dir: o.Dir, Owners: map[string]rootfs.Owner{}}); err != nil {
		return fmt.Errorf("containerd store: %w", err)
	}
	// Only root enters, as containerd's own root: the images' trees hold their setuid
	// programs, which must not be reachable by the node's users.
	for _, d := range []string{nodeimage.SnapshotsPath, nodeimage.StoreSeedPath} {
		if len(store) == 0 && d == nodeimage.SnapshotsPath {
			continue
		}
		if err := tree.RestrictDir(d, 0o700); err != nil {
			return err
		}
	}
	return nil
}

// markImported records why every image is left to the import at first boot.
func markImported(infos []nodeimage.ImageInfo, reason string) error {
	for i := range infos {
		infos[i].ImportReason = reason
	}
	return nil
}

// flattenImage applies the cached image's layers into dir, checking each layer's uncompressed
// digest against the config, and describes it for the store. The applied tree is kept in the
// cache's trees/ by chain ID: a rebake links it from there instead of applying the layers again.
func (b *baker) flattenImage(ci *artifact.CachedImage, dir string) (imagestore.Image, *rootfs.Tree, error) {
	img, err := ci.Image(b.o.Cache)
	if err != nil {
		return imagestore.Image{}, nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return imagestore.Image{}, nil, fmt.Errorf("config: %w", err)
	}
	if len(cf.RootFS.DiffIDs) != len(ci.Layers) {
		return imagestore.Image{}, nil, fmt.Errorf("config lists %d diff IDs for %d layers", len(cf.RootFS.DiffIDs), len(ci.Layers))
	}
	im := imagestore.Image{
		Name:     ci.Name,
		Manifest: ocispec.Descriptor{MediaType: string(ci.Manifest.MediaType), Digest: digest.Digest(ci.Manifest.Digest.String()), Size: ci.Manifest.Size},
		Config:   ocispec.Descriptor{MediaType: string(ci.Config.MediaType), Digest: digest.Digest(ci.Config.Digest.String()), Size: ci.Config.Size},
	}
	for i, l := range ci.Layers {
		im.Layers = append(im.Layers, ocispec.Descriptor{MediaType: string(l.MediaType), Digest: digest.Digest(l.Digest.String()), Size: l.Size})
		im.DiffIDs = append(im.DiffIDs, digest.Digest(cf.RootFS.DiffIDs[i].String()))
	}
	cache := rootfs.TreeCache{Dir: filepath.Join(b.o.Cache.Root, imageTreesDir), Shared: b.shared(imageTreesDir)}
	key := im.ChainID().Encoded()
	sub, ok, err := cache.Load(key, dir)
	if err != nil {
		return imagestore.Image{}, nil, err
	}
	if !ok {
		sub, err = rootfs.FlattenWith(img, dir, rootfs.FlattenOptions{Cache: b.o.Cache, DiffIDs: cf.RootFS.DiffIDs, Exact: true})
		if err != nil {
			return imagestore.Image{}, nil, err
		}
		if err := cache.Store(key, sub); err != nil {
			b.log.Warn("applied layers not cached: the next bake applies them again", "image", ci.Name, "err", err)
		}
	}
	im.Tree = sub.Dir
	return im, sub, nil
}
