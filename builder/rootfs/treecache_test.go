package rootfs

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

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

// A tree recycled after a bake leaves the cached tree's directories as the next Load's, and that
// Load gives the same tree as one made from nothing: the bake's own files and directories gone,
// the directories' modes the tree's, a stray entry in the skeleton never reaching it.
func TestTreeCacheSkeleton(t *testing.T) {
	work := t.TempDir()
	tree := flattened(t, work,
		testkit.Entry{Name: "etc/", Dir: true}, testkit.Entry{Name: "etc/os-release", Body: "kiln"},
		testkit.Entry{Name: "usr/", Dir: true}, testkit.Entry{Name: "usr/lib/", Dir: true, Mode: 0o555},
		testkit.Entry{Name: "usr/lib/libc.so", Body: "libc"}, testkit.Entry{Name: "lib", Link: "usr/lib"},
		testkit.Entry{Name: "opt/", Dir: true}, testkit.Entry{Name: "tmp/", Dir: true, Mode: 0o1777})
	c := TreeCache{Dir: filepath.Join(work, "cache")}
	key := strings.Repeat("b2", 32)
	if err := c.Store(key, tree); err != nil {
		t.Fatal(err)
	}
	want, err := listTree(filepath.Join(c.Dir, key, "tree"))
	if err != nil {
		t.Fatal(err)
	}
	sk := filepath.Join(c.Dir, key, "skeleton")
	load := func(name string) string {
		t.Helper()
		got, ok, err := c.Load(key, filepath.Join(work, name))
		if !ok || err != nil {
			t.Fatalf("Load = %v, %v", ok, err)
		}
		return got.Dir
	}
	// What a bake does to its tree: a file, a directory and a file in a base directory
	// added, a base directory replaced by a file, a base directory's mode changed.
	bake := func(dir string) {
		t.Helper()
		for _, err := range []error{
			os.WriteFile(filepath.Join(dir, "etc", "hostname"), []byte("node"), 0o644),
			os.MkdirAll(filepath.Join(dir, "var", "lib", "kubelet"), 0o755),
			os.Remove(filepath.Join(dir, "opt")),
			os.WriteFile(filepath.Join(dir, "opt"), []byte("not a directory"), 0o644),
			os.Chmod(filepath.Join(dir, "tmp"), 0o700),
		} {
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	first := load("first")
	bake(first)
	if err := c.Recycle(key, first); err != nil {
		t.Fatal(err)
	}
	if exists(first) {
		t.Errorf("Recycle left %s", first)
	}
	if err := onlyDirsOf(sk, filepath.Join(c.Dir, key, "tree")); err != nil {
		t.Errorf("the skeleton holds more than the tree's directories: %v", err)
	}
	if fi, err := os.Stat(filepath.Join(sk, "usr", "lib")); err != nil || !fi.IsDir() {
		t.Errorf("the skeleton has no usr/lib: %v", err)
	}
	check := func(dir string) {
		t.Helper()
		got, err := listTree(dir)
		if err != nil {
			t.Fatal(err)
		}
		// A loaded tree's directories are its owner's to write (0o700 or'ed in).
		for i := range want {
			if want[i].Mode.IsDir() {
				want[i].Mode |= 0o700
			}
		}
		if d := listingDiff(got, want); d != "" {
			t.Errorf("the tree loaded into the skeleton differs from the cached one: %s", d)
		}
	}
	second := load("second")
	if exists(sk) {
		t.Error("Load left the skeleton it took")
	}
	check(second)

	// Another bake's skeleton kept already: the tree is removed whole.
	bake(second)
	third := load("third") // no skeleton: made from nothing
	if err := c.Recycle(key, second); err != nil {
		t.Fatal(err)
	}
	if err := c.Recycle(key, third); err != nil {
		t.Fatal(err)
	}
	if exists(second) || exists(third) {
		t.Error("Recycle left a tree")
	}
	// A skeleton with anything but the tree's directories is not used.
	for _, stray := range []string{"etc/shadow", "srv/"} {
		p := filepath.Join(sk, stray)
		if strings.HasSuffix(stray, "/") {
			err = os.Mkdir(p, 0o755)
		} else {
			err = os.WriteFile(p, []byte("stray"), 0o600)
		}
		if err != nil {
			t.Fatal(err)
		}
		check(load("stray-" + strings.Trim(strings.ReplaceAll(stray, "/", "-"), "-")))
		if exists(sk) {
			t.Error("a spoiled skeleton was kept")
		}
		if err := os.MkdirAll(filepath.Join(sk, "etc"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// A skeleton with some of the tree's directories is used, the others made.
	check(load("partial"))
	if exists(sk) {
		t.Error("Load left the skeleton it took")
	}
}

// TestTreeCacheUnused: an entry Store wrote or Open checked lately is in use; one neither
// touched since is not, nor is a partial entry or an unfinished store; other files are not the
// cache's.
func TestTreeCacheUnused(t *testing.T) {
	work := t.TempDir()
	tree := flattened(t, work, testkit.Entry{Name: "bin/", Dir: true}, testkit.Entry{Name: "bin/tool", Body: "tool"})
	c := TreeCache{Dir: filepath.Join(work, "cache")}
	old, opened, fresh := strings.Repeat("a1", 32), strings.Repeat("b2", 32), strings.Repeat("c3", 32)
	for _, k := range []string{old, opened, fresh} {
		if err := c.Store(k, tree); err != nil {
			t.Fatal(err)
		}
	}
	week := time.Now().Add(-7 * 24 * time.Hour)
	partial, store, foreign := filepath.Join(c.Dir, strings.Repeat("d4", 32)), filepath.Join(c.Dir, storeTempPrefix+"1"), filepath.Join(c.Dir, "notes")
	for _, d := range []string{partial, store, foreign} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []string{filepath.Join(c.Dir, old, "tree.json"), filepath.Join(c.Dir, opened, "tree.json"), partial, store, foreign} {
		if err := os.Chtimes(p, week, week); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok, err := c.Open(opened); !ok || err != nil {
		t.Fatalf("Open = %v, %v", ok, err)
	}
	got, err := c.Unused(time.Now().Add(-24 * time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{filepath.Join(c.Dir, old), partial, store}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("Unused = %v\nwant %v", got, want)
	}
	if got, err := (TreeCache{Dir: filepath.Join(work, "none")}).Unused(time.Now()); got != nil || err != nil {
		t.Errorf("Unused of a cache never written = %v, %v", got, err)
	}
}
