package rootfs

import (
	"archive/tar"
	"bytes"
	"errors"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/kilnproject/kiln/builder/artifact"
	"github.com/kilnproject/kiln/internal/testkit"
)

func TestAttackDecompressionBomb(t *testing.T) {
	const bound = 8 << 20
	dirHeader := testkit.TarHeader(t, &tar.Header{Name: "d/", Typeflag: tar.TypeDir, Mode: 0o755})
	for _, tc := range []struct {
		name  string
		layer func() []byte
		what  string
	}{
		{
			// One file of 10 GiB of zeros: 10 MiB compressed.
			name: "10 GiB of zeros in one file",
			layer: func() []byte {
				return testkit.GzipBomb(t, testkit.TarHeader(t, &tar.Header{Name: "zeros", Typeflag: tar.TypeReg, Mode: 0o644, Size: 10 << 30}),
					make([]byte, 1<<20), 10<<10)
			},
			what: "file contents",
		},
		{
			// Small files whose sizes add up past the bound.
			name: "many files",
			layer: func() []byte {
				var files []testkit.Entry
				for i := range 4 {
					files = append(files, file("f"+strings.Repeat("x", i), strings.Repeat("\x00", 3<<20)))
				}
				return testkit.Gzip(t, testkit.Tar(t, files...))
			},
			what: "file contents",
		},
		{
			// 10 GiB of tar headers (20 million entries of one directory) and no file content:
			// the stream itself is bounded.
			name: "10 GiB of entries",
			layer: func() []byte {
				return testkit.GzipBomb(t, dirHeader, bytes.Repeat(dirHeader, (1<<20)/len(dirHeader)), 10<<10)
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
			if used := testkit.DiskUse(tree); used > 2*bound {
				t.Errorf("the tree holds %d bytes, past twice the bound", used)
			}
		})
	}
}
