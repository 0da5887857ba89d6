package bake

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kilnproject/kiln/builder/artifact"
	"github.com/kilnproject/kiln/builder/rootfs"
	"github.com/kilnproject/kiln/internal/testkit"
)

// pruneFixture is a cache with one entry of each kind used lately and one unused for a week,
// and a base layout with a replaced image; it returns the cache's root, the layout and the
// entries a prune of a day must remove.
func pruneFixture(t *testing.T) (root, layoutDir string, unused []string) {
	t.Helper()
	root = t.TempDir()
	week := time.Now().Add(-7 * 24 * time.Hour)
	age := func(p string) {
		if err := os.Chtimes(p, week, week); err != nil {
			t.Fatal(err)
		}
	}
	// Blobs: one of 1 MiB (its space must be counted) and one used lately.
	c := artifact.NewCache(root)
	blob := func(body []byte) string {
		sum := sha256.Sum256(body)
		p, err := c.PutBlob(hex.EncodeToString(sum[:]), bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	oldBlob := blob(bytes.Repeat([]byte{7}, 1<<20))
	age(oldBlob)
	blob([]byte("in use"))
	unused = append(unused, oldBlob)
	// Trees of each kind.
	src := filepath.Join(t.TempDir(), "tree")
	if err := os.MkdirAll(filepath.Join(src, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "etc", "os-release"), []byte("ID=debian\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, kind := range []string{baseTreesDir, imageTreesDir, artifactTreesDir} {
		tc := rootfs.TreeCache{Dir: filepath.Join(root, kind)}
		oldKey, newKey := strings.Repeat("a", 64), strings.Repeat("b", 64)
		for _, k := range []string{oldKey, newKey} {
			if err := tc.Store(k, &rootfs.Tree{Dir: src}); err != nil {
				t.Fatal(err)
			}
		}
		age(filepath.Join(tc.Dir, oldKey, "tree.json"))
		unused = append(unused, filepath.Join(tc.Dir, oldKey))
	}
	// Initramfs archives.
	ird := filepath.Join(root, initramfsDir)
	if err := os.MkdirAll(ird, 0o755); err != nil {
		t.Fatal(err)
	}
	oldIR, newIR := filepath.Join(ird, strings.Repeat("c", 64)+".zstd"), filepath.Join(ird, strings.Repeat("d", 64)+".zstd")
	for _, p := range []string{oldIR, newIR} {
		if err := os.WriteFile(p, []byte("archive"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	age(oldIR)
	unused = append(unused, oldIR)
	// A base imported twice under one tag.
	layoutDir = filepath.Join(root, "base")
	tarPath := filepath.Join(t.TempDir(), "root.tar")
	for _, body := range []string{"one", "two"} {
		if err := os.WriteFile(tarPath, testkit.Tar(t, testkit.Entry{Name: "etc/os-release", Body: body}), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := rootfs.ImportTar(tarPath, layoutDir, "bookworm", time.Unix(0, 0).UTC()); err != nil {
			t.Fatal(err)
		}
		if body == "one" {
			blobs, _ := filepath.Glob(filepath.Join(layoutDir, "blobs", "sha256", "*"))
			for _, b := range blobs {
				age(b)
			}
			unused = append(unused, blobs...)
		}
	}
	return root, layoutDir, unused
}

func prunedEntries(p []Pruned) []string {
	var out []string
	for _, k := range p {
		out = append(out, k.Entries...)
	}
	slices.Sort(out)
	return out
}

func TestPruneCache(t *testing.T) {
	root, layoutDir, unused := pruneFixture(t)
	slices.Sort(unused)
	// A blob still linked from elsewhere frees nothing.
	blobs, _ := filepath.Glob(filepath.Join(root, "blobs", "sha256", "*"))
	var linked string
	for _, b := range blobs {
		if fi, _ := os.Stat(b); fi.Size() == 1<<20 {
			linked = filepath.Join(t.TempDir(), "linked")
			if err := os.Link(b, linked); err != nil {
				t.Fatal(err)
			}
		}
	}
	o := PruneOptions{Root: root, Layouts: []string{layoutDir}, Before: time.Now().Add(-24 * time.Hour), DryRun: true}
	dry, err := PruneCache(o)
	if err != nil {
		t.Fatal(err)
	}
	if got := prunedEntries(dry); !slices.Equal(got, unused) {
		t.Fatalf("dry run lists %v\nwant %v", got, unused)
	}
	for _, p := range unused {
		if _, err := os.Lstat(p); err != nil {
			t.Errorf("the dry run removed %s", p)
		}
	}
	if dry[0].Kind != "blobs" || dry[0].Bytes >= 1<<20 {
		t.Errorf("blobs free %d bytes with the big one still linked elsewhere; want less than 1 MiB", dry[0].Bytes)
	}
	os.Remove(linked)
	o.DryRun = false
	got, err := PruneCache(o)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(prunedEntries(got), unused) {
		t.Errorf("prune removed %v\nwant %v", prunedEntries(got), unused)
	}
	if got[0].Bytes < 1<<20 {
		t.Errorf("blobs freed %d bytes; want at least the 1 MiB blob", got[0].Bytes)
	}
	for _, p := range unused {
		if _, err := os.Lstat(p); err == nil {
			t.Errorf("%s is still there", p)
		}
	}
	// What is left is all in use: a second prune finds nothing, and the base still reads.
	again, err := PruneCache(o)
	if err != nil {
		t.Fatal(err)
	}
	if left := prunedEntries(again); len(left) != 0 {
		t.Errorf("second prune removed %v", left)
	}
	if _, err := rootfs.UnreferencedBlobs(layoutDir, time.Now()); err != nil {
		t.Errorf("the layout lost a blob it uses: %v", err)
	}
	for _, kind := range []string{baseTreesDir, imageTreesDir, artifactTreesDir} {
		tc := rootfs.TreeCache{Dir: filepath.Join(root, kind)}
		if _, ok, err := tc.Open(strings.Repeat("b", 64)); !ok || err != nil {
			t.Errorf("%s: the entry in use is gone: %v, %v", kind, ok, err)
		}
	}
	if _, err := PruneCache(PruneOptions{}); err == nil {
		t.Error("PruneCache without a root: no error")
	}
}

// TestPruneWaitsForBakes: no prune runs while a bake holds the cache, and no bake starts
// while a prune runs.
func TestPruneWaitsForBakes(t *testing.T) {
	root, layoutDir, unused := pruneFixture(t)
	bakes := make([]func(), 2) // two bakes side by side
	for i := range bakes {
		release, err := holdCache(root, false, false, nil)
		if err != nil {
			t.Fatalf("bake %d: %v", i, err)
		}
		bakes[i] = release
	}
	o := PruneOptions{Root: root, Layouts: []string{layoutDir}, Before: time.Now().Add(-24 * time.Hour), DryRun: true}
	if dry, err := PruneCache(o); err != nil || len(prunedEntries(dry)) != len(unused) {
		t.Fatalf("a dry run beside the bakes: %v, %d entries listed, want %d", err, len(prunedEntries(dry)), len(unused))
	}
	o.DryRun = false
	if _, err := PruneCache(o); !errors.Is(err, ErrCacheBusy) || !strings.Contains(err.Error(), root) {
		t.Fatalf("prune during a bake: %v, want ErrCacheBusy naming %s", err, root)
	}
	for _, p := range unused {
		if _, err := os.Lstat(p); err != nil {
			t.Fatalf("the refused prune removed %s", p)
		}
	}

	// --wait: the prune starts when the last bake is done.
	o.Wait = true
	waiting := make(chan struct{})
	o.Waiting = func() { close(waiting) }
	done := make(chan error, 1)
	go func() { _, err := PruneCache(o); done <- err }()
	<-waiting
	bakes[0]()
	select {
	case err := <-done:
		t.Fatalf("the prune ran with a bake still holding the cache (%v)", err)
	case <-time.After(300 * time.Millisecond):
	}
	bakes[1]()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	for _, p := range unused {
		if _, err := os.Lstat(p); err == nil {
			t.Errorf("%s is still there after the waiting prune", p)
		}
	}

	// A bake that starts during a prune waits for it.
	prune, err := holdCache(root, true, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := holdCache(root, false, false, nil); !errors.Is(err, ErrCacheBusy) {
		t.Fatalf("a bake during a prune: %v, want ErrCacheBusy", err)
	}
	waited := false
	started := make(chan func(), 1)
	go func() {
		release, err := holdCache(root, false, true, func() { waited = true })
		if err != nil {
			t.Error(err)
		}
		started <- release
	}()
	select {
	case <-started:
		t.Fatal("a bake started during a prune")
	case <-time.After(300 * time.Millisecond):
	}
	prune()
	(<-started)()
	if !waited {
		t.Error("the bake did not say it waited")
	}
}
