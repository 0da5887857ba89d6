package cluster

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kilnproject/kiln/internal/atomicfile"
)

// errNotEmpty is returned when the output directory holds something and force is off.
var errNotEmpty = errors.New("is not empty")

// Init generates a cluster (generate) and writes it to dir. A dir that exists and is not
// empty is refused unless force is set, and then replaced as a whole. Everything is
// written into a temporary directory next to dir and renamed into place at the end, so
// dir is never half-written. dir itself is made 0700: it holds the cluster's keys.
func Init(dir string, s Spec, force bool, now time.Time) (*Cluster, error) {
	if dir == "" {
		return nil, errors.New("-o: output directory is required")
	}
	dir = filepath.Clean(dir)
	exists, err := checkTarget(dir, force)
	if err != nil {
		return nil, err
	}
	c, err := generate(s, now)
	if err != nil {
		return nil, err
	}
	if err := replaceDir(dir, exists, c.Files); err != nil {
		return nil, err
	}
	return c, nil
}

// checkTarget reports whether dir exists, refusing a non-directory and, without force,
// a non-empty directory.
func checkTarget(dir string, force bool) (bool, error) {
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("output directory: %w", err)
	case !fi.IsDir():
		return false, fmt.Errorf("output directory %s exists and is not a directory", dir)
	}
	f, err := os.Open(dir)
	if err != nil {
		return false, fmt.Errorf("output directory: %w", err)
	}
	defer f.Close()
	if _, err := f.Readdirnames(1); errors.Is(err, io.EOF) {
		return true, nil
	} else if err != nil {
		return false, fmt.Errorf("output directory %s: %w", dir, err)
	}
	if !force {
		return false, fmt.Errorf("output directory %s %w (it may hold another cluster's keys; --force replaces it)", dir, errNotEmpty)
	}
	return true, nil
}

func replaceDir(dir string, exists bool, files []file) (err error) {
	parent, base := filepath.Dir(dir), filepath.Base(dir)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return fmt.Errorf("output directory: %w", err)
	}
	tmp, err := os.MkdirTemp(parent, "."+base+".tmp-")
	if err != nil {
		return fmt.Errorf("output directory: %w", err)
	}
	defer func() {
		if err != nil {
			os.RemoveAll(tmp)
		}
	}()
	for _, f := range files {
		p := filepath.Join(tmp, filepath.FromSlash(f.Path))
		if err := atomicfile.Write(p, f.Data, atomicfile.Options{Mode: f.Mode, DirMode: 0o755}); err != nil {
			return err
		}
	}
	// MkdirTemp made tmp 0700, as the finished directory should be.
	if exists {
		if err := swapDirs(tmp, dir); err != nil {
			return err
		}
		// tmp now holds the old directory.
		if err := os.RemoveAll(tmp); err != nil {
			return fmt.Errorf("output directory: remove the old one (now %s): %w", tmp, err)
		}
	} else if err := os.Rename(tmp, dir); err != nil {
		return fmt.Errorf("output directory: %w", err)
	}
	if d, err := os.Open(parent); err == nil {
		d.Sync()
		d.Close()
	}
	return nil
}

// swapDirs exchanges two directories in one step (renameat2 RENAME_EXCHANGE), so dir is
// never missing. Where the file system cannot exchange, the old dir is moved aside
// first (to a name that did not exist), then the new one into place.
func swapDirs(tmp, dir string) error {
	err := unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, dir, unix.RENAME_EXCHANGE)
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOSYS) && !errors.Is(err, unix.EOPNOTSUPP) {
		return fmt.Errorf("output directory: replace %s: %w", dir, err)
	}
	aside := tmp + ".old"
	if err := unix.Renameat2(unix.AT_FDCWD, dir, unix.AT_FDCWD, aside, unix.RENAME_NOREPLACE); err != nil {
		return fmt.Errorf("output directory: move %s aside: %w", dir, err)
	}
	if err := os.Rename(tmp, dir); err != nil {
		if rerr := os.Rename(aside, dir); rerr != nil {
			return fmt.Errorf("output directory: %w (and restoring the old one from %s: %v)", err, aside, rerr)
		}
		return fmt.Errorf("output directory: %w", err)
	}
	return os.Rename(aside, tmp)
}
