package rootfs

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kilnproject/kiln/builder/artifact"
	"github.com/kilnproject/kiln/internal/testkit"
)

// A layer blob swapped for another (a tampered registry, mirror or layout) must be refused
// before any of its entries reaches the tree: a digest checked only at the end of the stream
// would come after the entries were written.
func TestAttackTamperedLayerAppliesNothing(t *testing.T) {
	good := testkit.Layer(t, file("etc/os-release", "ID=good\n"))
	evil := testkit.Layer(t, file("planted", "evil"), symlink("evil", "/"), file("etc/os-release", "ID=evil\n"))
	for _, tc := range []struct {
		name  string
		cache bool
	}{{name: "no cache"}, {name: "cache", cache: true}} {
		t.Run(tc.name, func(t *testing.T) {
			src, _ := writeLayout(t, good)
			d, _ := good.Digest()
			rc, err := evil.Compressed()
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(rc)
			if err := os.WriteFile(filepath.Join(src.Layout, "blobs", d.Algorithm, d.Hex), b, 0o644); err != nil {
				t.Fatal(err)
			}
			img, err := OpenBase(context.Background(), src)
			if err != nil {
				t.Fatal(err)
			}
			var o FlattenOptions
			cacheDir := t.TempDir()
			if tc.cache {
				o.Cache = artifact.NewCache(cacheDir)
			}
			tree := filepath.Join(t.TempDir(), "tree")
			_, err = FlattenWith(img, tree, o)
			if err == nil || !strings.Contains(err.Error(), "layer digest mismatch") || !strings.Contains(err.Error(), d.String()) {
				t.Fatalf("Flatten of a tampered layer: %v; want a digest mismatch naming %s", err, d)
			}
			ents, _ := os.ReadDir(tree)
			if len(ents) > 0 {
				t.Errorf("the tampered layer was applied before it was verified: the tree holds %v", ents)
			}
			if _, ok := artifact.NewCache(cacheDir).Has(d.Hex); ok {
				t.Errorf("the tampered layer is in the cache under %s", d)
			}
		})
	}
}

// A layer the cache holds is taken from it (verified when it was stored), not read again.
func TestFlattenTakesVerifiedLayersFromTheCache(t *testing.T) {
	l := testkit.Layer(t, file("etc/os-release", "ID=test\n"))
	src, _ := writeLayout(t, l)
	img, err := OpenBase(context.Background(), src)
	if err != nil {
		t.Fatal(err)
	}
	c := artifact.NewCache(t.TempDir())
	if _, err := FlattenWith(img, filepath.Join(t.TempDir(), "tree"), FlattenOptions{Cache: c}); err != nil {
		t.Fatal(err)
	}
	d, _ := l.Digest()
	if _, ok := c.Has(d.Hex); !ok {
		t.Fatalf("layer %s is not in the cache after Flatten", d)
	}
	// With the layout's blob gone, the cached copy serves.
	if err := os.Remove(filepath.Join(src.Layout, "blobs", d.Algorithm, d.Hex)); err != nil {
		t.Fatal(err)
	}
	tree := filepath.Join(t.TempDir(), "tree")
	if _, err := FlattenWith(img, tree, FlattenOptions{Cache: c}); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(tree, "etc/os-release")); err != nil || string(b) != "ID=test\n" {
		t.Errorf("etc/os-release = %q, %v", b, err)
	}
}
