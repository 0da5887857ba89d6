package rootfs

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kilnproject/kiln/internal/testkit"
)

// flattened flattens a one-layer base of entries into work/flat.
func flattened(t *testing.T, work string, entries ...testkit.Entry) *Tree {
	t.Helper()
	src, _ := writeLayout(t, testkit.Layer(t, entries...))
	img, err := OpenBase(context.Background(), src)
	if err != nil {
		t.Fatal(err)
	}
	tree, err := Flatten(img, filepath.Join(work, "flat"))
	if err != nil {
		t.Fatal(err)
	}
	return tree
}

func TestTreeCache(t *testing.T) {
	work := t.TempDir()
	tree := flattened(t, work,
		testkit.Entry{Name: "bin/", Dir: true}, testkit.Entry{Name: "bin/tool", Body: "tool", Mode: 0o4755},
		testkit.Entry{Name: "home/app/", Dir: true, UID: 1000, GID: 1000, Mode: 0o750},
		testkit.Entry{Name: "lib", Link: "usr/lib"}, testkit.Entry{Name: "tmp/", Dir: true, Mode: 0o1777})
	c := TreeCache{Dir: filepath.Join(work, "cache")}
	key := strings.Repeat("a1", 32)
	if _, ok, err := c.Load(key, filepath.Join(work, "miss")); ok || err != nil {
		t.Fatalf("Load of an empty cache = %v, %v", ok, err)
	}
	if err := c.Store(key, tree); err != nil {
		t.Fatal(err)
	}
	got, ok, err := c.Load(key, filepath.Join(work, "hit"))
	if !ok || err != nil {
		t.Fatalf("Load after Store = %v, %v", ok, err)
	}
	if b, err := os.ReadFile(filepath.Join(got.Dir, "bin/tool")); err != nil || string(b) != "tool" {
		t.Errorf("bin/tool = %q, %v", b, err)
	}
	if fi, err := os.Stat(filepath.Join(got.Dir, "bin/tool")); err != nil || fi.Mode()&os.ModeSetuid == 0 {
		t.Errorf("bin/tool lost its setuid bit: %v %v", fi.Mode(), err)
	}
	if l, err := os.Readlink(filepath.Join(got.Dir, "lib")); err != nil || l != "usr/lib" {
		t.Errorf("lib -> %q, %v", l, err)
	}
	// A cached tree is the flattened one: /tmp keeps its sticky bit (the image's /tmp would
	// otherwise let anyone remove anyone's files).
	for _, dir := range []string{tree.Dir, got.Dir} {
		if fi, err := os.Stat(filepath.Join(dir, "tmp")); err != nil || fi.Mode()&os.ModeSticky == 0 || fi.Mode().Perm() != 0o777 {
			t.Errorf("%s/tmp: %v, %v; want drwxrwxrwt", dir, fi.Mode(), err)
		}
	}
	if o := got.Owners["home/app"]; o.UID != 1000 || o.GID != 1000 || o.Mode.Perm() != 0o750 {
		t.Errorf("owner of home/app from the cache = %+v", o)
	}
	// The loaded tree goes away with the bake's work directory; the cache keeps its own links.
	os.RemoveAll(got.Dir)
	if _, ok, _ := c.Load(key, filepath.Join(work, "again")); !ok {
		t.Error("removing a loaded tree emptied the cache")
	}
	// A cached tree that changed (a file truncated) is dropped, not handed out.
	if err := os.Truncate(filepath.Join(c.Dir, key, "tree", "bin", "tool"), 1); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := c.Load(key, filepath.Join(work, "changed")); ok || err != nil {
		t.Errorf("Load of a changed tree = %v, %v; want a miss", ok, err)
	}
	if _, err := os.Stat(filepath.Join(c.Dir, key)); !os.IsNotExist(err) {
		t.Errorf("the changed entry is still cached (%v)", err)
	}
	// A tree stored by an earlier kiln, whose record has another version, is dropped.
	key2 := strings.Repeat("b2", 32)
	if err := c.Store(key2, tree); err != nil {
		t.Fatal(err)
	}
	rec := filepath.Join(c.Dir, key2, "tree.json")
	data := testkit.ReadFile(t, rec)
	if err := os.WriteFile(rec, []byte(strings.Replace(string(data), `"version":2,`, "", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := c.Load(key2, filepath.Join(work, "v1")); ok || err != nil {
		t.Errorf("Load of a version 1 tree = %v, %v; want a miss", ok, err)
	}
	if _, _, err := c.Load("../x", filepath.Join(work, "bad")); err == nil {
		t.Error("a key that is not a sha256 hex was accepted")
	}
}
