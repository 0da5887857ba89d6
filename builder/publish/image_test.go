package publish

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kilnproject/kiln/internal/nodeimage"
)

// testImage writes a sparse raw disk of size bytes, dir/aws-worker.raw, with data at the
// offsets given, and its metadata as a bake writes it. It returns the file's path and
// content.
func testImage(t testing.TB, dir string, size int64, data map[int64][]byte) (string, []byte) {
	t.Helper()
	path := filepath.Join(dir, "aws-worker.raw")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	content := make([]byte, size)
	for off, b := range data {
		if _, err := f.WriteAt(b, off); err != nil {
			t.Fatal(err)
		}
		copy(content[off:], b)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(content)
	writeMetadata(t, dir, "aws-worker", &nodeimage.Metadata{
		Name: "aws", Role: "worker", Platform: "aws", Kernel: nodeimage.KernelInfo{Version: "6.1.0-test"},
		Disk:    &nodeimage.DiskInfo{Size: size},
		Outputs: []nodeimage.OutputInfo{{Format: "raw", File: "aws-worker.raw", Size: size, SHA256: hex.EncodeToString(sum[:])}},
	})
	return path, content
}

func writeMetadata(t testing.TB, dir, stem string, md *nodeimage.Metadata) {
	t.Helper()
	data, err := json.MarshalIndent(md, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, stem+".json"), data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// Load finds the output's entry in the sidecar metadata, and refuses a file that is not
// the one the bake wrote or metadata without a digest.
func TestLoad(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(t *testing.T, dir string, md *nodeimage.Metadata) string // returns the path to load
		want string                                                        // error substring; "" loads
	}{
		{name: "ok", edit: func(t *testing.T, dir string, md *nodeimage.Metadata) string {
			return filepath.Join(dir, "aws-worker.raw")
		}},
		{name: "tarball of the same stem", edit: func(t *testing.T, dir string, md *nodeimage.Metadata) string {
			os.WriteFile(filepath.Join(dir, "aws-worker.tar.gz"), []byte("tgz"), 0o644)
			md.Outputs = append(md.Outputs, nodeimage.OutputInfo{Format: "gce", File: "aws-worker.tar.gz", Size: 3, SHA256: strings.Repeat("a", 64)})
			return filepath.Join(dir, "aws-worker.tar.gz")
		}},
		{name: "no metadata", want: "aws-worker.json", edit: func(t *testing.T, dir string, md *nodeimage.Metadata) string {
			os.Remove(filepath.Join(dir, "aws-worker.json"))
			return filepath.Join(dir, "aws-worker.raw")
		}},
		{name: "not an output", want: "outputs has no entry for aws-worker.raw", edit: func(t *testing.T, dir string, md *nodeimage.Metadata) string {
			md.Outputs = nil
			return filepath.Join(dir, "aws-worker.raw")
		}},
		{name: "no digest", want: "is not a hex SHA-256", edit: func(t *testing.T, dir string, md *nodeimage.Metadata) string {
			md.Outputs[0].SHA256 = ""
			return filepath.Join(dir, "aws-worker.raw")
		}},
		{name: "size differs", want: "not the file the bake wrote", edit: func(t *testing.T, dir string, md *nodeimage.Metadata) string {
			md.Outputs[0].Size++
			return filepath.Join(dir, "aws-worker.raw")
		}},
		{name: "unknown suffix", want: "not a bake output", edit: func(t *testing.T, dir string, md *nodeimage.Metadata) string {
			return filepath.Join(dir, "aws-worker.img")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			testImage(t, dir, 4<<20, map[int64][]byte{0: []byte("kiln")})
			data, _ := os.ReadFile(filepath.Join(dir, "aws-worker.json"))
			md := new(nodeimage.Metadata)
			json.Unmarshal(data, md)
			path := tc.edit(t, dir, md)
			if _, err := os.Stat(filepath.Join(dir, "aws-worker.json")); err == nil {
				writeMetadata(t, dir, "aws-worker", md)
			}
			im, err := Load(path)
			if tc.want != "" {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("Load = %v, want an error with %q", err, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if im.Output.File != filepath.Base(path) || im.SHA256 != im.Output.SHA256 || im.DiskSize() != 4<<20 {
				t.Errorf("Load = %+v", im)
			}
		})
	}
}
