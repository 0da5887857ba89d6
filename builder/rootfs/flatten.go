package rootfs

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/klauspost/compress/zstd"
)

// Owner is the ownership and mode an entry of the tree must have in the image.
type Owner struct {
	UID, GID int
	Mode     os.FileMode // permission and setuid/setgid/sticky bits
}

// Tree is an assembled root directory on the host plus what the host filesystem could not hold.
type Tree struct {
	Dir string
	// Owners lists entries (paths relative to Dir, slash separated, no leading slash) whose owner
	// is not root:root. Everything else in the image is owned by root.
	Owners map[string]Owner
}

// Flatten extracts the layers of img, lowest first, into dir, honouring OCI whiteouts. Each
// layer's compressed bytes are hashed while they are read and must match the digest named in the
// manifest; on a mismatch Flatten fails (the caller removes dir).
func Flatten(img v1.Image, dir string) (*Tree, error) {
	layers, err := img.Layers()
	if err != nil {
		return nil, fmt.Errorf("list layers: %w", err)
	}
	t := &Tree{Dir: dir, Owners: map[string]Owner{}}
	for i, l := range layers {
		d, err := l.Digest()
		if err != nil {
			return nil, fmt.Errorf("layer %d: digest: %w", i, err)
		}
		if err := t.applyLayer(l); err != nil {
			return nil, fmt.Errorf("layer %d (%s): %w", i, d, err)
		}
	}
	return t, nil
}

func (t *Tree) applyLayer(l v1.Layer) error {
	want, err := l.Digest()
	if err != nil {
		return err
	}
	mt, err := l.MediaType()
	if err != nil {
		return err
	}
	rc, err := l.Compressed()
	if err != nil {
		return err
	}
	defer rc.Close()
	h := sha256.New()
	tee := io.TeeReader(bufio.NewReaderSize(rc, 1<<20), h)
	var r io.Reader
	switch mt {
	case types.OCILayer, types.DockerLayer, types.OCIRestrictedLayer, types.DockerForeignLayer:
		zr, err := gzip.NewReader(tee)
		if err != nil {
			return fmt.Errorf("gunzip: %w", err)
		}
		defer zr.Close()
		r = zr
	case types.OCILayerZStd:
		zr, err := zstd.NewReader(tee)
		if err != nil {
			return fmt.Errorf("zstd: %w", err)
		}
		defer zr.Close()
		r = zr
	case types.OCIUncompressedLayer, types.DockerUncompressedLayer:
		r = tee
	default:
		return fmt.Errorf("unsupported layer media type %q", mt)
	}
	if err := t.applyTar(r); err != nil {
		return err
	}
	// Drain what the tar reader left (padding, compression trailer) so the hash covers the blob.
	if _, err := io.Copy(io.Discard, tee); err != nil {
		return fmt.Errorf("read layer: %w", err)
	}
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != want.String() {
		return fmt.Errorf("layer digest mismatch: want %s, got %s", want, got)
	}
	return nil
}

// applyTar writes the entries of one layer into the tree.
func (t *Tree) applyTar(r io.Reader) error {
	tr := tar.NewReader(r)
	type dirTime struct {
		path string
		t    time.Time
	}
	var dirs []dirTime
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("read tar: %w", err)
		}
		rel, err := cleanRel(hdr.Name)
		if err != nil {
			return err
		}
		if rel == "" {
			continue // the root itself
		}
		dir, base := path.Split(rel)
		if base == ".wh..wh..opq" {
			if err := t.clearDir(dir); err != nil {
				return err
			}
			continue
		}
		if strings.HasPrefix(base, ".wh.") {
			victim := path.Join(dir, strings.TrimPrefix(base, ".wh."))
			if err := t.remove(victim); err != nil {
				return err
			}
			continue
		}
		if err := t.writeEntry(rel, hdr, tr); err != nil {
			return fmt.Errorf("%s: %w", hdr.Name, err)
		}
		if hdr.Typeflag == tar.TypeDir {
			dirs = append(dirs, dirTime{rel, hdr.ModTime})
		}
	}
	// Directory times last: writing children changes them.
	for _, d := range dirs {
		_ = os.Chtimes(filepath.Join(t.Dir, d.path), d.t, d.t)
	}
	return nil
}

