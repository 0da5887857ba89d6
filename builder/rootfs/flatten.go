package rootfs

import (
	"archive/tar"
	"bufio"
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

	"github.com/kilnproject/kiln/builder/artifact"
	"github.com/kilnproject/kiln/initd/rootpath"
	"github.com/kilnproject/kiln/internal/decompress"
)

// Owner is the ownership and mode an entry of the tree must have in the image.
type Owner struct {
	UID, GID int
	Mode     os.FileMode // permission and setuid/setgid/sticky bits
}

// Tree is an assembled root directory on the host plus what the host filesystem could not hold.
//
// Every change the tree's methods make goes through an os.Root opened on Dir, after the path was
// resolved by rootpath.Resolve the way the node will resolve it: a symlink planted by a layer (even
// one pointing at / or climbing with ..) can redirect a write to another place in the tree, never
// out of it.
type Tree struct {
	Dir string
	// Owners lists entries (paths relative to Dir, slash separated, no leading slash) whose owner
	// is not root:root. Everything else in the image is owned by root.
	Owners map[string]Owner

	root *os.Root
	// dirs caches resolved parent directories (image path -> symlink-free path) and roots
	// holds os.Roots opened on some of them, so that an entry is written with calls on its
	// name alone rather than walking its whole path again for each. Both are dropped whenever
	// an entry is removed or a symlink is made, the only changes that can alter a resolution
	// already made.
	dirs  map[string]string
	roots map[string]*os.Root
	// exact is FlattenOptions.Exact while layers are applied.
	exact bool
}

// maxRoots bounds the directories kept open at once.
const maxRoots = 64

// dirRoot returns an os.Root on the symlink-free directory d (relative to the tree).
func (t *Tree) dirRoot(d string) (*os.Root, error) {
	if d == "." || d == "" {
		return t.openRoot()
	}
	if r, ok := t.roots[d]; ok {
		return r, nil
	}
	root, err := t.openRoot()
	if err != nil {
		return nil, err
	}
	r, err := root.OpenRoot(d)
	if err != nil {
		return nil, err
	}
	if len(t.roots) >= maxRoots || t.roots == nil {
		t.closeRoots()
		t.roots = map[string]*os.Root{}
	}
	t.roots[d] = r
	return r, nil
}

func (t *Tree) closeRoots() {
	for _, r := range t.roots {
		r.Close()
	}
	clear(t.roots)
}

// FlattenOptions tune Flatten.
type FlattenOptions struct {
	// Cache receives each layer blob, hashed while it is written, before any of its entries is
	// applied; a layer already cached (verified when it was stored) is not read again from the
	// image. Without a cache the blob is verified into a temporary file beside dir, removed after.
	Cache *artifact.Cache
	// MaxUnpacked bounds what one layer unpacks to: its decompressed tar stream, and separately
	// the sum of its file sizes (sparse files count their holes). Zero means
	// artifact.MaxUnpacked.
	MaxUnpacked int64
	// DiffIDs, when set, are the layers' uncompressed digests, lowest first (an image config's
	// rootfs.diff_ids, which a container runtime keys its unpacked layers by): each layer's
	// decompressed tar stream must hash to its entry.
	DiffIDs []v1.Hash
	// Exact refuses, with an *InexactError, entries the tree cannot reproduce as the layer
	// says — extended attributes (file capabilities, say), device nodes and FIFOs — which
	// Flatten otherwise leaves out (a root filesystem gets /dev from devtmpfs at boot).
	Exact bool
}

// InexactError is FlattenWith's refusal, with FlattenOptions.Exact, of an entry it cannot
// reproduce.
type InexactError struct {
	Entry string // the tar entry's name
	What  string // what it carries
}

func (e *InexactError) Error() string {
	return fmt.Sprintf("%s: %s cannot be reproduced in the tree", e.Entry, e.What)
}

// Flatten extracts the layers of img, lowest first, into dir, honouring OCI whiteouts. It is
// FlattenWith without a cache.
func Flatten(img v1.Image, dir string) (*Tree, error) {
	return FlattenWith(img, dir, FlattenOptions{})
}

