// Package decompress opens a decompressing reader for a kind of compression, and names the
// kind of a stream by its first bytes, a file by its name, or an image layer by its media
// type.
package decompress

import (
	"bufio"
	"bytes"
	"compress/bzip2"
	"fmt"
	"io"
	"strings"

	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
)

// Kind is a kind of compression.
type Kind string

// The kinds Open undoes.
const (
	None  Kind = "none" // stored as it is
	Gzip  Kind = "gzip"
	Zstd  Kind = "zstd"
	Xz    Kind = "xz"
	Bzip2 Kind = "bzip2"
)

// Open returns a reader of what r decompresses to under kind. Closing it releases the
// decoder; r is the caller's to close.
func Open(r io.Reader, kind Kind) (io.ReadCloser, error) {
	return Options{}.Open(r, kind)
}

// Options tune the decoder Open makes.
type Options struct {
	// MaxMemory, when > 0, keeps the decoder small: a zstd stream whose window, or an xz
	// block whose dictionary, needs more memory is refused (xz's error wraps ErrMemoryLimit),
	// and zstd decodes on the caller's goroutine with buffers sized to the data.
	MaxMemory int64
}

// Open returns a reader of what r decompresses to under kind (see the function Open).
func (o Options) Open(r io.Reader, kind Kind) (io.ReadCloser, error) {
	if _, ok := r.(io.ByteReader); !ok && kind != None {
		r = bufio.NewReader(r)
	}
	switch kind {
	case None:
		return io.NopCloser(r), nil
	case Gzip:
		z, err := gzip.NewReader(r)
		if err != nil {
			return nil, err
		}
		return z, nil
	case Zstd:
		var opts []zstd.DOption
		if o.MaxMemory > 0 {
			opts = append(opts, zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true),
				zstd.WithDecoderMaxMemory(uint64(o.MaxMemory)))
		}
		z, err := zstd.NewReader(r, opts...)
		if err != nil {
			return nil, err
		}
		return z.IOReadCloser(), nil
	case Xz:
		z, err := newXzReader(r, o.MaxMemory)
		if err != nil {
			return nil, err
		}
		return io.NopCloser(z), nil
	case Bzip2:
		return io.NopCloser(bzip2.NewReader(r)), nil
	}
	return nil, fmt.Errorf("unknown compression %q", kind)
}

// magicLen is how many leading bytes ByMagic needs to tell every kind it knows.
const magicLen = 6

var magics = []struct {
	magic []byte
	kind  Kind
}{
	{[]byte{0x1f, 0x8b}, Gzip},
	{[]byte{0x28, 0xb5, 0x2f, 0xfd}, Zstd},
	{[]byte("\xfd7zXZ\x00"), Xz},
}

// ByMagic names the compression of data that starts with head: Gzip, Zstd or Xz, else
// None. Bzip2 is not told: its three-byte magic is too weak to trust on arbitrary data.
func ByMagic(head []byte) Kind {
	for _, m := range magics {
		if bytes.HasPrefix(head, m.magic) {
			return m.kind
		}
	}
	return None
}

var extensions = []struct {
	ext  string
	kind Kind
}{
	{".gz", Gzip},
	{".zst", Zstd},
	{".xz", Xz},
	{".bz2", Bzip2},
}

// ByExtension names the compression of a file by its name's last extension (.gz, .zst,
// .xz, .bz2) and returns the name without it: "data.tar.xz" is Xz and "data.tar". A name
// with none of these extensions is None and returned whole.
func ByExtension(name string) (Kind, string) {
	for _, e := range extensions {
		if base, ok := strings.CutSuffix(name, e.ext); ok {
			return e.kind, base
		}
	}
	return None, name
}

// ByMediaType names the compression of an image layer by its OCI or Docker media type;
// false for a media type that is not a layer Open can undo.
func ByMediaType(mt types.MediaType) (Kind, bool) {
	switch mt {
	case types.OCILayer, types.DockerLayer, types.OCIRestrictedLayer, types.DockerForeignLayer:
		return Gzip, true
	case types.OCILayerZStd:
		return Zstd, true
	case types.OCIUncompressedLayer, types.DockerUncompressedLayer:
		return None, true
	}
	return "", false
}
