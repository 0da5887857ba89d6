package testkit

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"testing"
)

func TestTarEntryDefaults(t *testing.T) {
	b := Tar(t,
		Entry{Name: "d/", Dir: true},
		Entry{Name: "d/f", Body: "hello"},
		Entry{Name: "d/l", Link: "f"},
		Entry{Name: "d/h", Type: tar.TypeLink, Link: "d/f", Mode: 0o600},
	)
	want := []struct {
		typ  byte
		mode int64
		size int64
		link string
	}{{tar.TypeDir, 0o755, 0, ""}, {tar.TypeReg, 0o644, 5, ""}, {tar.TypeSymlink, 0o644, 0, "f"}, {tar.TypeLink, 0o600, 0, "d/f"}}
	tr := tar.NewReader(bytes.NewReader(b))
	for i, w := range want {
		h, err := tr.Next()
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag != w.typ || h.Mode != w.mode || h.Size != w.size || h.Linkname != w.link || !h.ModTime.Equal(epoch) {
			t.Errorf("entry %d: %+v, want %+v", i, h, w)
		}
	}
	if _, err := tr.Next(); err != io.EOF {
		t.Errorf("after the entries: %v, want EOF", err)
	}
}

func TestGzipBombInflates(t *testing.T) {
	zr, err := gzip.NewReader(bytes.NewReader(GzipBomb(t, []byte("head"), make([]byte, 1<<20), 3)))
	if err != nil {
		t.Fatal(err)
	}
	n, err := io.Copy(io.Discard, zr)
	if err != nil || n != 4+3<<20+1024 {
		t.Errorf("inflated %d bytes, %v; want %d", n, err, 4+3<<20+1024)
	}
}

func TestSnapshotSeesChanges(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "f"), []byte("a"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("f", filepath.Join(dir, "l")); err != nil {
		t.Fatal(err)
	}
	before := Snapshot(t, dir)
	if d := before.Diff(Snapshot(t, dir), nil); len(d) != 0 {
		t.Fatalf("untouched tree differs: %q", d)
	}
	if err := os.Chmod(filepath.Join(dir, "f"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "new"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	d := before.Diff(Snapshot(t, dir), SameContent)
	if len(d) != 2 || d[0] != "added new" || d[1][:len("changed f:")] != "changed f:" {
		t.Errorf("diff = %q, want the new file and the changed mode", d)
	}
}

func TestFreePortsDiffer(t *testing.T) {
	ps := FreePorts(t, 3)
	if ps[0] == ps[1] || ps[1] == ps[2] || ps[0] == ps[2] {
		t.Errorf("ports %v are not distinct", ps)
	}
}