// FlattenWith extracts the layers of img, lowest first, into dir, honouring OCI whiteouts. Each
// layer's compressed bytes are hashed in full and must match the digest named in the manifest
// before any entry of the layer is applied; on a mismatch, an entry that would leave the tree, a
// symlink loop or a layer that unpacks past the bound, FlattenWith fails naming the layer (and the
// entry) and the caller removes dir.
func FlattenWith(img v1.Image, dir string, o FlattenOptions) (*Tree, error) {
	layers, err := img.Layers()
	if err != nil {
		return nil, fmt.Errorf("list layers: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	if o.DiffIDs != nil && len(o.DiffIDs) != len(layers) {
		return nil, fmt.Errorf("%d layers, but %d diff IDs", len(layers), len(o.DiffIDs))
	}
	t := &Tree{Dir: dir, Owners: map[string]Owner{}, exact: o.Exact}
	defer func() { t.exact = false }()
	if _, err := t.openRoot(); err != nil {
		return nil, err
	}
	max := o.MaxUnpacked
	if max <= 0 {
		max = artifact.MaxUnpacked
	}
	spool := o.Cache
	if spool == nil {
		tmp, err := os.MkdirTemp(filepath.Dir(filepath.Clean(dir)), ".layers-")
		if err != nil {
			return nil, fmt.Errorf("verify layers: %w", err)
		}
		defer os.RemoveAll(tmp)
		spool = artifact.NewCache(tmp)
	}
	for i, l := range layers {
		d, err := l.Digest()
		if err != nil {
			return nil, fmt.Errorf("layer %d: digest: %w", i, err)
		}
		var diffID v1.Hash
		if o.DiffIDs != nil {
			diffID = o.DiffIDs[i]
		}
		if err := t.applyLayer(img, l, d, diffID, spool, max); err != nil {
			t.closeRoots()
			return nil, fmt.Errorf("layer %d (%s): %w", i, d, err)
		}
	}
	t.closeRoots()
	return t, nil
}

func (t *Tree) openRoot() (*os.Root, error) {
	if t.root == nil {
		r, err := os.OpenRoot(t.Dir)
		if err != nil {
			return nil, fmt.Errorf("open tree: %w", err)
		}
		t.root = r
	}
	return t.root, nil
}

// verifiedBlob returns the path of the layer's compressed blob in c, storing it there first
// (hashed as it is written) unless c holds it already.
func verifiedBlob(l v1.Layer, want v1.Hash, c *artifact.Cache) (string, error) {
	if want.Algorithm != "sha256" {
		return "", fmt.Errorf("layer digest %s is not sha256", want)
	}
	if p, ok := c.Has(want.Hex); ok {
		return p, nil
	}
	rc, err := l.Compressed()
	if err != nil {
		return "", err
	}
	defer rc.Close()
	p, err := c.PutBlob(want.Hex, rc)
	var mm *artifact.MismatchError
	if errors.As(err, &mm) {
		return "", fmt.Errorf("layer digest mismatch: want %s, got sha256:%s", want, mm.Got)
	}
	return p, err
}

// layerBlob returns the path of the layer's verified compressed blob in c: fetched with the
// cache's download retry when img comes from a registry, read once from the image otherwise.
func layerBlob(img v1.Image, l v1.Layer, want v1.Hash, c *artifact.Cache) (string, error) {
	r, ok := img.(*registryImage)
	if !ok {
		return verifiedBlob(l, want, c)
	}
	size, err := l.Size()
	if err != nil {
		return "", fmt.Errorf("size: %w", err)
	}
	return r.fetchLayer(c, v1.Descriptor{Digest: want, Size: size})
}

// applyLayer applies the layer whose compressed blob is want; a non-zero diffID is what its
// decompressed stream must hash to.
func (t *Tree) applyLayer(img v1.Image, l v1.Layer, want, diffID v1.Hash, c *artifact.Cache, max int64) error {
	mt, err := l.MediaType()
	if err != nil {
		return err
	}
	blob, err := layerBlob(img, l, want, c)
	if err != nil {
		return err
	}
	f, err := os.Open(blob)
	if err != nil {
		return err
	}
	defer f.Close()
	kind, ok := decompress.ByMediaType(mt)
	if !ok {
		return fmt.Errorf("unsupported layer media type %q", mt)
	}
	r, err := decompress.Open(bufio.NewReaderSize(f, 1<<20), kind)
	if err != nil {
		if kind == decompress.Gzip {
			return fmt.Errorf("gunzip: %w", err)
		}
		return fmt.Errorf("%s: %w", kind, err)
	}
	defer r.Close()
	if diffID == (v1.Hash{}) {
		return t.applyTar(artifact.LimitUnpacked(r, max))
	}
	if diffID.Algorithm != "sha256" {
		return fmt.Errorf("diff ID %s is not sha256", diffID)
	}
	sum := sha256.New()
	u := artifact.LimitUnpacked(io.TeeReader(r, sum), max)
	if err := t.applyTar(u); err != nil {
		return err
	}
	// The tar reader stops at the end-of-archive marker; the digest covers the whole stream.
	if _, err := io.Copy(io.Discard, u); err != nil {
		return err
	}
	if got := hex.EncodeToString(sum.Sum(nil)); got != diffID.Hex {
		return fmt.Errorf("uncompressed layer is sha256:%s, the image config says %s", got, diffID)
	}
	return nil
}

// applyTar writes the entries of one layer into the tree.
func (t *Tree) applyTar(r *artifact.Unpacked) error {
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
		if err := r.AddFile(hdr); err != nil {
			return fmt.Errorf("%s: %w", hdr.Name, err)
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
				return fmt.Errorf("%s: %w", hdr.Name, err)
			}
			continue
		}
		if victim, ok := strings.CutPrefix(base, ".wh."); ok {
			if victim == "" || victim == "." || victim == ".." {
				return fmt.Errorf("%s: whiteout names no entry", hdr.Name)
			}
			if err := t.whiteout(dir, victim); err != nil {
				return fmt.Errorf("%s: %w", hdr.Name, err)
			}
			continue
		}
		if t.exact {
			if err := exactEntry(hdr); err != nil {
				return err
			}
		}
		p, err := t.writeEntry(rel, hdr, tr)
		if err != nil {
			return fmt.Errorf("%s: %w", hdr.Name, err)
		}
		if hdr.Typeflag == tar.TypeDir {
			dirs = append(dirs, dirTime{p, hdr.ModTime})
		}
	}
	// Directory times last: writing children changes them. A later entry of the layer may have
	// replaced the directory (with a symlink, say): only directories get a time.
	for _, d := range dirs {
		if fi, err := t.root.Lstat(d.path); err != nil || !fi.IsDir() {
			continue
		}
		if err := t.root.Chtimes(d.path, d.t, d.t); err != nil {
			return fmt.Errorf("set time of /%s: %w", d.path, err)
		}
	}
	return nil
}

