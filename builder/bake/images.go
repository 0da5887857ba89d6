package bake

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/kilnproject/kiln/builder/artifact"
	"github.com/kilnproject/kiln/builder/rootfs"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

// imageNameAnnotation, on each manifest descriptor of the images layout's index.json, is the
// image's full name, registry.k8s.io/pause:3.10.2; `ctr images import` names the image after
// it. artifact.RefNameAnnotation beside it is the tag, 3.10.2.
const imageNameAnnotation = "io.containerd.image.name"

// imageInfos are the records in image.json of the pre-pulled images, fetched in the
// profile's order.
func (b *baker) imageInfos(images []*artifact.CachedImage) []nodeimage.ImageInfo {
	infos := []nodeimage.ImageInfo{}
	for i, im := range b.prof.Images {
		infos = append(infos, nodeimage.ImageInfo{Name: im.Name, Digest: images[i].Manifest.Digest.String()})
	}
	return infos
}

// layImages lays the pre-pulled images, fetched in the profile's order, into the tree as one
// OCI image layout at nodeimage.ImagesPath: every image's manifest and config, and the
// compressed layers of the images first boot imports (infos, in images' order, say which are
// Unpacked in containerd's store instead; a layer one of those shares with an imported image
// stays) or of every image when the runtime keeps them (nodeimage.Runtime.KeepLayers).
func (b *baker) layImages(tree *rootfs.Tree, images []*artifact.CachedImage, infos []nodeimage.ImageInfo, keepLayers bool) error {
	if len(images) == 0 {
		return nil
	}
	t := time.Now()
	tags := make([]string, len(b.prof.Images))
	withLayers := make([]bool, len(images))
	for i, im := range b.prof.Images {
		tags[i] = im.Tag()
		withLayers[i] = keepLayers || !infos[i].Unpacked
	}
	n, size, err := writeImageLayout(tree, nodeimage.ImagesPath, b.o.Cache, images, tags, withLayers)
	if err != nil {
		return fmt.Errorf("pre-pulled images: %w", err)
	}
	b.log.Info("images laid", "images", len(images), "blobs", n, "bytes", size, "seconds", time.Since(t).Round(time.Millisecond).Seconds())
	return nil
}

// fileWriter writes files into a root tree (rootfs.Tree does).
type fileWriter interface {
	WriteFile(rel string, r io.Reader, mode os.FileMode) error
}

// writeImageLayout writes one OCI image layout at dir in the tree holding every image of imgs,
// copying each blob from the cache once (layers shared between images are stored once) and
// re-hashing it on the way; an image's layers only where withLayers says so. Each index entry
// carries the image's name and tag as annotations. It returns how many blobs it wrote and
// their bytes.
func writeImageLayout(w fileWriter, dir string, cache *artifact.Cache, imgs []*artifact.CachedImage, tags []string, withLayers []bool) (int, int64, error) {
	written := map[v1.Hash]bool{}
	var size int64
	idx := v1.IndexManifest{SchemaVersion: 2, MediaType: types.OCIImageIndex}
	for i, im := range imgs {
		blobs := im.Blobs()
		if !withLayers[i] {
			blobs = []v1.Descriptor{im.Manifest, im.Config}
		}
		for _, b := range blobs {
			if written[b.Digest] {
				continue
			}
			if err := copyBlob(w, path.Join(dir, "blobs", b.Digest.Algorithm, b.Digest.Hex), cache, b.Digest); err != nil {
				return 0, 0, fmt.Errorf("image %q: %w", im.Name, err)
			}
			written[b.Digest] = true
			size += b.Size
		}
		d := im.Manifest
		d.Annotations = map[string]string{imageNameAnnotation: im.Name, artifact.RefNameAnnotation: tags[i]}
		d.Platform = im.Platform
		idx.Manifests = append(idx.Manifests, d)
	}
	data, err := json.MarshalIndent(idx, "", "  ")
	if err != nil {
		return 0, 0, err
	}
	if err := w.WriteFile(path.Join(dir, "index.json"), bytes.NewReader(append(data, '\n')), 0o644); err != nil {
		return 0, 0, err
	}
	err = w.WriteFile(path.Join(dir, "oci-layout"), bytes.NewReader([]byte(`{"imageLayoutVersion":"1.0.0"}`+"\n")), 0o644)
	return len(written), size, err
}

// copyBlob copies the cached blob h to rel and checks that what was copied hashes to h.
func copyBlob(w fileWriter, rel string, cache *artifact.Cache, h v1.Hash) error {
	src, ok := cache.Has(h.Hex)
	if !ok {
		return fmt.Errorf("blob %s is not in the cache %s", h, cache.Root)
	}
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	sum := sha256.New()
	if err := w.WriteFile(rel, io.TeeReader(f, sum), 0o644); err != nil {
		return err
	}
	if got := hex.EncodeToString(sum.Sum(nil)); got != h.Hex {
		return fmt.Errorf("cached blob %s hashes to sha256:%s (damaged cache; remove it and bake again)", src, got)
	}
	return nil
}
