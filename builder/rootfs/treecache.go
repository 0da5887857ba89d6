package rootfs

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/kilnproject/kiln/internal/atomicfile"
	"github.com/kilnproject/kiln/internal/fstree"
	"github.com/kilnproject/kiln/internal/lastuse"
)

// TreeCache keeps flattened trees under a key that names their content (an image's chain ID),
// so that a rebake takes an unchanged image's applied layers from it instead of decompressing
// and writing them again. Trees are shared by hard links: a tree loaded from the cache must only
// be read, moved or removed, never written in place (the bake only reads an image's tree once
// it has laid it). Each cached tree records its listing (every entry's path, type, mode and
// size); one that no longer matches it is dropped and flattened again.
//
// With Shared set, a tree the cache lacks is first taken from there (and checked like any
// other), and a tree stored is added there too.
type TreeCache struct {
	Dir    string
	Shared Shared
}

// treeRecord is what the cache keeps beside a tree: its owners and its listing.
type treeRecord struct {
	// Version is treeRecordVersion; a record of another version is dropped with its tree.
	Version int              `json:"version,omitempty"`
	Owners  map[string]Owner `json:"owners"`
	Listing []treeEntry      `json:"listing"`
}

type treeEntry struct {
	Path string      `json:"path"`
	Mode fs.FileMode `json:"mode"`
	Size int64       `json:"size,omitempty"`
}

// treeRecordVersion is the version of the trees the cache keeps: 2 since directories keep
// their sticky, setgid and setuid bits (version 1 trees lost them when stored).
const treeRecordVersion = 2

var cacheKeyRE = regexp.MustCompile(`^[0-9a-f]{64}$`)

// storeTempPrefix starts the name of an entry Store is writing.
const storeTempPrefix = ".store-"

func (c TreeCache) paths(key string) (tree, record string, err error) {
	if !cacheKeyRE.MatchString(key) {
		return "", "", fmt.Errorf("tree cache key %q is not a sha256 hex", key)
	}
	d := filepath.Join(c.Dir, key)
	return filepath.Join(d, "tree"), filepath.Join(d, "tree.json"), nil
}

// TreeDir is where the cache keeps tree key (it need not be there).
func (c TreeCache) TreeDir(key string) (string, error) {
	tree, _, err := c.paths(key)
	return tree, err
}

// Load links the cached tree key into dir, which must not exist, and returns it; a tree the
// cache lacks is first taken from c.Shared. It returns false when neither has a whole tree for
// key or its listing changed (the entry is then removed, as is one of another
// treeRecordVersion). The directories are key's skeleton's when Recycle kept one.
func (c TreeCache) Load(key, dir string) (*Tree, bool, error) {
	src, ok, err := c.Open(key)
	if err != nil || !ok {
		return nil, false, err
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return nil, false, err
	}
	link := linkTree
	if c.claimSkeleton(key, src.Dir, dir) {
		link = linkInto
	}
	if err := link(src.Dir, dir); err != nil {
		os.RemoveAll(dir)
		return nil, false, fmt.Errorf("link cached tree %s: %w", key, err)
	}
	return &Tree{Dir: dir, Owners: src.Owners}, true, nil
}

// Open returns the cached tree key itself, checked as Load checks it, to be read in place:
// its files may be linked elsewhere, never written. It returns false as Load does.
func (c TreeCache) Open(key string) (*Tree, bool, error) {
	src, rec, err := c.paths(key)
	if err != nil {
		return nil, false, err
	}
	data, err := os.ReadFile(rec)
	var r treeRecord
	switch {
	case errors.Is(err, fs.ErrNotExist):
		// Checked against its listing as it came in.
		var pulled bool
		if r, pulled = c.pull(key); !pulled {
			return nil, false, nil
		}
	case err != nil:
		return nil, false, err
	default:
		if r, err = checkRecord(data, src); err != nil {
			os.RemoveAll(filepath.Dir(rec))
			return nil, false, nil
		}
	}
	if r.Owners == nil {
		r.Owners = map[string]Owner{}
	}
	lastuse.Mark(rec)
	return &Tree{Dir: src, Owners: r.Owners}, true, nil
}

// Unused lists the entries the cache has not opened since before (their record's time, which
// Store and Open set), and the entries without a record (a crash's) and stores left unfinished
// not written since before, for kiln cache prune to remove. Other files in c.Dir are not the
// cache's and are not listed.
func (c TreeCache) Unused(before time.Time) ([]string, error) {
	return lastuse.Unused(c.Dir, before, func(e fs.DirEntry) bool {
		return e.IsDir() && (cacheKeyRE.MatchString(e.Name()) || strings.HasPrefix(e.Name(), storeTempPrefix))
	}, func(entry string) string {
		if _, rec, err := c.paths(filepath.Base(entry)); err == nil && exists(rec) {
			return rec
		}
		return entry
	})
}

