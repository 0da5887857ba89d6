package artifact

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

	"github.com/kilnproject/kiln/builder/spec"
)

// gzipBomb returns a gzip stream that inflates to head, then mib MiB of repeat (1 MiB,
// compressed once: gzip readers read concatenated members as one stream), then the tar
// end-of-archive marker. A 10 GiB archive costs 10 MiB and no compression time.
func gzipBomb(t *testing.T, head, repeat []byte, mib int) []byte {
	t.Helper()
	member := func(b []byte) []byte {
		var buf bytes.Buffer
		zw, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression)
		zw.Write(b)
		if err := zw.Close(); err != nil {
			t.Fatal(err)
		}
		return buf.Bytes()
	}
	var out bytes.Buffer
	out.Write(member(head))
	chunk := member(repeat)
	for range mib {
		out.Write(chunk)
	}
	out.Write(member(make([]byte, 1024)))
	return out.Bytes()
}

func tarHeader(t *testing.T, h *tar.Header) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := tar.NewWriter(&buf).WriteHeader(h); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// diskUse adds up the blocks the files below dir take.
func diskUse(dir string) int64 {
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

func TestPlaceRefusesDecompressionBombs(t *testing.T) {
	const bound = 8 << 20

	zeros := tarHeader(t, &tar.Header{Name: "pkg/zeros", Typeflag: tar.TypeReg, Mode: 0o644, Size: 10 << 30})
	dir := tarHeader(t, &tar.Header{Name: "pkg/", Typeflag: tar.TypeDir, Mode: 0o755})
	for _, tc := range []struct {
		name    string
		archive []byte
		extract spec.Extract
		what    string
	}{
		{name: "10 GiB of zeros, whole archive", archive: gzipBomb(t, zeros, make([]byte, 1<<20), 10<<10),
			extract: spec.Extract{Format: "tar.gz", Dir: "/opt/bomb"}, what: "file contents"},
		{name: "10 GiB of zeros, one member", archive: gzipBomb(t, zeros, make([]byte, 1<<20), 10<<10),
			extract: spec.Extract{Format: "tar.gz", Files: map[string]string{"pkg/zeros": "/usr/bin/zeros"}}, what: "file contents"},
		{name: "10 GiB of entries", archive: gzipBomb(t, dir, bytes.Repeat(dir, (1<<20)/len(dir)), 10<<10),
			extract: spec.Extract{Format: "tar.gz", Dir: "/opt/bomb"}, what: "stream"},
		{name: "10 GiB of entries, looking for one member", archive: gzipBomb(t, dir, bytes.Repeat(dir, (1<<20)/len(dir)), 10<<10),
			extract: spec.Extract{Format: "tar.gz", Files: map[string]string{"pkg/zeros": "/usr/bin/zeros"}}, what: "stream"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			blob := filepath.Join(t.TempDir(), "blob")
			if err := os.WriteFile(blob, tc.archive, 0o444); err != nil {
				t.Fatal(err)
			}
			root := t.TempDir()
			x := tc.extract
			_, err := Place(blob, spec.Artifact{Name: "bomb", Extract: &x}, root, bound)
			var tb *TooBigError
			if !errors.As(err, &tb) || tb.What != tc.what {
				t.Fatalf("Place of a %d MiB archive that inflates to 10 GiB: %v; want a bound on the %s", len(tc.archive)>>20, err, tc.what)
			}
			if !strings.HasPrefix(err.Error(), `artifact "bomb": `) || !strings.Contains(err.Error(), "decompression bomb") {
				t.Errorf("the error does not name the artifact: %v", err)
			}
			if used := diskUse(root); used > 2*bound {
				t.Errorf("the tree holds %d bytes, past twice the bound", used)
			}
		})
	}
}
