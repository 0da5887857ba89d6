package artifact

import (
	"archive/tar"
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"sort"
	"strconv"
	"strings"

	"github.com/kilnproject/kiln/builder/spec"
	"github.com/kilnproject/kiln/internal/decompress"
)

// place puts the artifact a, whose content is the file blob, into the
// tree at root: a plain file at a.Dest with a.Mode, or unpacked by Extract
// within maxUnpacked. It returns the paths it wrote, as absolute paths in the
// image.
func place(blob string, a spec.Artifact, root string, maxUnpacked int64) ([]string, error) {
	if a.Extract != nil {
		paths, err := Extract(blob, *a.Extract, root, maxUnpacked)
		if err != nil {
			return nil, fmt.Errorf("artifact %q: %w", a.Name, err)
		}
		return paths, nil
	}
	r, err := os.OpenRoot(root)
	if err != nil {
		return nil, fmt.Errorf("artifact %q: %w", a.Name, err)
	}
	defer r.Close()
	f, err := os.Open(blob)
	if err != nil {
		return nil, fmt.Errorf("artifact %q: %w", a.Name, err)
	}
	defer f.Close()
	mode := a.Mode
	if mode == 0 {
		mode = 0o644
	}
	if err := writeFile(r, a.Dest, f, mode); err != nil {
		return nil, fmt.Errorf("artifact %q: %w", a.Name, err)
	}
	return []string{a.Dest}, nil
}

// Extract unpacks the archive blob (format x.Format) into the tree at root.
// With x.Files it writes just those members, each to its destination, and
// fails naming any member the archive lacks; otherwise it unpacks every
// member under x.Dir after dropping x.Strip leading path components.
// Permission bits (with setuid, setgid and sticky) are kept; ownership and
// times are not (the image is built with everything owned by root). A
// member that would land outside its destination, by .. or through a
// symlink, is refused. Device nodes and fifos are skipped. An archive that
// unpacks past maxUnpacked (MaxUnpacked when <= 0) is refused (a *TooBigError)
// once it gets there. It returns the paths written (not directories), as
// absolute paths in the image, in archive order.
func Extract(blob string, x spec.Extract, root string, maxUnpacked int64) ([]string, error) {
	f, err := os.Open(blob)
	if err != nil {
		return nil, fmt.Errorf("extract: %w", err)
	}
	defer f.Close()
	stream, err := openTar(f, x.Format)
	if err != nil {
		return nil, fmt.Errorf("extract %s: %w", x.Format, err)
	}
	defer stream.Close()
	u := LimitUnpacked(stream, maxUnpacked)
	tr := tar.NewReader(u)
	r, err := os.OpenRoot(root)
	if err != nil {
		return nil, fmt.Errorf("extract: %w", err)
	}
	defer r.Close()
	if len(x.Files) > 0 {
		return extractFiles(tr, u, x.Files, r)
	}
	if x.Dir == "" {
		return nil, errors.New("extract: no files and no destination directory")
	}
	return extractAll(tr, u, x, r)
}

// openTar returns the decompressed tar stream held in f in format.
func openTar(f io.Reader, format string) (io.ReadCloser, error) {
	if format == "deb" {
		data, name, err := debData(f)
		if err != nil {
			return nil, err
		}
		inner := "tar"
		if i := strings.Index(name, ".tar."); i >= 0 {
			inner = "tar." + name[i+len(".tar."):]
		}
		if inner == "tar.deb" || !contains(spec.ArchiveFormats, inner) {
			return nil, fmt.Errorf("%s: unsupported compression", name)
		}
		return openTar(data, inner)
	}
	if !contains(spec.ArchiveFormats, format) {
		return nil, fmt.Errorf("unknown archive format %q", format)
	}
	kind, _ := decompress.ByExtension(format)
	return decompress.Open(bufio.NewReader(f), kind)
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// debData finds the data.tar* member of a .deb (an ar archive) and returns
// a reader of its content and its name.
func debData(r io.Reader) (io.Reader, string, error) {
	br := bufio.NewReader(r)
	magic := make([]byte, 8)
	if _, err := io.ReadFull(br, magic); err != nil || string(magic) != "!<arch>\n" {
		return nil, "", errors.New("not a .deb (no ar header)")
	}
	hdr := make([]byte, 60)
	for {
		if _, err := io.ReadFull(br, hdr); err != nil {
			if errors.Is(err, io.EOF) {
				return nil, "", errors.New(".deb has no data.tar member")
			}
			return nil, "", fmt.Errorf("read .deb: %w", err)
		}
		if string(hdr[58:60]) != "`\n" {
			return nil, "", errors.New("read .deb: bad ar member header")
		}
		name := strings.TrimSuffix(strings.TrimSpace(string(hdr[0:16])), "/")
		size, err := strconv.ParseInt(strings.TrimSpace(string(hdr[48:58])), 10, 64)
		if err != nil || size < 0 {
			return nil, "", fmt.Errorf("read .deb: member %q: bad size", name)
		}
		if strings.HasPrefix(name, "data.tar") {
			return io.LimitReader(br, size), name, nil
		}
		if _, err := io.CopyN(io.Discard, br, size+size%2); err != nil {
			return nil, "", fmt.Errorf("read .deb: %w", err)
		}
	}
}

// memberName cleans a member name: no leading "./" or "/", no trailing "/".
func memberName(n string) string {
	n = path.Clean("/" + n)
	return strings.TrimPrefix(n, "/")
}

// escapes reports whether a raw member name climbs out with "..".
func escapes(n string) bool {
	for _, part := range strings.Split(n, "/") {
		if part == ".." {
			return true
		}
	}
	return false
}

func fileMode(h *tar.Header) fs.FileMode {
	m := h.FileInfo().Mode()
	return m.Perm() | m&(fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky)
}

func extractFiles(tr *tar.Reader, u *Unpacked, files map[string]string, r *os.Root) ([]string, error) {
	want := map[string]string{}
	for m, dest := range files {
		want[memberName(m)] = dest
	}
	var out, seen []string
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return out, fmt.Errorf("read archive: %w", err)
		}
		name := memberName(h.Name)
		if len(seen) < 20 && h.Typeflag == tar.TypeReg {
			seen = append(seen, name)
		}
		dest, ok := want[name]
		if !ok {
			continue
		}
		if h.Typeflag != tar.TypeReg {
			return out, fmt.Errorf("member %s is not a regular file (type %q)", name, h.Typeflag)
		}
		if err := u.AddFile(h); err != nil {
			return out, fmt.Errorf("member %s: %w", name, err)
		}
		if err := writeFile(r, dest, tr, fileMode(h)); err != nil {
			return out, fmt.Errorf("member %s: %w", name, err)
		}
		out = append(out, dest)
		delete(want, name)
	}
	if len(want) > 0 {
		var missing []string
		for m := range want {
			missing = append(missing, m)
		}
		sort.Strings(missing)
		return out, fmt.Errorf("archive has no file %s (it has: %s)", strings.Join(missing, ", "), strings.Join(seen, ", "))
	}
	return out, nil
}