// exactEntry refuses an entry the tree would not reproduce as the layer says.
func exactEntry(hdr *tar.Header) error {
	switch hdr.Typeflag {
	case tar.TypeChar, tar.TypeBlock:
		return &InexactError{Entry: hdr.Name, What: "a device node"}
	case tar.TypeFifo:
		return &InexactError{Entry: hdr.Name, What: "a FIFO"}
	}
	for k := range hdr.PAXRecords {
		if name, ok := strings.CutPrefix(k, "SCHILY.xattr."); ok {
			return &InexactError{Entry: hdr.Name, What: "the extended attribute " + name}
		}
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

// resolveDir returns the symlink-free path, relative to the tree, of the directory dir (an image
// path), resolving symlinks as the node would (absolute ones from the tree's root, .. stopping
// there). With create, missing directories are made (0755); without, a missing one is an error
// wrapping fs.ErrNotExist.
func (t *Tree) resolveDir(dir string, create bool) (string, error) {
	dir = strings.Trim(dir, "/")
	if dir == "" || dir == "." {
		return ".", nil
	}
	if p, ok := t.dirs[dir]; ok {
		return p, nil
	}
	r, err := t.openRoot()
	if err != nil {
		return "", err
	}
	var mkdir func(string) error
	if create {
		mkdir = func(rel string) error { return r.Mkdir(rel, 0o755) }
	}
	p, err := rootpath.Resolve(r, dir, mkdir)
	if err != nil {
		return "", err
	}
	if fi, err := r.Lstat(p); err != nil {
		return "", err
	} else if !fi.IsDir() {
		return "", fmt.Errorf("/%s is not a directory", p)
	}
	if t.dirs == nil {
		t.dirs = map[string]string{}
	}
	t.dirs[dir] = p
	return p, nil
}

// resolveParent returns the symlink-free path of rel's parent joined with rel's last component,
// which is not followed.
func (t *Tree) resolveParent(rel string, create bool) (string, error) {
	dir, base := path.Split(rel)
	d, err := t.resolveDir(dir, create)
	if err != nil {
		return "", err
	}
	return path.Join(d, base), nil
}

// changed forgets resolutions that a removal or a new symlink may have made stale.
func (t *Tree) changed() {
	clear(t.dirs)
	t.closeRoots()
}

// writeEntry applies one tar entry at rel and returns where (relative to the tree) it landed.
func (t *Tree) writeEntry(rel string, hdr *tar.Header, r io.Reader) (string, error) {
	p, err := t.resolveParent(rel, true)
	if err != nil {
		return "", err
	}
	// p's directory has no symlinks: act on its last component through a root on it.
	pdir, name := path.Split(p)
	pdir = strings.TrimSuffix(pdir, "/")
	dr, err := t.dirRoot(pdir)
	if err != nil {
		return "", err
	}
	mode := os.FileMode(hdr.Mode).Perm() | specialBits(hdr.Mode)
	if old, err := dr.Lstat(name); err == nil {
		// A directory stays a directory (its children survive); anything else is replaced.
		if !(old.IsDir() && hdr.Typeflag == tar.TypeDir) {
			if err := t.removeResolved(p); err != nil {
				return "", err
			}
			if dr, err = t.dirRoot(pdir); err != nil {
				return "", err
			}
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return "", err
	}
	delete(t.Owners, p)
	switch hdr.Typeflag {
	case tar.TypeDir:
		if err := dr.Mkdir(name, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return "", err
		}
		// The host copy stays writable for its owner (a non-root bake must be able to add
		// files below /proc's 0555, say); the image gets the real mode through Owners.
		if err := dr.Chmod(name, mode|0o700); err != nil {
			return "", err
		}
		if mode&0o700 != 0o700 {
			t.Owners[p] = Owner{UID: hdr.Uid, GID: hdr.Gid, Mode: mode}
		}
	case tar.TypeReg, tar.TypeRegA:
		if err := writeRegular(dr, name, r, mode); err != nil {
			return "", err
		}
	case tar.TypeSymlink:
		if err := dr.Symlink(hdr.Linkname, name); err != nil {
			return "", err
		}
		return p, nil // symlinks: owner root, no times
	case tar.TypeLink:
		return p, t.hardLink(hdr.Linkname, p)
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		// Device nodes are provided by devtmpfs at boot; the image does not carry them.
		return p, nil
	default:
		return "", fmt.Errorf("unsupported tar entry type %q", hdr.Typeflag)
	}
	if hdr.Uid != 0 || hdr.Gid != 0 {
		t.Owners[p] = Owner{UID: hdr.Uid, GID: hdr.Gid, Mode: mode}
	}
	return p, dr.Chtimes(name, hdr.ModTime, hdr.ModTime)
}

// writeRegular creates the file name in dr with r's content and mode.
func writeRegular(dr *os.Root, name string, r io.Reader, mode os.FileMode) error {
	f, err := dr.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
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
	return dr.Chmod(name, mode)
}

// hardLink links p (resolved) to the entry a tar hard link names: linkname, an image path whose
// parent is resolved in the tree and whose last component is not followed.
func (t *Tree) hardLink(linkname, p string) error {
	target, err := cleanRel(linkname)
	if err != nil {
		return err
	}
	if target == "" {
		return fmt.Errorf("hard link to the root")
	}
	src, err := t.resolveParent(target, false)
	if err != nil {
		return fmt.Errorf("hard link to %s: %w", linkname, err)
	}
	root, err := t.openRoot()
	if err != nil {
		return err
	}
	return root.Link(src, p)
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

// removeResolved removes the symlink-free path p (a symlink itself, not its target) and
// everything below it.
func (t *Tree) removeResolved(p string) error {
	for k := range t.Owners {
		if k == p || strings.HasPrefix(k, p+"/") {
			delete(t.Owners, k)
		}
	}
	t.changed()
	return t.root.RemoveAll(p)
}

// whiteout removes name from the image directory dir. A directory that is not there has nothing
// to remove.
func (t *Tree) whiteout(dir, name string) error {
	d, err := t.resolveDir(dir, false)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	return t.removeResolved(path.Join(d, name))
}

// clearDir empties the image directory dir (an opaque whiteout).
func (t *Tree) clearDir(dir string) error {
	d, err := t.resolveDir(dir, false)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	f, err := t.root.Open(d)
	if err != nil {
		return err
	}
	names, err := f.Readdirnames(-1)
	f.Close()
	if err != nil {
		return err
	}
	for _, n := range names {
		if err := t.removeResolved(path.Join(d, n)); err != nil {
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
