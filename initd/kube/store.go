package kube

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/kilnproject/kiln/internal/atomicfile"
	"github.com/kilnproject/kiln/internal/fstree"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

// The entries of containerd's root the store laid at bake holds, the metadata last: containerd
// takes its root as a store once the metadata database is there.
var seedEntries = []string{"io.containerd.content.v1.content", "io.containerd.snapshotter.v1.overlayfs", "io.containerd.metadata.v1.bolt"}

// seedIncomplete marks, in containerd's root, a seeding that has not moved every entry yet.
const seedIncomplete = ".kiln-seed-incomplete"

// SeedStore copies containerd's store laid at bake (nodeimage.StoreSeedPath) into containerd's
// root (nodeimage.StoreRoot), both under root, before containerd first starts: a few small
// databases and symlinks, the images then ready without an import. It does nothing (false) when
// the image has no store or containerd's root already has its metadata database, whose images
// `kiln-init kube images` completes from the layout. The copy is made beside the entries and
// moved into place, the metadata last, so a power cut leaves either no store or a whole one
// (a later run finishes a seeding it finds half moved).
func SeedStore(root string) (bool, error) {
	seed := filepath.Join(root, nodeimage.StoreSeedPath)
	if _, err := os.Stat(seed); errors.Is(err, fs.ErrNotExist) {
		return false, nil
	} else if err != nil {
		return false, err
	}
	dst := filepath.Join(root, nodeimage.StoreRoot)
	meta := filepath.Join(dst, seedEntries[len(seedEntries)-1])
	if _, err := os.Stat(meta); err == nil {
		return false, nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return false, err
	}
	if err := os.MkdirAll(dst, 0o711); err != nil {
		return false, fmt.Errorf("containerd store: %w", err)
	}
	marker := filepath.Join(dst, seedIncomplete)
	_, err := os.Stat(marker)
	resuming := err == nil
	for _, e := range seedEntries {
		if _, err := os.Lstat(filepath.Join(dst, e)); err == nil && !resuming {
			return false, fmt.Errorf("containerd store: %s has %s but no metadata database: not a store kiln-init laid; remove %s to let first boot lay the baked one", nodeimage.StoreRoot, e, nodeimage.StoreRoot)
		}
	}
	tmp := filepath.Join(dst, ".kiln-seed")
	if err := os.RemoveAll(tmp); err != nil {
		return false, fmt.Errorf("containerd store: %w", err)
	}
	if err := copyTree(seed, tmp); err != nil {
		os.RemoveAll(tmp)
		return false, fmt.Errorf("containerd store: copy %s: %w", nodeimage.StoreSeedPath, err)
	}
	if err := atomicfile.Write(marker, nil, atomicfile.Options{Mode: 0o600}); err != nil {
		return false, fmt.Errorf("containerd store: %w", err)
	}
	for _, e := range seedEntries {
		target := filepath.Join(dst, e)
		if err := os.RemoveAll(target); err != nil { // a half-moved earlier seeding's
			return false, fmt.Errorf("containerd store: %w", err)
		}
		if err := os.Rename(filepath.Join(tmp, e), target); err != nil {
			return false, fmt.Errorf("containerd store: %w", err)
		}
		if err := syncDir(dst); err != nil {
			return false, err
		}
	}
	if err := os.Remove(marker); err != nil {
		return false, fmt.Errorf("containerd store: %w", err)
	}
	if err := os.RemoveAll(tmp); err != nil {
		return false, fmt.Errorf("containerd store: %w", err)
	}
	return true, syncDir(dst)
}

// copyTree copies the directory src to dst (which must not exist): directories with their
// modes, regular files synced (atomicfile), symlinks as symlinks.
func copyTree(src, dst string) error {
	return fstree.Recreate(src, dst, 0, func(from, to string, mode fs.FileMode) error {
		return atomicfile.Copy(from, to, atomicfile.Options{Mode: mode})
	})
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}

// CheckStore finds snapshots of containerd's store (under root) that are symlinks into
// nodeimage.SnapshotsPath naming a directory this root filesystem does not have — a store
// seeded from another image — and returns an error naming them: a container stacked on one
// would not start. Nil when there are none.
func CheckStore(root string) error {
	dir := filepath.Join(root, nodeimage.StoreRoot, "io.containerd.snapshotter.v1.overlayfs", "snapshots")
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	} else if err != nil {
		return err
	}
	var missing []string
	for _, e := range entries {
		target, err := os.Readlink(filepath.Join(dir, e.Name(), "fs"))
		if err != nil || !strings.HasPrefix(target, nodeimage.SnapshotsPath+"/") {
			continue // a directory: a snapshot containerd unpacked itself
		}
		if _, err := os.Stat(filepath.Join(root, target)); errors.Is(err, fs.ErrNotExist) {
			missing = append(missing, target)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	slices.Sort(missing)
	return fmt.Errorf("containerd's store in %s has %d image snapshot(s) laid at bake that this root filesystem lacks (%s): it was seeded from another image; remove %s (containers and images are then laid again from this image) or boot the image it came from",
		nodeimage.StoreRoot, len(missing), strings.Join(missing, ", "), nodeimage.StoreRoot)
}
