package netboot

import (
	"bufio"
	"crypto"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/kilnproject/kiln/builder/provenance"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

// servedFile is one file the server hands out under /images/, checked at startup.
type servedFile struct {
	// name is its path under /images/ ("metal-worker-pxe/vmlinuz", "metal-worker.raw").
	name string
	// path is where it is on disk.
	path    string
	sha256  string
	size    int64
	modTime time.Time
	// ident is the file as it was hashed; a request finding another is refused.
	ident fileIdent
}

// etag is the file's strong ETag: its sha256, computed once at startup.
func (f *servedFile) etag() string { return `"sha256-` + f.sha256 + `"` }

// image is one <image>-<role> of the served directory.
type image struct {
	name string
	md   *nodeimage.Metadata
	// kernel, initrd and rootfs are its pxe files.
	kernel, initrd, rootfs *servedFile
}

// fileTable hashes the served directory's files once and refuses the start when one is
// missing or differs from the digest the bake recorded.
type fileTable struct {
	dir    string
	log    *slog.Logger
	files  map[string]*servedFile // by name
	images map[string]*image      // by <image>-<role>
	// key, when set, is the public key every image's signed provenance must verify with.
	key crypto.PublicKey
}

func newFileTable(dir string, log *slog.Logger) *fileTable {
	return &fileTable{dir: dir, log: log, files: map[string]*servedFile{}, images: map[string]*image{}}
}

// image returns <image>-<role>'s pxe files, reading <image>-<role>.json and checking every
// file of its pxe directory the first time.
func (t *fileTable) image(name string) (*image, error) {
	if im, ok := t.images[name]; ok {
		return im, nil
	}
	mdPath := filepath.Join(t.dir, name+".json")
	data, err := readRegular(mdPath)
	if err != nil {
		return nil, fmt.Errorf("image %s: %w (bake it into %s)", name, err, t.dir)
	}
	if t.key != nil {
		// The metadata, signed, vouches for every file served from it: each is hashed
		// against the digest it records before the server starts.
		signed, err := provenance.VerifyImage(mdPath, data, t.key)
		if err != nil {
			return nil, fmt.Errorf("image %s: refusing to serve an image whose provenance does not verify: %w", name, err)
		}
		t.log.Info("provenance verified", "image", name, "provenance", filepath.Base(signed.File), "sha256", signed.SHA256)
	}
	md := new(nodeimage.Metadata)
	if err := json.Unmarshal(data, md); err != nil {
		return nil, fmt.Errorf("image %s: %s: %w", name, mdPath, err)
	}
	if md.PXE == nil {
		return nil, fmt.Errorf("image %s: %s has no pxe output (list pxe in the definition's formats and bake again)", name, mdPath)
	}
	if want := name + nodeimage.PXEDirSuffix; md.PXE.Dir != want {
		return nil, fmt.Errorf("image %s: %s: pxe.dir is %q, want %q", name, mdPath, md.PXE.Dir, want)
	}
	im := &image{name: name, md: md}
	// The metadata is served too, as what a node's kiln-init update reads first.
	sum := sha256.Sum256(data)
	if _, err := t.add(name+".json", hex.EncodeToString(sum[:]), int64(len(data))); err != nil {
		return nil, fmt.Errorf("image %s: %w", name, err)
	}
	for _, f := range []struct {
		rec *nodeimage.PXEFile
		dst **servedFile
	}{{&md.PXE.Kernel, &im.kernel}, {&md.PXE.Initrd, &im.initrd}, {&md.PXE.RootFS, &im.rootfs}} {
		if *f.dst, err = t.add(path.Join(md.PXE.Dir, f.rec.File), f.rec.SHA256, f.rec.Size); err != nil {
			return nil, fmt.Errorf("image %s: %w", name, err)
		}
	}
	t.images[name] = im
	return im, nil
}

// installImage returns the file an install group writes to disk: file (a name in the
// directory) or, when file is "", the image's raw output. Its sha256 comes from the image's
// outputs, or for a file the bake did not write (a compressed raw image) from
// <file>.sha256 beside it (sha256sum's format).
func (t *fileTable) installImage(im *image, file string) (*servedFile, error) {
	if file == "" {
		for _, o := range im.md.Outputs {
			if o.Format == "raw" {
				file = o.File
			}
		}
		if file == "" {
			return nil, fmt.Errorf("image %s: %s.json lists no raw output to install (add raw to the definition's formats)", im.name, im.name)
		}
	}
	for _, o := range im.md.Outputs {
		if o.File == file && o.SHA256 != "" {
			return t.add(file, o.SHA256, o.Size)
		}
	}
	if t.key != nil {
		return nil, fmt.Errorf("install image %s: not among %s.json's outputs, so no signed provenance covers it (--key): install the bake's raw output", file, im.name)
	}
	sum, err := readSHA256File(filepath.Join(t.dir, file+".sha256"), file)
	if err != nil {
		return nil, fmt.Errorf("install image %s: not among %s.json's outputs, and %w", file, im.name, err)
	}
	return t.add(file, sum, -1)
}

// readSHA256File reads a digest in sha256sum's format ("<hex>  <name>") for file.
func readSHA256File(p, file string) (string, error) {
	f, _, err := openRegular(os.Stat, os.OpenFile, p)
	if err != nil {
		return "", fmt.Errorf("no digest beside it: %w (write it with sha256sum %s > %s.sha256)", err, file, file)
	}
	defer f.Close()
	line, err := bufio.NewReader(io.LimitReader(f, 4096)).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return "", fmt.Errorf("%s: %w", p, err)
	}
	fields := strings.Fields(line)
	if len(fields) == 0 || len(fields[0]) != 64 {
		return "", fmt.Errorf("%s does not start with a sha256 (64 hex digits)", p)
	}
	if len(fields) > 1 && filepath.Base(strings.TrimPrefix(fields[1], "*")) != file {
		return "", fmt.Errorf("%s is the digest of %s, not of %s", p, fields[1], file)
	}
	return strings.ToLower(fields[0]), nil
}

