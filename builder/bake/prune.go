package bake

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/kilnproject/kiln/builder/artifact"
	"github.com/kilnproject/kiln/builder/initramfs"
	"github.com/kilnproject/kiln/builder/rootfs"
)

// The directories below the cache's root (Options.Cache.Root) that bakes keep their work in,
// beside the artifact cache's blobs.
const (
	baseTreesDir     = "base-trees"     // flattened bases, by chain ID
	imageTreesDir    = "trees"          // pre-pulled images' applied layers, by chain ID
	artifactTreesDir = "artifact-trees" // what each artifact lays in the root
	initramfsDir     = "initramfs"      // compressed initramfs archives
)

// PruneOptions say what PruneCache removes.
type PruneOptions struct {
	// Root is the cache's directory ($KILN_CACHE).
	Root string
	// Layouts are OCI layouts of base images (kiln base import's) whose blobs no image in them
	// uses any more are removed too.
	Layouts []string
	// Before: what was last used (or written) before it is removed.
	Before time.Time
	// DryRun lists what would go and removes nothing; it runs beside bakes.
	DryRun bool
	// Wait, when a bake is using the cache, waits for it (and for any bake that starts
	// meanwhile) to finish; unset, that is ErrCacheBusy.
	Wait bool
	// Waiting, if not nil, is called once when PruneCache starts waiting.
	Waiting func()
}

// Pruned is what PruneCache removed (or, dry, would remove) of one kind of cache entry.
type Pruned struct {
	Kind    string   `json:"kind"` // "blobs", "base-trees", ..., or "layout DIR"
	Entries []string `json:"entries"`
	// Bytes is the space their removal frees: the blocks of the files that have no link left
	// outside them.
	Bytes int64 `json:"bytes"`
}

// PruneCache removes the cache entries not used since o.Before, kind by kind: downloaded blobs,
// the flattened bases', images' and artifacts' trees, compressed initramfs archives, and the
// blobs of o.Layouts that no image there uses. Each use marks an entry (internal/lastuse), so
// what a bake of the last o.Before took from the cache stays. A kind it cannot read stops it
// before anything of that kind is removed, with what earlier kinds removed returned. It holds
// the cache alone, but for a dry run: no bake runs while it prunes (see PruneOptions.Wait).
func PruneCache(o PruneOptions) ([]Pruned, error) {
	if o.Root == "" {
		return nil, errors.New("prune cache: no cache directory")
	}
	if !o.DryRun {
		release, err := holdCache(o.Root, true, o.Wait, o.Waiting)
		if err != nil {
			return nil, fmt.Errorf("prune cache: %w", err)
		}
		defer release()
	}
	trees := func(dir string) func(time.Time) ([]string, error) {
		return rootfs.TreeCache{Dir: filepath.Join(o.Root, dir)}.Unused
	}
	type kind struct {
		name   string
		unused func(time.Time) ([]string, error) // the entries not used since a time
	}
	kinds := []kind{
		{"blobs", artifact.NewCache(o.Root).Unused},
		{baseTreesDir, trees(baseTreesDir)},
		{imageTreesDir, trees(imageTreesDir)},
		{artifactTreesDir, trees(artifactTreesDir)},
		{initramfsDir, func(t time.Time) ([]string, error) {
			return initramfs.UnusedCache(filepath.Join(o.Root, initramfsDir), t)
		}},
	}
	for _, l := range o.Layouts {
		kinds = append(kinds, kind{"layout " + l, func(t time.Time) ([]string, error) { return rootfs.UnreferencedBlobs(l, t) }})
	}
	var out []Pruned
	for _, k := range kinds {
		paths, err := k.unused(o.Before)
		if err != nil {
			return out, fmt.Errorf("prune cache: %w", err)
		}
		p := Pruned{Kind: k.name, Entries: paths}
		if p.Bytes, err = freed(paths); err != nil {
			return out, fmt.Errorf("prune cache: %w", err)
		}
		if !o.DryRun {
			for _, e := range paths {
				if err := os.RemoveAll(e); err != nil {
					return append(out, p), fmt.Errorf("prune cache: remove %s: %w", e, err)
				}
			}
		}
		out = append(out, p)
	}
	return out, nil
}

// freed is the space removing paths (and all below them) frees: the allocated blocks of each
// inode whose every link is among them.
func freed(paths []string) (int64, error) {
	type inode struct{ dev, ino uint64 }
	seen := map[inode]uint64{}
	var total int64
	for _, root := range paths {
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			fi, err := d.Info()
			if err != nil {
				return err
			}
			st, ok := fi.Sys().(*syscall.Stat_t)
			if !ok {
				return fmt.Errorf("%s: no inode", p)
			}
			id := inode{uint64(st.Dev), st.Ino}
			seen[id]++
			if seen[id] == uint64(st.Nlink) || fi.IsDir() {
				total += st.Blocks * 512
			}
			return nil
		})
		if err != nil {
			return 0, err
		}
	}
	return total, nil
}
