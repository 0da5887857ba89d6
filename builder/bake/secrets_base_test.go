package bake

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/layout"

	"github.com/kilnproject/kiln/builder/rootfs"
)

// baseLayout is the OCI layout `make base` and `make base-cloudinit` fill.
func baseLayout(t *testing.T) string {
	t.Helper()
	cache := os.Getenv("KILN_CACHE")
	if cache == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			t.Skipf("no cached base: %v", err)
		}
		cache = filepath.Join(home, ".cache", "kiln")
	}
	return filepath.Join(cache, "base")
}

// TestScanSecretsRealBases runs the guard over the cached bases (make base base-cloudinit),
// flattened as a bake flattens them: a real Debian root, and one with cloud-init (whose Python
// sources and compiled modules hold key headers and shortened keys, and whose documentation,
// laid back in, holds example keys that parse), must have no findings.
func TestScanSecretsRealBases(t *testing.T) {
	if testing.Short() {
		t.Skip("flattens the cached bases (about 1 GB each)")
	}
	dir := baseLayout(t)
	p, err := layout.FromPath(dir)
	if err != nil {
		t.Skipf("no cached base in %s (make base base-cloudinit): %v", dir, err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	for _, tag := range []string{"bookworm", "bookworm-cloudinit"} {
		t.Run(tag, func(t *testing.T) {
			var img = -1
			for i, m := range im.Manifests {
				if m.Annotations["org.opencontainers.image.ref.name"] == tag {
					img = i
				}
			}
			if img < 0 {
				t.Skipf("no base tagged %s in %s (make base base-cloudinit)", tag, dir)
			}
			tree, flattened := flattenBase(t, rootfs.Source{Layout: dir, Digest: im.Manifests[img].Digest.String()})
			var docs []string
			if tag == "bookworm-cloudinit" {
				docs = layBackCloudInitExamples(t, tree)
			}
			files, size := treeSize(tree)
			start := time.Now()
			found, err := ScanSecrets(os.DirFS(tree))
			took := time.Since(start)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: flattened in %s; scanned %d files, %d MiB in %s", tag, flattened.Round(time.Millisecond), files, size>>20, took.Round(time.Millisecond))
			for _, f := range found {
				t.Errorf("%s: a finding in a base with no secrets: %v", tag, f)
			}
			if len(docs) > 0 {
				checkChangedDocsFound(t, tag, tree, docs)
			}
		})
	}
}

// flattenBase flattens a base into a new directory as a bake does, and says how long that
// took.
func flattenBase(t *testing.T, src rootfs.Source) (string, time.Duration) {
	t.Helper()
	base, err := rootfs.OpenBase(t.Context(), src)
	if err != nil {
		t.Fatal(err)
	}
	tree := t.TempDir()
	start := time.Now()
	if _, err := rootfs.Flatten(base, tree); err != nil {
		t.Fatal(err)
	}
	return tree, time.Since(start)
}

// layBackCloudInitExamples puts cloud-init's documented examples back into tree and returns
// their paths in it. kiln's base leaves /usr/share/doc out; other bases with cloud-init keep
// it, and cloud-init's examples hold keys that parse. They are laid back as the package
// installed them (testdata/cloud-init: cloud-init 22.4.2-1+deb12u4's files, whose md5sums
// the base's package database records).
func layBackCloudInitExamples(t *testing.T, tree string) []string {
	t.Helper()
	examples := "usr/share/doc/cloud-init/examples"
	if err := os.MkdirAll(filepath.Join(tree, examples), 0o755); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir("testdata/cloud-init")
	if err != nil {
		t.Fatal(err)
	}
	var docs []string
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("testdata/cloud-init", e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, filepath.Join(examples, e.Name()))
		if err := os.WriteFile(filepath.Join(tree, docs[len(docs)-1]), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return docs
}

// treeSize counts the regular files in tree and their bytes.
func treeSize(tree string) (files, size int64) {
	filepath.WalkDir(tree, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				files++
				size += fi.Size()
			}
		}
		return nil
	})
	return files, size
}

// checkChangedDocsFound changes each of docs and checks that the scan then finds a key in
// each: changed, the documentation is no longer the package's, so its keys count.
func checkChangedDocsFound(t *testing.T, tag, tree string, docs []string) {
	t.Helper()
	for _, d := range docs {
		f, err := os.OpenFile(filepath.Join(tree, d), os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		f.Write([]byte("\n"))
		f.Close()
	}
	found, err := ScanSecrets(os.DirFS(tree))
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]bool{}
	for _, f := range found {
		files[f.Path] = true
	}
	if len(files) != len(docs) {
		t.Errorf("%s: changed cloud-init examples: findings %v, want a key in each of %v", tag, found, docs)
	}
}
