package firstboot

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"strings"
)

// maxSymlinks bounds symlink resolution, like the kernel's MAXSYMLINKS.
const maxSymlinks = 40

// tree writes files below a root directory. Paths are resolved as if the root were "/":
// an absolute symlink points back inside the root and ".." stops at the root, so no
// write ever lands outside it. os.Root enforces the same on every call.
type tree struct {
	root *os.Root
}

func openTree(dir string) (*tree, error) {
	r, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("open root %s: %w", dir, err)
	}
	return &tree{root: r}, nil
}

func (t *tree) Close() error { return t.root.Close() }

// rel turns an absolute node path into a path relative to the root.
func rel(p string) string {
	return strings.TrimPrefix(path.Clean("/"+p), "/")
}

// split returns the directory (resolved, created with mode 0755 where missing, no
// symlinks left) and the base name of p.
func (t *tree) split(p string) (dir, base string, err error) {
	r := rel(p)
	if r == "" {
		return "", "", errors.New("path is the root directory")
	}
	dir, err = t.mkdirAll(path.Dir(r))
	if err != nil {
		return "", "", err
	}
	return dir, path.Base(r), nil
}

// mkdirAll resolves the directory path p (relative to the root) component by
// component, following symlinks with the root as "/", creating missing directories
// with mode 0755. It returns the resolved path, which contains no symlinks.
func (t *tree) mkdirAll(p string) (string, error) {
	todo := strings.Split(p, "/")
	var cur []string
	links := 0
	for len(todo) > 0 {
		c := todo[0]
		todo = todo[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			if len(cur) > 0 {
				cur = cur[:len(cur)-1]
			}
			continue
		}
		next := path.Join(append(cur, c)...)
		fi, err := t.root.Lstat(next)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			if err := t.root.Mkdir(next, 0o755); err != nil {
				return "", fmt.Errorf("create directory /%s: %w", next, err)
			}
			// Mkdir honours the umask; the contract is 0755.
			if err := t.root.Chmod(next, 0o755); err != nil {
				return "", fmt.Errorf("chmod directory /%s: %w", next, err)
			}
			cur = append(cur, c)
		case err != nil:
			return "", fmt.Errorf("stat /%s: %w", next, err)
		case fi.Mode()&fs.ModeSymlink != 0:
			links++
			if links > maxSymlinks {
				return "", fmt.Errorf("resolve /%s: too many levels of symbolic links", p)
			}
			target, err := t.root.Readlink(next)
			if err != nil {
				return "", fmt.Errorf("read symlink /%s: %w", next, err)
			}
			if path.IsAbs(target) {
				cur = nil
			}
			todo = append(strings.Split(target, "/"), todo...)
		case fi.IsDir():
			cur = append(cur, c)
		default:
			return "", fmt.Errorf("/%s is not a directory", next)
		}
	}
	if len(cur) == 0 {
		return ".", nil
	}
	return path.Join(cur...), nil
}

// writeFile atomically replaces dir/base with data: a temporary file in the same
// directory is written, owned by root when running as root, given mode, fsync'd and
// renamed over the target; then the directory is fsync'd.
func (t *tree) writeFile(dir, base string, data []byte, mode fs.FileMode) error {
	target := path.Join(dir, base)
	var rnd [6]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return fmt.Errorf("temporary name: %w", err)
	}
	tmp := path.Join(dir, ".kiln-"+base+"."+hex.EncodeToString(rnd[:]))
	f, err := t.root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("create /%s: %w", tmp, err)
	}
	err = fill(f, data, mode)
	if cerr := f.Close(); err == nil && cerr != nil {
		err = cerr
	}
	if err == nil {
		err = t.root.Rename(tmp, target)
	}
	if err != nil {
		_ = t.root.Remove(tmp)
		return fmt.Errorf("write /%s: %w", target, err)
	}
	return t.syncDir(dir)
}

func fill(f *os.File, data []byte, mode fs.FileMode) error {
	if _, err := f.Write(data); err != nil {
		return err
	}
	if os.Geteuid() == 0 {
		// Before chmod: chown clears setuid/setgid bits.
		if err := f.Chown(0, 0); err != nil {
			return err
		}
	}
	if err := f.Chmod(mode); err != nil {
		return err
	}
	return f.Sync()
}

func (t *tree) syncDir(dir string) error {
	d, err := t.root.Open(dir)
	if err != nil {
		return fmt.Errorf("open directory /%s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync directory /%s: %w", dir, err)
	}
	return nil
}
