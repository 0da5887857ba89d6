package rootfs

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// A skeleton is the directories of a cached tree, empty, kept beside it (<key>/skeleton) by
// Recycle for the next Load of the same key to link into. Making a tree's directories again
// right after the last bake removed them is what costs: on ext4 without a journal each new
// inode is checked against those freed in the last 5 to 10 s, and the base's 1,200
// directories took 0.3 to 1 s to make where linking its 10,000 files took 0.05 s.

// skeletonPath is where the cache keeps key's skeleton.
func (c TreeCache) skeletonPath(key string) (string, error) {
	tree, err := c.TreeDir(key)
	if err != nil {
		return "", err
	}
	return filepath.Join(filepath.Dir(tree), "skeleton"), nil
}

// claimSkeleton moves key's skeleton to dir and reports whether it did. A skeleton that holds
// anything but directories the tree src also has is removed and not used.
func (c TreeCache) claimSkeleton(key, src, dir string) bool {
	sk, err := c.skeletonPath(key)
	if err != nil || os.Rename(sk, dir) != nil {
		return false
	}
	if err := onlyDirsOf(dir, src); err != nil {
		os.RemoveAll(dir)
		return false
	}
	return true
}

// onlyDirsOf checks that dir holds nothing but directories that src has at the same paths.
func onlyDirsOf(dir, src string) error {
	return walkRel(dir, func(p, rel string, d fs.DirEntry) error {
		if !d.IsDir() {
			return fmt.Errorf("%s is not a directory", rel)
		}
		if !isDir(filepath.Join(src, rel)) {
			return fmt.Errorf("the tree has no directory %s", rel)
		}
		return nil
	})
}

// Recycle removes dir, a tree Load made from key (and written to since), keeping its
// directories that the cached tree also has as key's skeleton, for the next Load of key to
// link into. Only removing dir can fail it: without the cached tree, or when a skeleton is
// kept already (another bake's), dir is removed whole.
func (c TreeCache) Recycle(key, dir string) error {
	src, err := c.TreeDir(key)
	sk, serr := c.skeletonPath(key)
	if err != nil || serr != nil || !isDir(src) || exists(sk) {
		return os.RemoveAll(dir)
	}
	if err := emptyToDirsOf(dir, src); err != nil {
		return errors.Join(err, os.RemoveAll(dir))
	}
	if os.Rename(dir, sk) != nil {
		return os.RemoveAll(dir)
	}
	return nil
}

// emptyToDirsOf removes from dir every entry but the directories src has at the same paths.
func emptyToDirsOf(dir, src string) error {
	return walkRel(dir, func(p, rel string, d fs.DirEntry) error {
		if !d.IsDir() {
			return os.Remove(p)
		}
		if rel != "." && !isDir(filepath.Join(src, rel)) {
			if err := os.RemoveAll(p); err != nil {
				return err
			}
			return filepath.SkipDir
		}
		return nil
	})
}

// walkRel walks dir as filepath.WalkDir does, giving fn each entry's path relative to dir too.
func walkRel(dir string, fn func(p, rel string, d fs.DirEntry) error) error {
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		return fn(p, rel, d)
	})
}

// isDir says whether p is a directory (not a symlink to one).
func isDir(p string) bool {
	fi, err := os.Lstat(p)
	return err == nil && fi.IsDir()
}

func exists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}
