package rootfs

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
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
	rel = strings.TrimPrefix(path.Clean("/"+rel), "/")
	dst, err := t.host(rel)
	if err != nil {
		return fmt.Errorf("add /%s: %w", rel, err)
	}
	if fi, err := os.Lstat(dst); err == nil && fi.IsDir() {
		return fmt.Errorf("add /%s: a directory is in the way", rel)
	}
	_ = os.Remove(dst)
	f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
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
	delete(t.Owners, rel)
	return os.Chmod(dst, mode)
}

// AddOverlay copies the host directory tree src over the root: directories are merged, files
// and symlinks replace what was there, modes are kept and everything is owned by root.
func (t *Tree) AddOverlay(src string) error { return t.AddDir(src, "") }

// AddDir copies the host directory tree src to dst (relative to the root, "" for the root
// itself) the way AddOverlay does.
func (t *Tree) AddDir(src, dst string) error {
	if dst != "" {
		if err := os.MkdirAll(filepath.Join(t.Dir, filepath.FromSlash(dst)), 0o755); err != nil {
			return err
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
			dst, err := t.host(rel)
			if err != nil {
				return fmt.Errorf("overlay %s: %w", p, err)
			}
			if fi, err := os.Lstat(dst); err == nil && fi.IsDir() {
				return nil
			} else if err == nil {
				if err := os.Remove(dst); err != nil {
					return err
				}
			}
			return os.Mkdir(dst, info.Mode().Perm())
		case info.Mode()&os.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return t.Symlink(target, rel)
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

// Symlink creates (or replaces) the symlink rel -> target.
func (t *Tree) Symlink(target, rel string) error {
	rel = strings.TrimPrefix(path.Clean("/"+rel), "/")
	dst, err := t.host(rel)
	if err != nil {
		return fmt.Errorf("symlink /%s: %w", rel, err)
	}
	if fi, err := os.Lstat(dst); err == nil {
		if fi.IsDir() && fi.Mode()&os.ModeSymlink == 0 {
			return fmt.Errorf("symlink /%s: a directory is in the way", rel)
		}
		if err := os.Remove(dst); err != nil {
			return err
		}
	}
	delete(t.Owners, rel)
	return os.Symlink(target, dst)
}

// Kernel is the kernel found in the base.
type Kernel struct {
	Version string // e.g. 6.1.0-28-cloud-amd64
	Image   string // host path of the kernel image
}

// FindKernel looks for /boot/vmlinuz-<version> or /usr/lib/modules/<version>/vmlinuz with a
// matching modules directory. A base without a kernel is an error that says so.
func (t *Tree) FindKernel() (*Kernel, error) {
	var found []Kernel
	mods, _ := filepath.Glob(filepath.Join(t.Dir, "usr/lib/modules/*"))
	for _, m := range mods {
		v := filepath.Base(m)
		for _, cand := range []string{filepath.Join(t.Dir, "boot", "vmlinuz-"+v), filepath.Join(m, "vmlinuz")} {
			if fi, err := os.Stat(cand); err == nil && fi.Mode().IsRegular() {
				found = append(found, Kernel{Version: v, Image: cand})
				break
			}
		}
	}
	switch len(found) {
	case 0:
		boot, _ := filepath.Glob(filepath.Join(t.Dir, "boot/vmlinuz-*"))
		if len(boot) > 0 {
			return nil, fmt.Errorf("base has %s but no matching /usr/lib/modules/<version>: the initramfs needs the modules", strings.TrimPrefix(boot[0], t.Dir))
		}
		return nil, errors.New("base has no kernel: no /boot/vmlinuz-* or /usr/lib/modules/*/vmlinuz (install a kernel package, e.g. linux-image-cloud-amd64, in the base)")
	case 1:
		return &found[0], nil
	default:
		var vs []string
		for _, k := range found {
			vs = append(vs, k.Version)
		}
		sort.Strings(vs)
		return nil, fmt.Errorf("base has %d kernels (%s): keep exactly one", len(found), strings.Join(vs, ", "))
	}
}

// SystemdBoot returns the host path of the systemd-boot EFI binary in the tree.
func (t *Tree) SystemdBoot() (string, error) {
	for _, c := range []string{"usr/lib/systemd/boot/efi/systemd-bootx64.efi", "lib/systemd/boot/efi/systemd-bootx64.efi"} {
		p := filepath.Join(t.Dir, c)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", errors.New("base has no systemd-boot (/usr/lib/systemd/boot/efi/systemd-bootx64.efi): install systemd-boot-efi in the base")
}
