package rootfs

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/kilnproject/kiln/internal/testkit"
)

// importBase imports a root of one file into the layout dir under tag.
func importBase(t *testing.T, dir, tag, body string) v1.Hash {
	t.Helper()
	tarPath := filepath.Join(t.TempDir(), "root.tar")
	if err := os.WriteFile(tarPath, testkit.Tar(t, testkit.Entry{Name: "etc/", Dir: true}, testkit.Entry{Name: "etc/os-release", Body: body}), 0o644); err != nil {
		t.Fatal(err)
	}
	d, err := ImportTar(tarPath, dir, tag, time.Unix(0, 0).UTC())
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// blobsOf lists the blob files of image d in the layout dir (named by its index or not): its
// manifest, config and layers.
func blobsOf(t *testing.T, dir string, d v1.Hash) []string {
	t.Helper()
	blob := func(h v1.Hash) string { return filepath.Join(dir, "blobs", h.Algorithm, h.Hex) }
	f, err := os.Open(blob(d))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m, err := v1.ParseManifest(f)
	if err != nil {
		t.Fatal(err)
	}
	out := []string{blob(d), blob(m.Config.Digest)}
	for _, l := range m.Layers {
		out = append(out, blob(l.Digest))
	}
	return out
}

// TestUnreferencedBlobs: a base imported again under its tag leaves the old one's blobs, which
// are listed once old enough; the images the index names keep theirs and still read whole.
func TestUnreferencedBlobs(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "base")
	replaced := importBase(t, dir, "bookworm", "one")
	other := importBase(t, dir, "bookworm-generic", "two")
	current := importBase(t, dir, "bookworm", "three")
	old := blobsOf(t, dir, replaced)
	crashed := filepath.Join(dir, "blobs", "sha256", "1234567") // a write cut short
	if err := os.WriteFile(crashed, []byte("partial"), 0o644); err != nil {
		t.Fatal(err)
	}
	week := time.Now().Add(-7 * 24 * time.Hour)
	err := filepath.WalkDir(filepath.Join(dir, "blobs"), func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		return os.Chtimes(p, week, week)
	})
	if err != nil {
		t.Fatal(err)
	}
	got, err := UnreferencedBlobs(dir, time.Now().Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	want := append(slices.Clone(old), crashed)
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("UnreferencedBlobs = %v\nwant the replaced image's %v", got, want)
	}
	// Written since the cut-off: a concurrent import's blobs before its index names them.
	if got, err := UnreferencedBlobs(dir, week.Add(-time.Hour)); len(got) != 0 || err != nil {
		t.Errorf("UnreferencedBlobs of blobs newer than the cut-off = %v, %v; want none", got, err)
	}
	for _, p := range got {
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []v1.Hash{other, current} {
		for _, b := range blobsOf(t, dir, d) {
			if _, err := os.Stat(b); err != nil {
				t.Errorf("image %s lost a blob: %v", d, err)
			}
		}
	}
	// A layout whose index names a manifest it lacks: nothing is listed.
	if err := os.Remove(blobsOf(t, dir, other)[0]); err != nil {
		t.Fatal(err)
	}
	if got, err := UnreferencedBlobs(dir, time.Now()); err == nil {
		t.Errorf("UnreferencedBlobs of a layout missing a manifest = %v, no error", got)
	}
	if got, err := UnreferencedBlobs(filepath.Join(t.TempDir(), "none"), time.Now()); got != nil || err != nil {
		t.Errorf("UnreferencedBlobs of no layout = %v, %v", got, err)
	}
}
