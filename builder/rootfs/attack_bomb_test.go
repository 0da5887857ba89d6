package rootfs

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/kilnproject/kiln/builder/artifact"
)

// gzipMember compresses b as one gzip member.
func gzipMember(t testing.TB, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		t.Fatal(err)
	}
	zw.Write(b)
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// bomb returns a gzip stream that inflates to head followed by n MiB of repeat (1 MiB, itself
// compressed once) and the tar end-of-archive marker. gzip readers read concatenated members as
// one stream, so a 10 GiB layer costs a few MiB and no compression time.
func bomb(t testing.TB, head, repeat []byte, mib int) []byte {
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

// header returns the tar header block(s) of h alone.
func header(t testing.TB, h *tar.Header) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := tar.NewWriter(&buf).WriteHeader(h); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestAttackDecompressionBomb(t *testing.T) {
	const bound = 8 << 20
	dirHeader := header(t, &tar.Header{Name: "d/", Typeflag: tar.TypeDir, Mode: 0o755})
	for _, tc := range []struct {
		name  string
		layer func() []byte
		what  string
	}{
		{
			// One file of 10 GiB of zeros: 10 MiB compressed.
			name: "10 GiB of zeros in one file",
			layer: func() []byte {
				return bomb(t, header(t, &tar.Header{Name: "zeros", Typeflag: tar.TypeReg, Mode: 0o644, Size: 10 << 30}),
					make([]byte, 1<<20), 10<<10)
			},
			what: "file contents",
		},
		{
			// Small files whose sizes add up past the bound.
			name: "many files",
			layer: func() []byte {
				var files []hdrBody
				for i := range 4 {
					files = append(files, file("f"+strings.Repeat("x", i), strings.Repeat("\x00", 3<<20)))
				}
				b, err := tarOf(files...)
				if err != nil {
					t.Fatal(err)
				}
				return gzipMember(t, b)
			},
			what: "file contents",
		},
		{
			// 10 GiB of tar headers (20 million entries of one directory) and no file content:
			// the stream itself is bounded.
			name: "10 GiB of entries",
			layer: func() []byte {
				return bomb(t, dirHeader, bytes.Repeat(dirHeader, (1<<20)/len(dirHeader)), 10<<10)
			},
			what: "stream",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := tc.layer()
			l := static.NewLayer(b, types.OCILayer)
			d, err := l.Digest()
			if err != nil {
				t.Fatal(err)
			}
			tree, _, err := attackWith(t, FlattenOptions{MaxUnpacked: bound}, func(string) []v1.Layer { return []v1.Layer{l} })
			var tb *artifact.TooBigError
			if !errors.As(err, &tb) || tb.What != tc.what {
				t.Fatalf("Flatten of a %d MiB layer that inflates past %d MiB: %v; want a bound on the %s", len(b)>>20, bound>>20, err, tc.what)
			}
			if !strings.Contains(err.Error(), d.String()) || !strings.Contains(err.Error(), "decompression bomb") {
				t.Errorf("the error does not name the layer %s: %v", d, err)
			}
			if used := du(t, tree); used > 2*bound {
				t.Errorf("the tree holds %d bytes, past twice the bound", used)
			}
		})
	}
}

// du adds up the disk blocks the files below dir take.
func du(t testing.TB, dir string) int64 {
	var n int64
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil {
			if st, ok := fi.Sys().(*syscall.Stat_t); ok {
				n += st.Blocks * 512
			}
		}
		return nil
	})
	return n
}
