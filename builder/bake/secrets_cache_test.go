package bake

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kilnproject/kiln/internal/testkit"
)

// A base linked from the cache is scanned once and marked clean; later bakes scan only what
// they add — and still refuse a key an overlay adds.
func TestBakeScansACachedBaseOnce(t *testing.T) {
	r := newRepo(t, fakeBase(true), "role: worker\n")
	r.lock(t)
	if _, err := r.bake(t); err != nil {
		t.Fatal(err)
	}
	marks, _ := filepath.Glob(filepath.Join(r.cache.Root, "base-trees", "*", "secrets-clean"))
	if len(marks) != 1 {
		t.Fatalf("clean marks in the cache of flattened bases: %v, want one", marks)
	}
	if _, err := r.bake(t); err != nil {
		t.Fatalf("a second bake from the cached, clean base: %v", err)
	}
	write(t, filepath.Join(r.dir, "overlays/base/etc/kiln/node.key"), ecKeyPEM(t, "EC PRIVATE KEY"))
	os.RemoveAll(r.out)
	_, err := r.bake(t)
	if err == nil || !strings.Contains(err.Error(), "/etc/kiln/node.key") {
		t.Fatalf("a bake adding a key to a clean cached base: %v, want the key refused", err)
	}
	if _, statErr := os.Stat(filepath.Join(r.out, "test-worker.raw")); statErr == nil {
		t.Error("the refused bake left an image")
	}
}

// A base with a key in it is never marked clean: every bake, from the cache too, refuses it.
func TestBakeRefusesAKeyInACachedBase(t *testing.T) {
	base := append(fakeBase(true), testkit.Entry{Name: "etc/ssl/private/base.key", Body: ecKeyPEM(t, "PRIVATE KEY")})
	r := newRepo(t, base, "role: worker\n")
	r.lock(t)
	for i := range 2 {
		_, err := r.bake(t)
		if err == nil || !strings.Contains(err.Error(), "/etc/ssl/private/base.key") {
			t.Fatalf("bake %d of a base holding a key: %v, want the key refused", i+1, err)
		}
	}
	if marks, _ := filepath.Glob(filepath.Join(r.cache.Root, "base-trees", "*", "secrets-clean")); len(marks) != 0 {
		t.Errorf("a base holding a key was marked clean: %v", marks)
	}
	if trees, _ := filepath.Glob(filepath.Join(r.cache.Root, "base-trees", "*", "tree")); len(trees) != 1 {
		t.Errorf("cached base trees %v, want one (the second bake linked it)", trees)
	}
}
