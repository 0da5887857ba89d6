package decompress

import (
	"bytes"
	"io"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/kilnproject/kiln/internal/testkit"
	"github.com/klauspost/compress/zstd"
)

// compress returns data compressed as kind (Bzip2 has no writer in the standard library:
// a small stream made by bzip2(1) stands in).
func compress(t *testing.T, kind Kind, data []byte) []byte {
	t.Helper()
	if kind == None {
		return data
	}
	return testkit.Compress(t, string(kind), data)
}

// bzip2Hello is "hello\n" as bzip2(1) writes it.
var bzip2Hello = []byte("\x42\x5a\x68\x39\x31\x41\x59\x26\x53\x59\xc1\xc0\x80\xe2\x00\x00\x01\x41\x00\x00\x10\x02\x44\xa0\x00\x30\xcd\x00\xc3\x46\x29\x97\x17\x72\x45\x38\x50\x90\xc1\xc0\x80\xe2")

func TestOpenRoundTrip(t *testing.T) {
	data := bytes.Repeat([]byte("kiln "), 10000)
	for _, kind := range []Kind{None, Gzip, Zstd, Xz} {
		t.Run(string(kind), func(t *testing.T) {
			packed := compress(t, kind, data)
			if got := ByMagic(packed); got != kind {
				t.Errorf("ByMagic = %s; want %s", got, kind)
			}
			rc, err := Open(bytes.NewReader(packed), kind)
			if err != nil {
				t.Fatal(err)
			}
			defer rc.Close()
			got, err := io.ReadAll(rc)
			if err != nil || !bytes.Equal(got, data) {
				t.Fatalf("read %d bytes, %v; want the %d bytes compressed", len(got), err, len(data))
			}
		})
	}
	t.Run("bzip2", func(t *testing.T) {
		rc, err := Open(bytes.NewReader(bzip2Hello), Bzip2)
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(rc)
		if err != nil || string(got) != "hello\n" {
			t.Fatalf("read %q, %v; want %q", got, err, "hello\n")
		}
	})
}

func TestOpenRefuses(t *testing.T) {
	tests := []struct {
		name string
		kind Kind
		data []byte
	}{
		{name: "gzip header", kind: Gzip, data: []byte("plain text")},
		{name: "zstd header", kind: Zstd, data: []byte("plain text")},
		{name: "xz header", kind: Xz, data: []byte("plain text")},
		{name: "unknown kind", kind: "lz4", data: []byte("plain text")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rc, err := Open(strings.NewReader(string(tt.data)), tt.kind)
			if err == nil {
				_, err = io.ReadAll(rc)
			}
			if err == nil {
				t.Fatalf("Open(%s) of %q succeeded", tt.kind, tt.data)
			}
		})
	}
}

// TestMaxMemory: a small decoder refuses a zstd stream whose window needs more memory.
func TestMaxMemory(t *testing.T) {
	var b bytes.Buffer
	w, err := zstd.NewWriter(&b, zstd.WithWindowSize(8<<20), zstd.WithSingleSegment(false))
	if err != nil {
		t.Fatal(err)
	}
	data := make([]byte, 16<<20)
	w.Write(data)
	w.Close()
	rc, err := Options{MaxMemory: 1 << 20}.Open(bytes.NewReader(b.Bytes()), Zstd)
	if err == nil {
		defer rc.Close()
		_, err = io.ReadAll(rc)
	}
	if err == nil {
		t.Fatal("a decoder bounded at 1 MiB decoded a stream with an 8 MiB window")
	}
	rc, err = Options{MaxMemory: 64 << 20}.Open(bytes.NewReader(b.Bytes()), Zstd)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	if got, err := io.ReadAll(rc); err != nil || len(got) != len(data) {
		t.Fatalf("read %d bytes, %v; want %d", len(got), err, len(data))
	}
}

func TestByMagic(t *testing.T) {
	tests := []struct {
		head []byte
		want Kind
	}{
		{[]byte{0x1f, 0x8b, 8}, Gzip},
		{[]byte{0x28, 0xb5, 0x2f, 0xfd, 0}, Zstd},
		{[]byte("\xfd7zXZ\x00\x00"), Xz},
		{[]byte("\xfd7zXZ"), None}, // cut short
		{bzip2Hello, None},
		{[]byte("070701"), None},
		{nil, None},
	}
	for _, tt := range tests {
		if got := ByMagic(tt.head); got != tt.want {
			t.Errorf("ByMagic(% x) = %s; want %s", tt.head, got, tt.want)
		}
	}
}

func TestByExtension(t *testing.T) {
	tests := []struct {
		name, base string
		want       Kind
	}{
		{"tar.gz", "tar", Gzip},
		{"data.tar.xz", "data.tar", Xz},
		{"crc32c-intel.ko.zst", "crc32c-intel.ko", Zstd},
		{"tar.bz2", "tar", Bzip2},
		{"tar", "tar", None},
		{"mod.ko", "mod.ko", None},
		{"data.tar.lzma", "data.tar.lzma", None},
	}
	for _, tt := range tests {
		kind, base := ByExtension(tt.name)
		if kind != tt.want || base != tt.base {
			t.Errorf("ByExtension(%q) = %s, %q; want %s, %q", tt.name, kind, base, tt.want, tt.base)
		}
	}
}

func TestByMediaType(t *testing.T) {
	tests := []struct {
		mt   types.MediaType
		want Kind
		ok   bool
	}{
		{types.OCILayer, Gzip, true},
		{types.DockerLayer, Gzip, true},
		{types.DockerForeignLayer, Gzip, true},
		{types.OCILayerZStd, Zstd, true},
		{types.OCIUncompressedLayer, None, true},
		{types.DockerUncompressedLayer, None, true},
		{types.OCIManifestSchema1, "", false},
	}
	for _, tt := range tests {
		kind, ok := ByMediaType(tt.mt)
		if kind != tt.want || ok != tt.ok {
			t.Errorf("ByMediaType(%s) = %s, %v; want %s, %v", tt.mt, kind, ok, tt.want, tt.ok)
		}
	}
}
