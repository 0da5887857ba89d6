package testkit

import (
	"bytes"
	"compress/gzip"
	"io"
	"testing"

	"github.com/klauspost/compress/zstd"
	"github.com/ulikunitz/xz"
)

// Gzip returns data compressed with gzip.
func Gzip(t testing.TB, data []byte) []byte {
	t.Helper()
	return Compress(t, "gz", data)
}

// Compress returns data compressed in the format named by kind: a file name suffix ("gz",
// "xz", "zst", with or without the dot) or a format name ("gzip", "zstd").
func Compress(t testing.TB, kind string, data []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	var w io.WriteCloser
	var err error
	switch kind {
	case "gz", ".gz", "gzip":
		w = gzip.NewWriter(&buf)
	case "xz", ".xz":
		w, err = xz.NewWriter(&buf)
	case "zst", ".zst", "zstd":
		w, err = zstd.NewWriter(&buf)
	default:
		t.Fatalf("no compressor for %q", kind)
	}
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// GzipBomb returns a gzip stream that inflates to head, then mib times repeat (1 MiB,
// compressed once), then a tar end-of-archive marker. gzip readers read concatenated
// members as one stream, so a stream that inflates to 10 GiB costs a few MiB and no
// compression time.
func GzipBomb(t testing.TB, head, repeat []byte, mib int) []byte {
	t.Helper()
	if len(repeat) != 1<<20 {
		t.Fatalf("repeat is %d bytes, want 1 MiB", len(repeat))
	}
	var out bytes.Buffer
	out.Write(gzipMember(t, head))
	chunk := gzipMember(t, repeat)
	for range mib {
		out.Write(chunk)
	}
	out.Write(gzipMember(t, make([]byte, 1024)))
	return out.Bytes()
}

// gzipMember compresses b into one gzip member at the best compression.
func gzipMember(t testing.TB, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := zw.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}
