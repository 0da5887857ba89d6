// Package atomicfile writes files so that a reader, or a power cut, sees either the old file
// or the whole new one, never a part of it.
//
// The data goes to a temporary file in the destination's directory, created readable by its
// owner only. Before the file gets its name it is given its owner and mode and fsync'd; then it
// is renamed over the destination and the directory is fsync'd. Any failure removes the
// temporary file, so nothing half-written remains. A symlink at the destination is replaced,
// not followed.
//
// Writers inside a node's root resolve the destination's directory themselves (with rootpath,
// which gives absolute symlinks the root's meaning) and write there through the same os.Root
// with WriteIn, or PlaceIn for links; everything else uses Write, Copy or Create with ordinary
// paths.
package atomicfile

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// Options say what the written file is like.
type Options struct {
	// Mode is the file's mode: permission bits and setuid, setgid and sticky. The umask does
	// not apply.
	Mode fs.FileMode
	// Chown gives the file UID and GID (before Mode: chown clears setuid and setgid). Without
	// it the file belongs to whoever writes it.
	Chown    bool
	UID, GID int
	// DirMode, when set, makes Write, Copy and Create create the destination's missing
	// directories with this mode (the umask applies), as os.MkdirAll does. Without it the
	// directory must exist.
	DirMode fs.FileMode
}

// Write replaces the file at path with data. The directory must exist, unless
// opts.DirMode is set.
func Write(path string, data []byte, opts Options) error {
	f, err := createDir(filepath.Dir(path), filepath.Base(path), opts)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := f.Write(data); err != nil {
		return err
	}
	return f.Commit(filepath.Base(path))
}

// WriteIn replaces the file name (a path relative to root) with data. The directory of name
// must exist; it is reached through root, so nothing outside root is touched.
func WriteIn(root *os.Root, name string, data []byte, opts Options) error {
	name = path.Clean(name)
	dir, base := path.Dir(name), path.Base(name)
	f, err := create(root, dir, dir, base, opts)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := f.Write(data); err != nil {
		return err
	}
	return f.Commit(base)
}

// UpdateIn is WriteIn that leaves a file alone when it already holds exactly data with
// opts.Mode, and creates name's missing directories (0755) inside root. It reports whether
// it wrote.
func UpdateIn(root *os.Root, name string, data []byte, opts Options) (changed bool, err error) {
	if old, err := root.ReadFile(name); err == nil && bytes.Equal(old, data) {
		if fi, err := root.Lstat(name); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm() == opts.Mode.Perm() {
			return false, nil
		}
	}
	if err := root.MkdirAll(path.Dir(path.Clean(name)), 0o755); err != nil {
		return false, err
	}
	if err := WriteIn(root, name, data, opts); err != nil {
		return false, err
	}
	return true, nil
}

// Copy replaces the file dst with a copy of the file src. The directory of dst must exist,
// unless opts.DirMode is set.
func Copy(src, dst string, opts Options) error {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("copy %s: %w", src, err)
	}
	defer in.Close()
	f, err := createDir(filepath.Dir(dst), filepath.Base(dst), opts)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := f.f.ReadFrom(in); err != nil {
		return fmt.Errorf("copy %s to %s: %w", src, dst, err)
	}
	return f.Commit(filepath.Base(dst))
}

// PlaceIn puts a node that create makes (a symlink, a hard link) at name, a path relative
// to root whose directory exists, replacing what is there in one step: create makes it under
// tmp, a free temporary name in the same directory (relative to root); it is renamed over
// name and the directory is fsync'd. On failure the temporary node is removed.
func PlaceIn(root *os.Root, name string, create func(tmp string) error) error {
	name = path.Clean(name)
	dir := path.Dir(name)
	tmp, err := tempName(dir, path.Base(name))
	if err != nil {
		return err
	}
	err = create(tmp)
	if err == nil {
		err = root.Rename(tmp, name)
	}
	if err != nil {
		_ = root.Remove(tmp)
		return fmt.Errorf("replace %s: %w", name, err)
	}
	f := File{root: root, dir: dir, shown: dir}
	return f.syncDir()
}

// TempPrefix starts the name of every file being written: one a crash left behind is not a
// finished file.
const TempPrefix = ".kiln-"