// Store adds t under key, unless the cache has it already, and then to c.Shared. The cache
// holds links to t's files.
func (c TreeCache) Store(key string, t *Tree) error {
	dst, rec, err := c.paths(key)
	if err != nil {
		return err
	}
	if _, err := os.Stat(rec); err == nil {
		return nil
	}
	if err := os.MkdirAll(c.Dir, 0o700); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(c.Dir, storeTempPrefix)
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	if err := linkTree(t.Dir, filepath.Join(tmp, "tree")); err != nil {
		return fmt.Errorf("cache tree %s: %w", key, err)
	}
	listing, err := listTree(filepath.Join(tmp, "tree"))
	if err != nil {
		return err
	}
	data, err := json.Marshal(treeRecord{Version: treeRecordVersion, Owners: t.Owners, Listing: listing})
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(tmp, "tree.json"), data, 0o600); err != nil {
		return err
	}
	os.RemoveAll(filepath.Dir(dst)) // a partial entry (no tree.json) left by a crash
	if err := os.Rename(tmp, filepath.Dir(dst)); err != nil {
		return fmt.Errorf("cache tree %s: %w", key, err)
	}
	c.push(key)
	return nil
}

// checkRecord parses a tree's record, data, and checks that it is of treeRecordVersion and
// that the tree still matches its listing.
func checkRecord(data []byte, tree string) (treeRecord, error) {
	var r treeRecord
	if err := json.Unmarshal(data, &r); err != nil {
		return r, fmt.Errorf("tree record: %w", err)
	}
	if r.Version != treeRecordVersion {
		return r, fmt.Errorf("tree record of version %d, not %d", r.Version, treeRecordVersion)
	}
	listing, err := listTree(tree)
	if err != nil {
		return r, err
	}
	if d := listingDiff(listing, r.Listing); d != "" {
		return r, fmt.Errorf("the tree does not match its record: %s", d)
	}
	return r, nil
}

// checkEntry is checkRecord of the record file record and tree.
func checkEntry(record, tree string) (treeRecord, error) {
	data, err := os.ReadFile(record)
	if err != nil {
		return treeRecord{}, err
	}
	return checkRecord(data, tree)
}

// listTree lists every entry below dir in walk order.
func listTree(dir string) ([]treeEntry, error) {
	var out []treeEntry
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		e := treeEntry{Path: filepath.ToSlash(rel), Mode: info.Mode()}
		if info.Mode().IsRegular() {
			e.Size = info.Size()
		}
		out = append(out, e)
		return nil
	})
	return out, err
}

// listingDiff says where the listing got differs from the listing want, or "" when they are the same.
func listingDiff(got, want []treeEntry) string {
	for i := range min(len(got), len(want)) {
		if got[i] != want[i] {
			return fmt.Sprintf("%s (mode %v, size %d) where the record has %s (mode %v, size %d)",
				got[i].Path, got[i].Mode, got[i].Size, want[i].Path, want[i].Mode, want[i].Size)
		}
	}
	if len(got) != len(want) {
		return fmt.Sprintf("%d entries where the record lists %d", len(got), len(want))
	}
	return ""
}

// linkTree recreates the directory tree src at dst (which must not exist): directories made
// with their modes, regular files and symlinks hard-linked (a linked symlink is the same
// inode, and makes none: a new inode is what costs on some filesystems), copied or recreated
// when src and dst are on different filesystems.
func linkTree(src, dst string) error {
	return fstree.RecreateLinking(src, dst, 0o700, linkFile, linkSymlink)
}

// linkFile hard-links the regular file from to to, or copies it across filesystems.
func linkFile(from, to string, mode fs.FileMode) error {
	return linkOr(from, to, func() error { return atomicfile.Copy(from, to, atomicfile.Options{Mode: mode}) })
}

// linkSymlink hard-links the symlink from to to, or makes one of the same target across
// filesystems.
func linkSymlink(from, to string, _ fs.FileMode) error {
	return linkOr(from, to, func() error {
		target, err := os.Readlink(from)
		if err != nil {
			return err
		}
		return os.Symlink(target, to)
	})
}

// linkInto is linkTree into dst, which holds some of src's directories already (a skeleton).
func linkInto(src, dst string) error {
	return fstree.RecreateInto(src, dst, 0o700, linkFile, linkSymlink)
}

// linkOr hard-links from to to or, when the two are on different filesystems, makes to with
// other.
func linkOr(from, to string, other func() error) error {
	err := os.Link(from, to)
	var le *os.LinkError
	if errors.As(err, &le) && errors.Is(le.Err, syscall.EXDEV) {
		return other()
	}
	return err
}
