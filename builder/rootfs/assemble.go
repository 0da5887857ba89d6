package rootfs

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// AddFile copies the host file src to rel (slash separated, relative to the root) with mode.
// Missing parents are created (0755, root-owned); an existing entry is replaced.
func (t *Tree) AddFile(rel, src string, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	return t.WriteFile(rel, in, mode)
}

// WriteFile writes the content of r to rel with mode, replacing what was there.
func (t *Tree) WriteFile(rel string, r io.Reader, mode os.FileMode) error {
	rel = cleanPath(rel)
	root, dst, err := t.place("add", rel)
	if err != nil {
		return err
	}
	f, err := root.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("add /%s: %w", rel, err)
	}
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return fmt.Errorf("add /%s: %w", rel, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("add /%s: %w", rel, err)
	}
	return root.Chmod(dst, mode)
}

// cleanPath is the image path p relative to the root: slash separated, no leading slash, no
// "..", "." or double slashes.
func cleanPath(p string) string { return strings.TrimPrefix(path.Clean("/"+p), "/") }

// place resolves where the entry rel (a cleanPath) goes — its parent's symlink-free path,
// made if missing, joined with its name — and clears the way: an entry already there is
// removed, unless it is a directory, which is an error. what names the change in errors.
func (t *Tree) place(what, rel string) (root *os.Root, dst string, err error) {
	if root, err = t.openRoot(); err != nil {
		return nil, "", err
	}
	if dst, err = t.resolveParent(rel, true); err != nil {
		return nil, "", fmt.Errorf("%s /%s: %w", what, rel, err)
	}
	if fi, err := root.Lstat(dst); err == nil && fi.IsDir() {
		return nil, "", fmt.Errorf("%s /%s: a directory is in the way", what, rel)
	} else if err == nil {
		t.changed()
		if err := root.Remove(dst); err != nil {
			return nil, "", fmt.Errorf("%s /%s: %w", what, rel, err)
		}
	}
	delete(t.Owners, dst)
	return root, dst, nil
}

// AddOverlay copies the host directory tree src over the root: directories are merged, files
// and symlinks replace what was there, modes are kept and everything is owned by root.
func (t *Tree) AddOverlay(src string) error { return t.AddDir(src, "") }

// AddDir copies the host directory tree src to dst (relative to the root, "" for the root
// itself) the way AddOverlay does. Like every write to the tree, it resolves symlinks inside
// the tree: one the base planted cannot send the copy out of it.
func (t *Tree) AddDir(src, dst string) error {
	root, err := t.openRoot()
	if err != nil {
		return err
	}
	dst = strings.Trim(path.Clean("/"+dst), "/")
	if dst != "" {
		if _, err := t.resolveDir(dst, true); err != nil {
			return fmt.Errorf("overlay %s: /%s: %w", src, dst, err)
		}
	}
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil || rel == "." {
			return err
		}
		rel = path.Join(dst, filepath.ToSlash(rel))
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			dst, err := t.resolveParent(rel, true)
			if err != nil {
				return fmt.Errorf("overlay %s: %w", p, err)
			}
			if fi, err := root.Lstat(dst); err == nil && fi.IsDir() {
				return nil
			} else if err == nil {
				t.changed()
				if err := root.Remove(dst); err != nil {
					return err
				}
			}
			return root.Mkdir(dst, info.Mode().Perm())
		case info.Mode()&os.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return t.symlink(target, rel)
		case info.Mode().IsRegular():
			if err := t.AddFile(rel, p, info.Mode().Perm()); err != nil {
				return fmt.Errorf("overlay %s: %w", p, err)
			}
			return nil
		default:
			return fmt.Errorf("overlay %s: unsupported file type %s", p, info.Mode().Type())
		}
	})
}

// symlink creates (or replaces) the symlink rel -> target.
func (t *Tree) symlink(target, rel string) error {
	rel = cleanPath(rel)
	root, dst, err := t.place("symlink", rel)
	if err != nil {
		return err
	}
	t.changed() // the new link may redirect paths already resolved
	return root.Symlink(target, dst)
}

// Adopt moves the tree sub, built elsewhere on the same filesystem, to rel (slash separated,
// relative to the root), which must not be a directory yet, and takes over the owners sub
// recorded. sub is not usable afterwards.
func (t *Tree) Adopt(rel string, sub *Tree) error {
	rel = cleanPath(rel)
	if rel == "" {
		return fmt.Errorf("adopt %s: no place given", sub.Dir)
	}
	_, dst, err := t.place("adopt", rel)
	if err != nil {
		return err
	}
	sub.closeRoots()
	if sub.root != nil {
		sub.root.Close()
		sub.root = nil
	}
	if err := os.Rename(sub.Dir, filepath.Join(t.Dir, filepath.FromSlash(dst))); err != nil {
		return fmt.Errorf("adopt /%s: %w", rel, err)
	}
	for p, o := range sub.Owners {
		t.Owners[dst+"/"+p] = o
	}
	sub.Dir, sub.Owners = "", nil
	return nil
}

// RestrictDir gives the directory rel, which must exist, the mode perm in the image (owned by
// root), whatever its mode on the host.
func (t *Tree) RestrictDir(rel string, perm os.FileMode) error {
	rel = cleanPath(rel)
	p, err := t.resolveDir(rel, false)
	if err != nil {
		return fmt.Errorf("restrict /%s: %w", rel, err)
	}
	root, err := t.openRoot()
	if err != nil {
		return err
	}
	if fi, err := root.Lstat(p); err != nil || !fi.IsDir() {
		return fmt.Errorf("restrict /%s: not a directory (%v)", rel, err)
	}
	t.Owners[p] = Owner{Mode: perm.Perm()}
	return nil
}

// LinkDir lays the host directory tree src (what an archive unpacks to, at image paths) over
// the root the way unpacking it there would: directories are followed through the tree's
// symlinks (merged /usr) or made (0755), symlinks and files replace what was there, and each
// file is a hard link to src's, with src's mode. src must be on the tree's filesystem and its
// files must never be written in place (a cache entry, whose files are only replaced).
func (t *Tree) LinkDir(src string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil || rel == "." {
			return err
		}
		rel = cleanPath(filepath.ToSlash(rel))
		switch {
		case d.IsDir():
			if _, err := t.resolveDir(rel, true); err != nil {
				return fmt.Errorf("link /%s: %w", rel, err)
			}
			return nil
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return t.symlink(target, rel)
		case d.Type().IsRegular():
			_, dst, err := t.place("link", rel)
			if err != nil {
				return err
			}
			if err := os.Link(p, filepath.Join(t.Dir, filepath.FromSlash(dst))); err != nil {
				return fmt.Errorf("link /%s: %w", rel, err)
			}
			return nil
		default:
			return fmt.Errorf("link %s: unsupported file type %s", p, d.Type())
		}
	})
}