// tempName returns a fresh name in dir for a file that becomes base.
func tempName(dir, base string) (string, error) {
	var rnd [6]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return "", fmt.Errorf("temporary name: %w", err)
	}
	return path.Join(dir, TempPrefix+base+"."+hex.EncodeToString(rnd[:])), nil
}

// File is a file being written under a temporary name in a directory. Commit gives it its
// name; Close without Commit removes it.
type File struct {
	root    *os.Root
	ownRoot bool     // root was opened by Create and is closed with the file
	dir     string   // the directory, relative to root
	shown   string   // the directory as errors name it
	tmp     string   // the temporary file, relative to root
	f       *os.File // nil once committed or closed
	opts    Options
}

// Create starts a file in the existing directory dir.
func Create(dir string, opts Options) (*File, error) {
	return createDir(dir, "tmp", opts)
}

// createDir starts a file in dir; hint goes into the temporary name.
func createDir(dir, hint string, opts Options) (*File, error) {
	if opts.DirMode != 0 {
		if err := os.MkdirAll(dir, opts.DirMode); err != nil {
			return nil, fmt.Errorf("create directory %s: %w", dir, err)
		}
	}
	r, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("create file in %s: %w", dir, err)
	}
	f, err := create(r, ".", dir, hint, opts)
	if err != nil {
		r.Close()
		return nil, err
	}
	f.ownRoot = true
	return f, nil
}

func create(root *os.Root, dir, shown, hint string, opts Options) (*File, error) {
	tmp, err := tempName(dir, hint)
	if err != nil {
		return nil, err
	}
	f, err := root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, opts.Mode.Perm()&0o700)
	if err != nil {
		return nil, fmt.Errorf("create temporary file in %s: %w", shown, err)
	}
	return &File{root: root, dir: dir, shown: shown, tmp: tmp, f: f, opts: opts}, nil
}

// Write appends p to the file.
func (f *File) Write(p []byte) (int, error) {
	if f.f == nil {
		return 0, fmt.Errorf("write in %s: %w", f.shown, fs.ErrClosed)
	}
	n, err := f.f.Write(p)
	if err != nil {
		err = fmt.Errorf("write in %s: %w", f.shown, err)
	}
	return n, err
}

// Commit gives the file its owner and mode, fsyncs it, renames it to name (a file name in
// the directory, replacing what is there) and fsyncs the directory. On failure the file is
// removed. The File is finished either way.
func (f *File) Commit(name string) error {
	if f.f == nil {
		return fmt.Errorf("write in %s: %w", f.shown, fs.ErrClosed)
	}
	if name == "" || name == "." || name == ".." || strings.Contains(name, "/") {
		f.Close()
		return fmt.Errorf("write in %s: %q is not a file name", f.shown, name)
	}
	target := path.Join(f.dir, name)
	shown := filepath.Join(f.shown, name)
	err := f.finish()
	f.f = nil
	if err == nil {
		err = f.root.Rename(f.tmp, target)
	}
	if err != nil {
		_ = f.root.Remove(f.tmp)
		f.closeRoot()
		return fmt.Errorf("write %s: %w", shown, err)
	}
	err = f.syncDir()
	f.closeRoot()
	return err
}

// finish sets owner and mode, fsyncs and closes the temporary file.
func (f *File) finish() error {
	err := f.setMeta()
	if err == nil {
		err = f.f.Sync()
	}
	return errors.Join(err, f.f.Close())
}

func (f *File) setMeta() error {
	if f.opts.Chown {
		if err := f.f.Chown(f.opts.UID, f.opts.GID); err != nil {
			return err
		}
	}
	return f.f.Chmod(f.opts.Mode)
}

func (f *File) syncDir() error {
	d, err := f.root.Open(f.dir)
	if err == nil {
		err = errors.Join(d.Sync(), d.Close())
	}
	if err != nil {
		return fmt.Errorf("sync directory %s: %w", f.shown, err)
	}
	return nil
}

// Close removes the file unless it was committed. It is safe to call more than once.
func (f *File) Close() error {
	if f.f == nil {
		return nil
	}
	err := f.f.Close()
	f.f = nil
	if rerr := f.root.Remove(f.tmp); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
		err = errors.Join(err, rerr)
	}
	f.closeRoot()
	return err
}

func (f *File) closeRoot() {
	if f.ownRoot {
		f.root.Close()
	}
}

var _ io.WriteCloser = (*File)(nil)
