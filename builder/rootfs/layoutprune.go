package rootfs

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"

	"github.com/kilnproject/kiln/internal/lastuse"
)

// UnreferencedBlobs lists the files of the OCI layout dir's blobs that no image or index its
// index.json names uses, written before before: what ImportTar leaves behind when it replaces
// an image of the same tag, and the temporary files of writes a crash cut short. A blob written
// since before may be a concurrent import's that the index does not name yet, and is not
// listed. A manifest the index names but the layout cannot read fails it: nothing is listed
// from a layout whose references are not all known.
func UnreferencedBlobs(dir string, before time.Time) ([]string, error) {
	if !IsLayout(dir) {
		return nil, nil
	}
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("layout %s: %w", dir, err)
	}
	used := map[v1.Hash]bool{}
	if err := referenced(idx, used); err != nil {
		return nil, fmt.Errorf("layout %s: %w", dir, err)
	}
	var out []string
	algs, err := os.ReadDir(filepath.Join(dir, "blobs"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("layout %s: %w", dir, err)
	}
	for _, a := range algs {
		if !a.IsDir() {
			continue
		}
		alg := a.Name()
		blobs, err := lastuse.Unused(filepath.Join(dir, "blobs", alg), before, func(e fs.DirEntry) bool {
			if !e.Type().IsRegular() {
				return false
			}
			// A name that is no digest is a write's temporary file (go-containerregistry
			// writes a layer under one first).
			h, err := v1.NewHash(alg + ":" + e.Name())
			return err != nil || !used[h]
		}, nil)
		if err != nil {
			return nil, fmt.Errorf("layout %s: %w", dir, err)
		}
		out = append(out, blobs...)
	}
	return out, nil
}

// referenced adds to used every blob idx names: its manifests, their configs and layers, and
// those of the indexes it holds.
func referenced(idx v1.ImageIndex, used map[v1.Hash]bool) error {
	m, err := idx.IndexManifest()
	if err != nil {
		return err
	}
	for _, d := range m.Manifests {
		used[d.Digest] = true
		switch {
		case d.MediaType.IsIndex():
			child, err := idx.ImageIndex(d.Digest)
			if err != nil {
				return fmt.Errorf("index %s: %w", d.Digest, err)
			}
			if err := referenced(child, used); err != nil {
				return err
			}
		case d.MediaType.IsImage():
			img, err := idx.Image(d.Digest)
			if err != nil {
				return fmt.Errorf("image %s: %w", d.Digest, err)
			}
			im, err := img.Manifest()
			if err != nil {
				return fmt.Errorf("image %s: %w", d.Digest, err)
			}
			used[im.Config.Digest] = true
			for _, l := range im.Layers {
				used[l.Digest] = true
			}
		default:
			return fmt.Errorf("%s has media type %q: neither an image nor an index", d.Digest, d.MediaType)
		}
	}
	return nil
}
