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
	"syscall"

	"github.com/kilnproject/kiln/internal/atomicfile"
)

// Boot files come out of the base, which is not trusted: each is read through an os.Root on
// the tree, so a symlink on the way is followed only while it stays inside the tree. A relative
// link that stays inside (/vmlinuz -> boot/vmlinuz-6.1.0-28-cloud-amd64, /lib -> usr/lib)
// works; an absolute link or one whose ".." climbs out is an error naming the file, and the
// build host's file it points at is never opened.

// Kernel is the kernel found in the base.
type Kernel struct {
	Version string // e.g. 6.1.0-28-cloud-amd64
	// Image is the kernel image's path in the tree, slash separated without a leading slash
	// (e.g. boot/vmlinuz-6.1.0-28-cloud-amd64); read it with CopyOut.
	Image string
}

// inTreeError describes err, the failure of reading rel through the root r: it names the file
// as the image sees it and, when rel is itself a symlink, its target. what says what the file
// is for ("kernel", "systemd-boot").
func inTreeError(r *os.Root, what, rel string, err error) error {
	name := "/" + rel
	if fi, lerr := r.Lstat(rel); lerr == nil && fi.Mode()&fs.ModeSymlink != 0 {
		if target, rerr := r.Readlink(rel); rerr == nil {
			name += fmt.Sprintf(" (a symlink to %q)", target)
		}
	}
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("base %s %s: %w", what, name, err)
	}
	return fmt.Errorf("base %s %s: %w (files the bake takes from the base must lie inside it: "+
		"absolute symlinks and symlinks leading out of the tree are refused)", what, name, err)
}

// statInTree stats rel through r. found is false when nothing is there (a dangling symlink,
// or a parent that is not a directory, included); any other failure, a symlink leading out of
// the tree above all, is an error.
func statInTree(r *os.Root, what, rel string) (fi fs.FileInfo, found bool, err error) {
	fi, err = r.Stat(rel)
	switch {
	case err == nil:
		return fi, true, nil
	case errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR):
		return nil, false, nil
	default:
		return nil, false, inTreeError(r, what, rel, err)
	}
}

// FindKernel looks for /boot/vmlinuz-<version> or /usr/lib/modules/<version>/vmlinuz with a
// matching modules directory. A base without a kernel is an error that says so; a kernel
// reached through a symlink that leads out of the tree is an error naming it.
func (t *Tree) FindKernel() (*Kernel, error) {
	r, err := os.OpenRoot(t.Dir)
	if err != nil {
		return nil, fmt.Errorf("open root tree: %w", err)
	}
	defer r.Close()
	ents, err := fs.ReadDir(r.FS(), "usr/lib/modules")
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, inTreeError(r, "module directory", "usr/lib/modules", err)
	}
	var found []Kernel
	for _, e := range ents {
		v := e.Name()
		for _, cand := range []string{path.Join("boot", "vmlinuz-"+v), path.Join("usr/lib/modules", v, "vmlinuz")} {
			fi, ok, err := statInTree(r, "kernel", cand)
			if err != nil {
				return nil, err
			}
			if ok && fi.Mode().IsRegular() {
				found = append(found, Kernel{Version: v, Image: cand})
				break
			}
		}
	}
	switch len(found) {
	case 0:
		boot, _ := fs.Glob(r.FS(), "boot/vmlinuz-*")
		if len(boot) > 0 {
			return nil, fmt.Errorf("base has /%s but no matching /usr/lib/modules/<version>: the initramfs needs the modules", boot[0])
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

// SystemdBoot returns the path in the tree (slash separated, no leading slash) of the
// systemd-boot EFI binary; read it with CopyOut.
func (t *Tree) SystemdBoot() (string, error) {
	r, err := os.OpenRoot(t.Dir)
	if err != nil {
		return "", fmt.Errorf("open root tree: %w", err)
	}
	defer r.Close()
	for _, c := range []string{"usr/lib/systemd/boot/efi/systemd-bootx64.efi", "lib/systemd/boot/efi/systemd-bootx64.efi"} {
		fi, ok, err := statInTree(r, "systemd-boot", c)
		if err != nil {
			return "", err
		}
		if !ok {
			continue
		}
		if !fi.Mode().IsRegular() {
			return "", fmt.Errorf("base systemd-boot /%s is a %s, not a regular file", c, fileType(fi.Mode()))
		}
		return c, nil
	}
	return "", errors.New("base has no systemd-boot (/usr/lib/systemd/boot/efi/systemd-bootx64.efi): install systemd-boot-efi in the base")
}

// CopyOut copies the regular file rel of the tree (slash separated, relative to the root) to
// the host file dst, reading it through the tree: symlinks are followed only inside it. A file
// bigger than limit bytes is refused, and so is anything but a regular file. what names the
// file in errors ("kernel", "systemd-boot").
func (t *Tree) CopyOut(what, rel, dst string, limit int64) error {
	r, err := os.OpenRoot(t.Dir)
	if err != nil {
		return fmt.Errorf("open root tree: %w", err)
	}
	defer r.Close()
	// Stat first: opening a named pipe would wait for a writer.
	fi, err := r.Stat(rel)
	if err != nil {
		return inTreeError(r, what, rel, err)
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("base %s /%s is a %s, not a regular file", what, rel, fileType(fi.Mode()))
	}
	if fi.Size() > limit {
		return fmt.Errorf("base %s /%s is %d bytes, more than the %d it may have", what, rel, fi.Size(), limit)
	}
	in, err := r.Open(rel)
	if err != nil {
		return inTreeError(r, what, rel, err)
	}
	defer in.Close()
	out, err := atomicfile.Create(filepath.Dir(dst), atomicfile.Options{Mode: 0o644})
	if err != nil {
		return err
	}
	defer out.Close()
	// The limit holds even if the file grows while it is read.
	n, err := io.Copy(out, io.LimitReader(in, limit+1))
	if err == nil && n > limit {
		err = fmt.Errorf("more than %d bytes", limit)
	}
	if err == nil {
		err = out.Commit(filepath.Base(dst))
	}
	if err != nil {
		return fmt.Errorf("copy base %s /%s: %w", what, rel, err)
	}
	return nil
}

func fileType(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "directory"
	case m&fs.ModeDevice != 0:
		return "device"
	case m&fs.ModeNamedPipe != 0:
		return "named pipe"
	case m&fs.ModeSocket != 0:
		return "socket"
	}
	return "special file"
}
