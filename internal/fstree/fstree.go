// Package fstree recreates a directory tree elsewhere: directories and symlinks as they are,
// each regular file by a function the caller gives (a hard link, a copy).
package fstree

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// FileFunc makes the regular file dst from src, whose mode is mode.
type FileFunc func(src, dst string, mode fs.FileMode) error

// Recreate walks src and recreates it at dst, which must not exist. Directories get their own
// permission bits (with sticky, setgid and setuid) or'ed with extraDirPerm (0o700 keeps a tree
// writable by its owner while it is filled), symlinks are recreated with the same target,
// regular files are made by file; any other type of entry is an error naming it.
func Recreate(src, dst string, extraDirPerm fs.FileMode, file FileFunc) error {
	return RecreateLinking(src, dst, extraDirPerm, file, nil)
}

// RecreateLinking is Recreate with each symlink made by symlink when it is not nil: a hard
// link to the symlink itself (link(2) does not follow it) makes no new inode, which on some
// filesystems costs as much as a mkdir.
func RecreateLinking(src, dst string, extraDirPerm fs.FileMode, file, symlink FileFunc) error {
	return recreate(src, dst, extraDirPerm, file, symlink, false)
}

// RecreateInto is RecreateLinking into dst that may exist and hold some of src's directories
// already (and nothing else): those are kept, their modes set as a new one's would be.
func RecreateInto(src, dst string, extraDirPerm fs.FileMode, file, symlink FileFunc) error {
	return recreate(src, dst, extraDirPerm, file, symlink, true)
}

func recreate(src, dst string, extraDirPerm fs.FileMode, file, symlink FileFunc, keepDirs bool) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		to := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			// The sticky, setgid and setuid bits too: /tmp without its sticky bit lets anyone
			// remove anyone's files.
			perm := info.Mode()&(fs.ModePerm|fs.ModeSticky|fs.ModeSetgid|fs.ModeSetuid) | extraDirPerm
			if err := os.Mkdir(to, perm); err != nil && !(keepDirs && errors.Is(err, fs.ErrExist) && isDir(to)) {
				return err
			}
			return os.Chmod(to, perm) // not narrowed by the umask
		case info.Mode()&fs.ModeSymlink != 0 && symlink != nil:
			return symlink(p, to, info.Mode())
		case info.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return os.Symlink(target, to)
		case info.Mode().IsRegular():
			return file(p, to, info.Mode())
		default:
			return fmt.Errorf("%s: not a directory, file or symlink", p)
		}
	})
}

// isDir says whether p is a directory (not a symlink to one).
func isDir(p string) bool {
	fi, err := os.Lstat(p)
	return err == nil && fi.IsDir()
}
