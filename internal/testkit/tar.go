package testkit

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Entry is one member of a tar archive built in memory. Its type is Type when set;
// otherwise a directory when Dir, a symlink to Link when Link is set, and a regular file
// holding Body otherwise.
type Entry struct {
	Name, Body, Link string
	Dir              bool
	Type             byte  // tar.TypeLink, tar.TypeChar, ...: overrides Dir and Link
	Mode             int64 // 0: 0644, or 0755 for a directory
	UID, GID         int
	ModTime          time.Time // zero: a fixed time, so that archives are reproducible
	// Xattrs are extended attributes, as PAX records (security.capability, say).
	Xattrs map[string]string
}

// epoch is the modification time an Entry without one gets.
var epoch = time.Unix(1e9, 0)

// Header returns the tar header of e.
func (e Entry) Header() *tar.Header {
	h := &tar.Header{Name: e.Name, Mode: e.Mode, Uid: e.UID, Gid: e.GID, ModTime: e.ModTime, Typeflag: e.Type}
	if h.Typeflag == 0 {
		switch {
		case e.Dir:
			h.Typeflag = tar.TypeDir
		case e.Link != "":
			h.Typeflag = tar.TypeSymlink
		default:
			h.Typeflag = tar.TypeReg
		}
	}
	if h.Typeflag == tar.TypeSymlink || h.Typeflag == tar.TypeLink {
		h.Linkname = e.Link
	}
	if h.Typeflag == tar.TypeReg {
		h.Size = int64(len(e.Body))
	}
	if h.Mode == 0 {
		h.Mode = 0o644
		if h.Typeflag == tar.TypeDir {
			h.Mode = 0o755
		}
	}
	if h.ModTime.IsZero() {
		h.ModTime = epoch
	}
	for k, v := range e.Xattrs {
		if h.PAXRecords == nil {
			h.PAXRecords = map[string]string{}
		}
		h.PAXRecords["SCHILY.xattr."+k] = v
		h.Format = tar.FormatPAX
	}
	return h
}

// Tar returns an uncompressed tar archive of entries, in order.
func Tar(t testing.TB, entries ...Entry) []byte {
	t.Helper()
	b, err := Archive(entries...)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Archive is Tar for a caller that handles the error itself, such as a fuzz test whose
// names archive/tar may refuse.
func Archive(entries ...Entry) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := e.Header()
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("tar %s: %w", e.Name, err)
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := io.WriteString(tw, e.Body); err != nil {
				return nil, fmt.Errorf("tar %s: %w", e.Name, err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// TarHeader returns the header block(s) of h alone, without a body or an end marker: the
// start of a hand-made archive.
func TarHeader(t testing.TB, h *tar.Header) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := tar.NewWriter(&buf).WriteHeader(h); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// Layer returns an uncompressed OCI image layer holding entries.
func Layer(t testing.TB, entries ...Entry) v1.Layer {
	t.Helper()
	return layerOf(t, Tar(t, entries...))
}

// layerOf returns an uncompressed OCI image layer whose tar stream is b.
func layerOf(t testing.TB, b []byte) v1.Layer {
	t.Helper()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil },
		tarball.WithMediaType(types.OCILayer))
	if err != nil {
		t.Fatal(err)
	}
	return l
}
