package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kilnproject/kiln/internal/nodeimage"
)

// runCLI runs the kiln command line as main does and returns what it printed on stdout, on
// stderr (logs included) and its exit code.
func runCLI(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errs bytes.Buffer
	root := newRoot()
	root.SetOut(&out)
	root.SetErr(&errs)
	code = execute(context.Background(), root, args, &errs)
	return out.String(), errs.String(), code
}

// kilnJSON runs kiln with args, wants exit 0, and decodes its -o json output into v.
func kilnJSON(t *testing.T, v any, args ...string) {
	t.Helper()
	out, errs, code := runCLI(t, args...)
	if code != 0 {
		t.Fatalf("kiln %s: exit %d\n%s", strings.Join(args, " "), code, errs)
	}
	if err := json.Unmarshal([]byte(out), v); err != nil {
		t.Fatalf("kiln %s -o json printed %q: %v", strings.Join(args, " "), out, err)
	}
}

// rawDisk writes content to dir/<stem>.raw, sparse where content is zero in whole 64 KiB
// pieces, as a bake leaves a raw disk.
func rawDisk(t *testing.T, dir, stem string, content []byte) string {
	t.Helper()
	path := filepath.Join(dir, stem+".raw")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(int64(len(content))); err != nil {
		t.Fatal(err)
	}
	zero := make([]byte, 64<<10)
	for off := 0; off < len(content); off += len(zero) {
		chunk := content[off:min(off+len(zero), len(content))]
		if !bytes.Equal(chunk, zero[:len(chunk)]) {
			if _, err := f.WriteAt(chunk, int64(off)); err != nil {
				t.Fatal(err)
			}
		}
	}
	return path
}

// sidecar writes the metadata a bake writes beside its output file path (<stem>.json),
// for an image of platform, recording the format, the file's size and SHA-256, and the size
// of the disk it holds.
func sidecar(t *testing.T, path, platform, format string, diskSize int64) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	stem := strings.TrimSuffix(strings.TrimSuffix(filepath.Base(path), ".raw"), ".tar.gz")
	md := nodeimage.Metadata{Name: platform, Role: "worker", Platform: platform,
		Kernel: nodeimage.KernelInfo{Version: "6.1.0-test"}, Disk: &nodeimage.DiskInfo{Size: diskSize},
		Outputs: []nodeimage.OutputInfo{{Format: format, File: filepath.Base(path), Size: int64(len(data)), SHA256: hex.EncodeToString(sum[:])}}}
	js, err := json.Marshal(md)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(filepath.Dir(path), stem+".json"), js, 0o644); err != nil {
		t.Fatal(err)
	}
}

// randomAt returns size bytes, zero but for random data of n bytes at each offset.
func randomAt(size int64, n int, offsets ...int64) []byte {
	b := make([]byte, size)
	for _, off := range offsets {
		rand.Read(b[off : off+int64(n)])
	}
	return b
}
