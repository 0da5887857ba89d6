package kube

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kilnproject/kiln/internal/nodeimage"
)

// seedImage lays, under a new root, a store as the bake does: a metadata database, a content
// blob linking into the layout, a snapshot whose fs links into SnapshotsPath.
func seedImage(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	seed := filepath.Join(root, nodeimage.StoreSeedPath)
	for p, body := range map[string]string{
		"io.containerd.metadata.v1.bolt/meta.db":             "metadata",
		"io.containerd.snapshotter.v1.overlayfs/metadata.db": "snapshots",
	} {
		if err := os.MkdirAll(filepath.Join(seed, filepath.Dir(p)), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(seed, p), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for link, target := range map[string]string{
		"io.containerd.content.v1.content/blobs/sha256/aa":      nodeimage.ImagesPath + "/blobs/sha256/aa",
		"io.containerd.snapshotter.v1.overlayfs/snapshots/1/fs": nodeimage.SnapshotsPath + "/cc",
	} {
		if err := os.MkdirAll(filepath.Join(seed, filepath.Dir(link)), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, filepath.Join(seed, link)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(root, nodeimage.SnapshotsPath, "cc"), 0o755); err != nil {
		t.Fatal(err)
	}
	return root
}

func storePath(root, p string) string { return filepath.Join(root, nodeimage.StoreRoot, p) }

// requireSeeded checks containerd's root holds the baked store and nothing of the seeding.
func requireSeeded(t *testing.T, root string) {
	t.Helper()
	if b, err := os.ReadFile(storePath(root, "io.containerd.metadata.v1.bolt/meta.db")); err != nil || string(b) != "metadata" {
		t.Errorf("meta.db = %q, %v", b, err)
	}
	if got, err := os.Readlink(storePath(root, "io.containerd.snapshotter.v1.overlayfs/snapshots/1/fs")); err != nil || got != nodeimage.SnapshotsPath+"/cc" {
		t.Errorf("snapshot fs links to %q, %v", got, err)
	}
	if got, err := os.Readlink(storePath(root, "io.containerd.content.v1.content/blobs/sha256/aa")); err != nil || got != nodeimage.ImagesPath+"/blobs/sha256/aa" {
		t.Errorf("content blob links to %q, %v", got, err)
	}
	for _, left := range []string{".kiln-seed", seedIncomplete} {
		if _, err := os.Lstat(storePath(root, left)); !os.IsNotExist(err) {
			t.Errorf("%s left behind (%v)", left, err)
		}
	}
	if err := CheckStore(root); err != nil {
		t.Errorf("CheckStore after seeding: %v", err)
	}
}

func TestSeedStore(t *testing.T) {
	for _, tc := range []struct {
		name    string
		prepare func(t *testing.T, root string)
		seeded  bool
		err     string
	}{
		{name: "first boot", seeded: true},
		{name: "containerd has a store", prepare: func(t *testing.T, root string) {
			os.MkdirAll(storePath(root, "io.containerd.metadata.v1.bolt"), 0o700)
			os.WriteFile(storePath(root, "io.containerd.metadata.v1.bolt/meta.db"), []byte("containerd's own"), 0o644)
		}},
		{name: "image without a store", prepare: func(t *testing.T, root string) {
			os.RemoveAll(filepath.Join(root, nodeimage.StoreSeedPath))
		}},
		{name: "entries of unknown origin", prepare: func(t *testing.T, root string) {
			os.MkdirAll(storePath(root, "io.containerd.content.v1.content"), 0o700)
		}, err: "has io.containerd.content.v1.content but no metadata database"},
		{name: "power cut half way", seeded: true, prepare: func(t *testing.T, root string) {
			os.MkdirAll(storePath(root, "io.containerd.content.v1.content/blobs"), 0o700)
			os.MkdirAll(storePath(root, ".kiln-seed/io.containerd.snapshotter.v1.overlayfs"), 0o700)
			os.WriteFile(storePath(root, seedIncomplete), nil, 0o600)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := seedImage(t)
			if tc.prepare != nil {
				tc.prepare(t, root)
			}
			seeded, err := SeedStore(root)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("SeedStore = %v, want an error saying %q", err, tc.err)
				}
				return
			}
			if err != nil || seeded != tc.seeded {
				t.Fatalf("SeedStore = %v, %v; want %v", seeded, err, tc.seeded)
			}
			if !tc.seeded {
				if b, err := os.ReadFile(storePath(root, "io.containerd.metadata.v1.bolt/meta.db")); err == nil && string(b) == "metadata" {
					t.Error("the baked store was laid over containerd's own")
				}
				return
			}
			requireSeeded(t, root)
			// A second run (a re-run of first boot) changes nothing.
			if again, err := SeedStore(root); again || err != nil {
				t.Errorf("second SeedStore = %v, %v; want false, nil", again, err)
			}
		})
	}
}

// A store seeded from another image references trees this root lacks: CheckStore names them.
func TestCheckStoreFindsForeignSnapshots(t *testing.T) {
	root := seedImage(t)
	if _, err := SeedStore(root); err != nil {
		t.Fatal(err)
	}
	os.RemoveAll(filepath.Join(root, nodeimage.SnapshotsPath, "cc"))
	// A snapshot containerd unpacked itself is a directory and is never in question.
	os.MkdirAll(storePath(root, "io.containerd.snapshotter.v1.overlayfs/snapshots/2/fs"), 0o700)
	err := CheckStore(root)
	if err == nil || !strings.Contains(err.Error(), nodeimage.SnapshotsPath+"/cc") || !strings.Contains(err.Error(), "seeded from another image") {
		t.Errorf("CheckStore = %v, want it to name %s/cc", err, nodeimage.SnapshotsPath)
	}
}