// cleanRel turns a tar entry name into a slash-separated path relative to the root and refuses
// names that would escape it.
func cleanRel(name string) (string, error) {
	p := path.Clean("/" + name)
	if p == "/" {
		return "", nil
	}
	if strings.Contains(name, "..") {
		for _, part := range strings.Split(name, "/") {
			if part == ".." {
				return "", fmt.Errorf("tar entry %q escapes the root", name)
			}
		}
	}
	return strings.TrimPrefix(p, "/"), nil
}

// resolveDir returns the host path of a relative directory, refusing symlinks that lead out.
func (t *Tree) host(rel string) (string, error) {
	dir := path.Dir(rel)
	if dir != "." {
		// Parents must be real directories inside the tree: a layer cannot redirect a write
		// through a symlink it planted earlier.
		cur := t.Dir
		for _, part := range strings.Split(dir, "/") {
			cur = filepath.Join(cur, part)
			fi, err := os.Lstat(cur)
			if err != nil {
				if errors.Is(err, os.ErrNotExist) {
					if err := os.Mkdir(cur, 0o755); err != nil {
						return "", err
					}
					continue
				}
				return "", err
			}
			if fi.Mode()&os.ModeSymlink != 0 {
				target, err := os.Readlink(cur)
				if err != nil {
					return "", err
				}
				// Resolve a symlinked parent (e.g. lib -> usr/lib) within the tree.
				relCur, _ := filepath.Rel(t.Dir, cur)
				var next string
				if filepath.IsAbs(target) {
					next = path.Clean(target)
				} else {
					next = path.Clean("/" + path.Join(path.Dir(filepath.ToSlash(relCur)), target))
				}
				rest := strings.TrimPrefix(strings.TrimPrefix(dir, filepath.ToSlash(relCur)), "/")
				return t.host(strings.TrimPrefix(path.Join(next, rest, path.Base(rel)), "/"))
			}
			if !fi.IsDir() {
				return "", fmt.Errorf("parent %s is not a directory", relCur(t.Dir, cur))
			}
		}
	}
	return filepath.Join(t.Dir, filepath.FromSlash(rel)), nil
}

func relCur(root, p string) string {
	r, _ := filepath.Rel(root, p)
	return r
}

