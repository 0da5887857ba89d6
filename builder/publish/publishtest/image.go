package publishtest

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/kilnproject/kiln/internal/nodeimage"
)

// RawImage writes a sparse raw disk of size bytes, dir/aws-worker.raw, with data at the
// offsets given, and its metadata as a bake writes it, for a publish test. It returns the
// file's path and content.
func RawImage(t testing.TB, dir string, size int64, data map[int64][]byte) (string, []byte) {
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
	WriteMetadata(t, dir, "aws-worker", &nodeimage.Metadata{
		Name: "aws", Role: "worker", Platform: "aws", Kernel: nodeimage.KernelInfo{Version: "6.1.0-test"},
		Disk:    &nodeimage.DiskInfo{Size: size},
		Outputs: []nodeimage.OutputInfo{{Format: "raw", File: "aws-worker.raw", Size: size, SHA256: hex.EncodeToString(sum[:])}},
	})
	return path, content
}

// WriteMetadata writes md as the bake writes it beside an output: dir/<stem>.json.
func WriteMetadata(t testing.TB, dir, stem string, md *nodeimage.Metadata) {
	t.Helper()
	data, err := json.MarshalIndent(md, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, stem+".json"), data, 0o644); err != nil {
		t.Fatal(err)
	}
}