func extractAll(tr *tar.Reader, u *Unpacked, x spec.Extract, root *os.Root) ([]string, error) {
	dir := path.Clean("/" + x.Dir)
	if err := root.MkdirAll(strings.TrimPrefix(dir, "/"), 0o755); err != nil {
		return nil, fmt.Errorf("extract: %w", err)
	}
	// Work inside the destination directory itself, so that neither ..
	// nor a symlink from the archive reaches anything outside it.
	r, err := root.OpenRoot(strings.TrimPrefix(dir, "/"))
	if err != nil {
		return nil, fmt.Errorf("extract: %w", err)
	}
	defer r.Close()
	var out []string
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return out, fmt.Errorf("read archive: %w", err)
		}
		if escapes(h.Name) {
			return out, fmt.Errorf("member %q escapes the destination", h.Name)
		}
		if err := u.AddFile(h); err != nil {
			return out, fmt.Errorf("member %s: %w", h.Name, err)
		}
		parts := strings.Split(memberName(h.Name), "/")
		if len(parts) <= x.Strip {
			continue
		}
		rel := strings.Join(parts[x.Strip:], "/")
		if rel == "" {
			continue
		}
		target := path.Clean(rel)
		imgPath := path.Join(dir, target)
		switch h.Typeflag {
		case tar.TypeDir:
			if err := r.MkdirAll(target, 0o755); err != nil {
				return out, fmt.Errorf("member %s: %w", h.Name, err)
			}
			if err := r.Chmod(target, fileMode(h)); err != nil {
				return out, fmt.Errorf("member %s: %w", h.Name, err)
			}
			continue
		case tar.TypeReg:
			if err := writeFile(r, target, tr, fileMode(h)); err != nil {
				return out, fmt.Errorf("member %s: %w", h.Name, err)
			}
		case tar.TypeSymlink:
			if err := prepare(r, target); err != nil {
				return out, fmt.Errorf("member %s: %w", h.Name, err)
			}
			if err := r.Symlink(h.Linkname, target); err != nil {
				return out, fmt.Errorf("member %s: %w", h.Name, err)
			}
		case tar.TypeLink:
			if escapes(h.Linkname) {
				return out, fmt.Errorf("member %q: hard link to %q escapes the destination", h.Name, h.Linkname)
			}
			lparts := strings.Split(memberName(h.Linkname), "/")
			if len(lparts) <= x.Strip {
				return out, fmt.Errorf("member %q: hard link to %q, which strip removes", h.Name, h.Linkname)
			}
			old := strings.Join(lparts[x.Strip:], "/")
			if err := prepare(r, target); err != nil {
				return out, fmt.Errorf("member %s: %w", h.Name, err)
			}
			if err := r.Link(old, target); err != nil {
				return out, fmt.Errorf("member %s: %w", h.Name, err)
			}
		default:
			continue // devices, fifos, pax/gnu metadata handled by archive/tar
		}
		out = append(out, imgPath)
	}
}

// prepare makes the parent of target and removes whatever is at target.
func prepare(r *os.Root, target string) error {
	if dir := path.Dir(target); dir != "." {
		if err := r.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	if err := r.Remove(target); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// writeFile writes content to dest (a path inside r; a leading / is
// ignored) with exactly mode, replacing what was there.
func writeFile(r *os.Root, dest string, content io.Reader, mode fs.FileMode) error {
	target := strings.TrimPrefix(path.Clean(dest), "/")
	if target == "" || escapes(target) {
		return fmt.Errorf("bad destination %q", dest)
	}
	if err := prepare(r, target); err != nil {
		return err
	}
	f, err := r.OpenFile(target, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, content); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", dest, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", dest, err)
	}
	if err := r.Chmod(target, mode); err != nil {
		return err
	}
	return nil
}