// add hashes the file name (relative to the directory) once and compares it with want
// (hex) and, when size >= 0, with size.
func (t *fileTable) add(name, want string, size int64) (*servedFile, error) {
	if f, ok := t.files[name]; ok {
		if f.sha256 != strings.ToLower(want) {
			return nil, fmt.Errorf("%s: two records disagree on its sha256 (%s, %s)", f.path, f.sha256, want)
		}
		return f, nil
	}
	p := filepath.Join(t.dir, filepath.FromSlash(name))
	start := time.Now()
	f, err := hashFile(p)
	if err != nil {
		return nil, err
	}
	switch {
	case want == "":
		return nil, fmt.Errorf("%s: no sha256 recorded for it", p)
	case f.sha256 != strings.ToLower(want):
		return nil, fmt.Errorf("%s: sha256 %s, but %s was recorded: the file changed since the bake", p, f.sha256, want)
	case size >= 0 && f.size != size:
		return nil, fmt.Errorf("%s: %d bytes, but %d were recorded", p, f.size, size)
	}
	f.name = name
	t.files[name] = f
	t.log.Info("file verified", "file", p, "bytes", f.size, "seconds", time.Since(start).Seconds())
	return f, nil
}

// hashFile reads p once: its sha256, size and modification time. A file that changed
// while it was read is refused.
func hashFile(p string) (*servedFile, error) {
	fh, fi, err := openRegular(os.Stat, os.OpenFile, p)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	h := sha256.New()
	if _, err := io.Copy(h, fh); err != nil {
		return nil, fmt.Errorf("read %s: %w", p, err)
	}
	if after, err := fh.Stat(); err != nil || identOf(after) != identOf(fi) {
		return nil, fmt.Errorf("%s changed while it was hashed", p)
	}
	return &servedFile{path: p, sha256: hex.EncodeToString(h.Sum(nil)), size: fi.Size(), modTime: fi.ModTime(), ident: identOf(fi)}, nil
}

// fileIdent tells that a file's contents may have changed without reading them: a file
// renamed or copied over it is another inode, and a write to it moves its ctime, which
// (unlike its mtime) cannot be set back.
type fileIdent struct {
	dev, ino     uint64
	size         int64
	mtime, ctime int64 // ns since the epoch
}

func identOf(fi fs.FileInfo) fileIdent {
	id := fileIdent{size: fi.Size(), mtime: fi.ModTime().UnixNano()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		sec, nsec := st.Ctim.Unix()
		id.dev, id.ino, id.ctime = uint64(st.Dev), st.Ino, sec*1e9+nsec
	}
	return id
}

// readRegular reads the regular file p (openRegular: a FIFO is refused, not waited on).
func readRegular(p string) ([]byte, error) {
	f, _, err := openRegular(os.Stat, os.OpenFile, p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(f)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", p, err)
	}
	return data, nil
}

// errNotRegular is openRegular's refusal of anything but a regular file.
var errNotRegular = errors.New("not a regular file")

// openRegular opens name for reading if it is a regular file, with stat and open (os's, or
// an os.Root's). Anything else is refused before it is opened: opening a FIFO waits for a
// writer, a device may do anything. The open is non-blocking, so that a FIFO put in its
// place after the stat cannot hold it either, and what it opened is checked again.
func openRegular(stat func(string) (fs.FileInfo, error), open func(string, int, fs.FileMode) (*os.File, error), name string) (*os.File, fs.FileInfo, error) {
	fi, err := stat(name)
	if err != nil {
		return nil, nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, nil, fmt.Errorf("%s is %s, %w", name, kindOf(fi.Mode()), errNotRegular)
	}
	f, err := open(name, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil, nil, err
	}
	if fi, err = f.Stat(); err != nil || !fi.Mode().IsRegular() {
		f.Close()
		if err != nil {
			return nil, nil, err
		}
		return nil, nil, fmt.Errorf("%s is %s, %w", name, kindOf(fi.Mode()), errNotRegular)
	}
	return f, fi, nil
}

// kindOf names a file type that is not a regular file's.
func kindOf(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&fs.ModeNamedPipe != 0:
		return "a FIFO"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeDevice != 0:
		return "a device"
	case m&fs.ModeSymlink != 0:
		return "a symbolic link"
	}
	return "of type " + m.Type().String()
}
