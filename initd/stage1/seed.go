package stage1

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kilnproject/kiln/internal/atomicfile"
)

// seededMarker is the file, at the top of the data filesystem, that says seeding finished.
const seededMarker = ".kiln-seeded"

// seedOnce copies src into dst unless dst/.kiln-seeded exists, then syncs dst's filesystem and
// writes the marker last. It reports whether it copied. A copy cut short (power loss) has no
// marker and is redone over what it left.
func seedOnce(src, dst string) (bool, error) {
	marker := filepath.Join(dst, seededMarker)
	if _, err := os.Lstat(marker); err == nil {
		return false, nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return false, fmt.Errorf("seed %s: %w", dst, err)
	}
	if err := seed(src, dst); err != nil {
		return false, err
	}
	if err := syncFS(dst); err != nil {
		return false, err
	}
	stamp := fmt.Sprintf("seeded from %s at %s\n", src, time.Now().UTC().Format(time.RFC3339))
	if err := atomicfile.Write(marker, []byte(stamp), atomicfile.Options{Mode: 0o644}); err != nil {
		return false, fmt.Errorf("write seed marker: %w", err)
	}
	if err := syncFS(dst); err != nil {
		return false, err
	}
	return true, nil
}

func syncFS(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	defer d.Close()
	if err := unix.Syncfs(int(d.Fd())); err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}

// seed copies the tree at src into the existing directory dst, keeping file types, modes
// (including setuid/setgid/sticky), ownership, timestamps, extended attributes, symlinks, hard
// links, device nodes and FIFOs, and holes in sparse files. Sockets are skipped. An entry already
// in dst is replaced, so seed can run again over a partial copy; dst's own mode, owner and times
// are set from src.
func seed(src, dst string) error {
	s := seeder{links: map[fileID]string{}}
	return s.copy(src, dst, true)
}

type fileID struct{ dev, ino uint64 }

type seeder struct {
	links map[fileID]string // first copy of each multiply-linked file
	buf   []byte
}

func (s *seeder) copy(src, dst string, top bool) error {
	fi, err := os.Lstat(src)
	if err != nil {
		return fmt.Errorf("seed: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("seed: no stat for %s", src)
	}
	mode := fi.Mode()
	if mode&fs.ModeSocket != 0 {
		return nil
	}
	if !top {
		if err := s.clear(dst, mode); err != nil {
			return err
		}
	}
	if !mode.IsDir() && st.Nlink > 1 {
		id := fileID{uint64(st.Dev), st.Ino}
		if first, ok := s.links[id]; ok {
			if err := os.Link(first, dst); err != nil {
				return fmt.Errorf("seed: hard link %s: %w", dst, err)
			}
			return nil
		}
		s.links[id] = dst
	}
	switch {
	case mode.IsDir():
		if err := os.Mkdir(dst, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("seed: %w", err)
		}
		ents, err := os.ReadDir(src)
		if err != nil {
			return fmt.Errorf("seed: %w", err)
		}
		for _, e := range ents {
			if err := s.copy(filepath.Join(src, e.Name()), filepath.Join(dst, e.Name()), false); err != nil {
				return err
			}
		}
	case mode&fs.ModeSymlink != 0:
		target, err := os.Readlink(src)
		if err != nil {
			return fmt.Errorf("seed: %w", err)
		}
		if err := os.Symlink(target, dst); err != nil {
			return fmt.Errorf("seed: %w", err)
		}
	case mode.IsRegular():
		if err := s.copyFile(src, dst, fi.Size()); err != nil {
			return err
		}
	case mode&(fs.ModeDevice|fs.ModeNamedPipe) != 0:
		if err := unix.Mknod(dst, st.Mode, int(st.Rdev)); err != nil {
			return fmt.Errorf("seed: mknod %s: %w", dst, err)
		}
	default:
		return fmt.Errorf("seed: %s has unsupported type %s", src, mode.Type())
	}
	return s.setMeta(src, dst, st, mode)
}

// clear removes dst when it exists and is not a directory that a directory will be copied into.
func (s *seeder) clear(dst string, mode fs.FileMode) error {
	fi, err := os.Lstat(dst)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("seed: %w", err)
	}
	if fi.IsDir() && mode.IsDir() {
		return nil
	}
	if err := os.RemoveAll(dst); err != nil {
		return fmt.Errorf("seed: replace %s: %w", dst, err)
	}
	return nil
}