func (t *Tree) writeEntry(rel string, hdr *tar.Header, r io.Reader) error {
	dst, err := t.host(rel)
	if err != nil {
		return err
	}
	mode := os.FileMode(hdr.Mode).Perm() | specialBits(hdr.Mode)
	if old, err := os.Lstat(dst); err == nil {
		// A directory stays a directory (its children survive); anything else is replaced.
		if !(old.IsDir() && hdr.Typeflag == tar.TypeDir) {
			if err := os.RemoveAll(dst); err != nil {
				return err
			}
		}
	}
	key := strings.TrimPrefix(filepath.ToSlash(mustRel(t.Dir, dst)), "./")
	delete(t.Owners, key)
	switch hdr.Typeflag {
	case tar.TypeDir:
		if err := os.MkdirAll(dst, 0o755); err != nil {
			return err
		}
		// The host copy stays writable for its owner (a non-root bake must be able to add
		// files below /proc's 0555, say); the image gets the real mode through Owners.
		if err := os.Chmod(dst, mode|0o700); err != nil {
			return err
		}
		if mode&0o700 != 0o700 {
			t.Owners[key] = Owner{UID: hdr.Uid, GID: hdr.Gid, Mode: mode}
		}
	case tar.TypeReg, tar.TypeRegA:
		f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
		if err != nil {
			return err
		}
		if _, err := io.Copy(f, r); err != nil {
			f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
		if err := os.Chmod(dst, mode); err != nil {
			return err
		}
	case tar.TypeSymlink:
		if err := os.Symlink(hdr.Linkname, dst); err != nil {
			return err
		}
		return nil // symlinks: owner root, no times
	case tar.TypeLink:
		target, err := cleanRel(hdr.Linkname)
		if err != nil {
			return err
		}
		src, err := t.host(target)
		if err != nil {
			return err
		}
		if err := os.Link(src, dst); err != nil {
			return err
		}
		return nil
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		// Device nodes are provided by devtmpfs at boot; the image does not carry them.
		return nil
	default:
		return fmt.Errorf("unsupported tar entry type %q", hdr.Typeflag)
	}
	if hdr.Uid != 0 || hdr.Gid != 0 {
		t.Owners[key] = Owner{UID: hdr.Uid, GID: hdr.Gid, Mode: mode}
	}
	return os.Chtimes(dst, hdr.ModTime, hdr.ModTime)
}

func mustRel(root, p string) string {
	r, err := filepath.Rel(root, p)
	if err != nil {
		return p
	}
	return r
}

func specialBits(m int64) os.FileMode {
	var out os.FileMode
	if m&04000 != 0 {
		out |= os.ModeSetuid
	}
	if m&02000 != 0 {
		out |= os.ModeSetgid
	}
	if m&01000 != 0 {
		out |= os.ModeSticky
	}
	return out
}

func (t *Tree) remove(rel string) error {
	p := filepath.Join(t.Dir, filepath.FromSlash(rel))
	for k := range t.Owners {
		if k == rel || strings.HasPrefix(k, rel+"/") {
			delete(t.Owners, k)
		}
	}
	return os.RemoveAll(p)
}

func (t *Tree) clearDir(dir string) error {
	dir = strings.TrimSuffix(dir, "/")
	p := filepath.Join(t.Dir, filepath.FromSlash(dir))
	ents, err := os.ReadDir(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range ents {
		if err := t.remove(path.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// PseudoFile writes mksquashfs pseudo definitions ("path m mode uid gid") for every entry of
// the tree: the recorded owner where there is one, root otherwise, and the mode found on disk.
// With it the image has the same ownership whoever runs the bake (files a non-root user
// extracts are owned by that user on the host). The root directory itself is set with
// mksquashfs's -root-uid/-root-gid. Output is sorted, so it is reproducible.
func (t *Tree) PseudoFile(w io.Writer) error {
	var lines []string
	err := filepath.WalkDir(t.Dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel := filepath.ToSlash(mustRel(t.Dir, p))
		if rel == "." {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		// The recorded mode wins: a non-root user cannot set setgid on a file of another group.
		o, ok := t.Owners[rel]
		if !ok {
			o = Owner{Mode: fi.Mode()}
		}
		mode := unixMode(o.Mode)
		if fi.Mode()&os.ModeSymlink != 0 {
			mode = 0o777
		}
		name := "/" + rel
		if strings.ContainsAny(name, " \t\"\\") {
			if strings.ContainsAny(name, "\"\n") {
				return fmt.Errorf("owner of %q: the name cannot be written in a mksquashfs pseudo file", name)
			}
			// mksquashfs reads a backslash as an escape, even between quotes (systemd unit
			// names such as system-systemd\x2dcryptsetup.slice have them).
			name = `"` + strings.ReplaceAll(name, `\`, `\\`) + `"`
		}
		lines = append(lines, fmt.Sprintf("%s m %04o %d %d\n", name, mode, o.UID, o.GID))
		return nil
	})
	if err != nil {
		return err
	}
	sort.Strings(lines)
	bw := bufio.NewWriter(w)
	for _, l := range lines {
		bw.WriteString(l)
	}
	return bw.Flush()
}

func unixMode(m os.FileMode) uint32 {
	out := uint32(m.Perm())
	if m&os.ModeSetuid != 0 {
		out |= 04000
	}
	if m&os.ModeSetgid != 0 {
		out |= 02000
	}
	if m&os.ModeSticky != 0 {
		out |= 01000
	}
	return out
}
