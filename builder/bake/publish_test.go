package bake

import (
	"maps"
	"os"
	"path/filepath"
	"testing"
)

// writeTree writes files (relative path -> content) below dir.
func writeTree(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// readTree is every regular file below dir, by relative path, except below skip.
func readTree(t *testing.T, dir, skip string) map[string]string {
	t.Helper()
	got := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == skip {
			return filepath.SkipDir
		}
		if d.Type().IsRegular() {
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(dir, p)
			got[rel] = string(data)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// A second bake into the same directory replaces the first's outputs, the pxe directory
// included; a publish that fails halfway leaves the directory with the earlier outputs.
func TestPublishReplacesEarlierOutputs(t *testing.T) {
	old := map[string]string{
		"qemu-worker.raw": "old raw", "qemu-worker.json": "old json",
		"qemu-worker-pxe/vmlinuz": "old kernel", "qemu-worker-pxe/stale": "only in the old",
		"other.raw": "another image's",
	}
	newFiles := map[string]string{
		"qemu-worker.raw": "new raw", "qemu-worker-pxe/vmlinuz": "new kernel", "qemu-worker.json": "new json",
	}
	names := []string{"qemu-worker.raw", "qemu-worker-pxe", "qemu-worker.json"}

	t.Run("replaces", func(t *testing.T) {
		out := t.TempDir()
		writeTree(t, out, old)
		work := filepath.Join(out, ".kiln-bake-1")
		writeTree(t, work, newFiles)
		var files []string
		for _, n := range names {
			files = append(files, filepath.Join(work, n))
		}
		outs, err := publish(files, out, work)
		if err != nil {
			t.Fatal(err)
		}
		if len(outs) != 3 || outs[1] != filepath.Join(out, "qemu-worker-pxe") {
			t.Errorf("outputs %q", outs)
		}
		if err := os.RemoveAll(work); err != nil {
			t.Fatal(err)
		}
		want := map[string]string{"other.raw": "another image's"}
		for k, v := range newFiles {
			want[k] = v
		}
		if got := readTree(t, out, ""); !maps.Equal(got, want) {
			t.Errorf("after the second bake the directory holds %q, want %q", got, want)
		}
	})
	t.Run("fails halfway", func(t *testing.T) {
		out := t.TempDir()
		writeTree(t, out, old)
		work := filepath.Join(out, ".kiln-bake-1")
		writeTree(t, work, map[string]string{"qemu-worker.raw": "new raw", "qemu-worker-pxe/vmlinuz": "new kernel"})
		// The metadata was never written: its move fails after the raw and pxe moved in.
		files := []string{filepath.Join(work, "qemu-worker.raw"), filepath.Join(work, "qemu-worker-pxe"), filepath.Join(work, "qemu-worker.json")}
		if _, err := publish(files, out, work); err == nil {
			t.Fatal("publish of a missing file succeeded")
		}
		if got := readTree(t, out, work); !maps.Equal(got, old) {
			t.Errorf("after a failed publish the directory holds %q, want the earlier outputs %q", got, old)
		}
	})
}