func (s *seeder) copyFile(src, dst string, size int64) error {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("seed: %w", err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("seed: %w", err)
	}
	if s.buf == nil {
		s.buf = make([]byte, 128<<10)
	}
	var off int64
	for {
		n, rerr := in.Read(s.buf)
		if n > 0 {
			chunk := s.buf[:n]
			if !allZero(chunk) {
				if _, err := out.WriteAt(chunk, off); err != nil {
					out.Close()
					return fmt.Errorf("seed: write %s: %w", dst, err)
				}
			}
			off += int64(n)
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			out.Close()
			return fmt.Errorf("seed: read %s: %w", src, rerr)
		}
	}
	// Zero chunks were skipped: the size comes from truncate, leaving holes.
	if err := out.Truncate(off); err != nil {
		out.Close()
		return fmt.Errorf("seed: %w", err)
	}
	if off != size {
		out.Close()
		return fmt.Errorf("seed: %s changed size while copying (%d, now %d)", src, size, off)
	}
	if err := out.Close(); err != nil {
		return fmt.Errorf("seed: %w", err)
	}
	return nil
}

var zeroChunk [128 << 10]byte

func allZero(b []byte) bool {
	for len(b) > 0 {
		n := min(len(b), len(zeroChunk))
		if !bytes.Equal(b[:n], zeroChunk[:n]) {
			return false
		}
		b = b[n:]
	}
	return true
}

// setMeta applies owner, mode (after chown, which clears setuid), xattrs and times.
func (s *seeder) setMeta(src, dst string, st *syscall.Stat_t, mode fs.FileMode) error {
	if err := os.Lchown(dst, int(st.Uid), int(st.Gid)); err != nil {
		return fmt.Errorf("seed: %w", err)
	}
	if mode&fs.ModeSymlink == 0 {
		if err := unix.Chmod(dst, st.Mode&0o7777); err != nil {
			return fmt.Errorf("seed: chmod %s: %w", dst, err)
		}
	}
	// After chown, which drops security.capability.
	if err := copyXattrs(src, dst); err != nil {
		return err
	}
	ts := []unix.Timespec{unix.Timespec(st.Atim), unix.Timespec(st.Mtim)}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, dst, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("seed: set times of %s: %w", dst, err)
	}
	return nil
}

func copyXattrs(src, dst string) error {
	size, err := unix.Llistxattr(src, nil)
	if err != nil || size == 0 {
		return nil // no xattrs, or the source filesystem has none
	}
	list := make([]byte, size)
	size, err = unix.Llistxattr(src, list)
	if err != nil {
		return nil
	}
	for _, name := range splitNul(list[:size]) {
		vsize, err := unix.Lgetxattr(src, name, nil)
		if err != nil {
			continue
		}
		val := make([]byte, vsize)
		vsize, err = unix.Lgetxattr(src, name, val)
		if err != nil {
			continue
		}
		if err := unix.Lsetxattr(dst, name, val[:vsize], 0); err != nil {
			return fmt.Errorf("seed: set xattr %s on %s: %w", name, dst, err)
		}
	}
	return nil
}

func splitNul(b []byte) []string {
	var out []string
	for len(b) > 0 {
		i := 0
		for i < len(b) && b[i] != 0 {
			i++
		}
		if i > 0 {
			out = append(out, string(b[:i]))
		}
		if i == len(b) {
			break
		}
		b = b[i+1:]
	}
	return out
}
