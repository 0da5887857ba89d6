package rootfs

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/layout"

	"github.com/kilnproject/kiln/builder/artifact"
)

// BenchmarkFlattenBase flattens the base image `make base` caches (tag from
// KILN_BENCH_BASE_TAG, default bookworm), as a bake does: without a cache (every layer is
// verified into a temporary file first) and with a warm one (verified once, before the timer).
func BenchmarkFlattenBase(b *testing.B) {
	dir := filepath.Join(os.Getenv("HOME"), ".cache/kiln/base")
	tag := os.Getenv("KILN_BENCH_BASE_TAG")
	if tag == "" {
		tag = "bookworm"
	}
	p, err := layout.FromPath(dir)
	if err != nil {
		b.Skipf("no cached base (make base): %v", err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		b.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		b.Fatal(err)
	}
	var src Source
	for _, d := range im.Manifests {
		if d.Annotations[artifact.RefNameAnnotation] == tag {
			src = Source{Layout: dir, Digest: d.Digest.String()}
		}
	}
	if src.Digest == "" {
		b.Skipf("no image tagged %s in %s", tag, dir)
	}
	img, err := OpenBase(context.Background(), src)
	if err != nil {
		b.Fatal(err)
	}
	cache := artifact.NewCache(b.TempDir())
	for _, bc := range []struct {
		name string
		o    FlattenOptions
	}{{"no-cache", FlattenOptions{}}, {"warm-cache", FlattenOptions{Cache: cache}}} {
		b.Run(bc.name, func(b *testing.B) {
			if bc.o.Cache != nil {
				warm := filepath.Join(b.TempDir(), "warm")
				if _, err := FlattenWith(img, warm, bc.o); err != nil {
					b.Fatal(err)
				}
				os.RemoveAll(warm)
			}
			for range b.N {
				tree := filepath.Join(b.TempDir(), "tree")
				if _, err := FlattenWith(img, tree, bc.o); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				os.RemoveAll(tree)
				b.StartTimer()
			}
		})
	}
	// What verification costs a bake whose cache lacks the layers: each blob copied into the
	// cache, hashed as it is written and synced.
	b.Run("verify-into-cache", func(b *testing.B) {
		layers, err := img.Layers()
		if err != nil {
			b.Fatal(err)
		}
		for range b.N {
			c := artifact.NewCache(b.TempDir())
			for _, l := range layers {
				d, err := l.Digest()
				if err != nil {
					b.Fatal(err)
				}
				if _, err := verifiedBlob(l, d, c); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			os.RemoveAll(c.Root)
			b.StartTimer()
		}
	})
}
