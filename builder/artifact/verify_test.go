package artifact

import (
	"archive/tar"
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kilnproject/kiln/builder/spec"
	"github.com/kilnproject/kiln/internal/testkit"
)

func TestPlaceRefusesDecompressionBombs(t *testing.T) {
	const bound = 8 << 20

	zeros := testkit.TarHeader(t, &tar.Header{Name: "pkg/zeros", Typeflag: tar.TypeReg, Mode: 0o644, Size: 10 << 30})
	dir := testkit.TarHeader(t, &tar.Header{Name: "pkg/", Typeflag: tar.TypeDir, Mode: 0o755})
	for _, tc := range []struct {
		name    string
		archive []byte
		extract spec.Extract
		what    string
	}{
		{name: "10 GiB of zeros, whole archive", archive: testkit.GzipBomb(t, zeros, make([]byte, 1<<20), 10<<10),
			extract: spec.Extract{Format: "tar.gz", Dir: "/opt/bomb"}, what: "file contents"},
		{name: "10 GiB of zeros, one member", archive: testkit.GzipBomb(t, zeros, make([]byte, 1<<20), 10<<10),
			extract: spec.Extract{Format: "tar.gz", Files: map[string]string{"pkg/zeros": "/usr/bin/zeros"}}, what: "file contents"},
		{name: "10 GiB of entries", archive: testkit.GzipBomb(t, dir, bytes.Repeat(dir, (1<<20)/len(dir)), 10<<10),
			extract: spec.Extract{Format: "tar.gz", Dir: "/opt/bomb"}, what: "stream"},
		{name: "10 GiB of entries, looking for one member", archive: testkit.GzipBomb(t, dir, bytes.Repeat(dir, (1<<20)/len(dir)), 10<<10),
			extract: spec.Extract{Format: "tar.gz", Files: map[string]string{"pkg/zeros": "/usr/bin/zeros"}}, what: "stream"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			blob := filepath.Join(t.TempDir(), "blob")
			if err := os.WriteFile(blob, tc.archive, 0o444); err != nil {
				t.Fatal(err)
			}
			root := t.TempDir()
			x := tc.extract
			_, err := place(blob, spec.Artifact{Name: "bomb", Extract: &x}, root, bound)
			var tb *TooBigError
			if !errors.As(err, &tb) || tb.What != tc.what {
				t.Fatalf("Place of a %d MiB archive that inflates to 10 GiB: %v; want a bound on the %s", len(tc.archive)>>20, err, tc.what)
			}
			if !strings.HasPrefix(err.Error(), `artifact "bomb": `) || !strings.Contains(err.Error(), "decompression bomb") {
				t.Errorf("the error does not name the artifact: %v", err)
			}
			if used := testkit.DiskUse(root); used > 2*bound {
				t.Errorf("the tree holds %d bytes, past twice the bound", used)
			}
		})
	}
}
