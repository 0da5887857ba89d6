package rootfs

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kilnproject/kiln/internal/testkit"
)

// memShared is a Shared in memory; spoil, when set, changes a stream on its way out.
type memShared struct {
	entries map[string][]byte
	spoil   func([]byte) []byte
	puts    int
}

func (m *memShared) Get(key string, read func(io.Reader) error) bool {
	data, ok := m.entries[key]
	if !ok {
		return false
	}
	if m.spoil != nil {
		data = m.spoil(bytes.Clone(data))
	}
	return read(bytes.NewReader(data)) == nil
}

func (m *memShared) Put(key string, write func(io.Writer) error) {
	var b bytes.Buffer
	if write(&b) == nil {
		m.entries[key] = b.Bytes()
		m.puts++
	}
}

// TestTreeCacheShared: a tree stored by one cache is loaded by another, empty one through
// their shared store as it was: modes with their special bits, symlinks, files that are one
// inode, times, owners. An entry whose stream no longer matches its record is a miss.
func TestTreeCacheShared(t *testing.T) {
	work := t.TempDir()
	tree := flattened(t, work,
		testkit.Entry{Name: "bin/", Dir: true}, testkit.Entry{Name: "bin/tool", Body: "tool", Mode: 0o4755},
		testkit.Entry{Name: "bin/tool-again", Type: tar.TypeLink, Link: "bin/tool"},
		testkit.Entry{Name: "home/app/", Dir: true, UID: 1000, GID: 1000, Mode: 0o750},
		testkit.Entry{Name: "lib", Link: "usr/lib"}, testkit.Entry{Name: "tmp/", Dir: true, Mode: 0o1777},
		testkit.Entry{Name: "etc/", Dir: true, ModTime: time.Unix(1.5e9, 0)},
		testkit.Entry{Name: "etc/os-release", Body: "ID=test\n", ModTime: time.Unix(1.6e9, 0)})
	shared := &memShared{entries: map[string][]byte{}}
	a := TreeCache{Dir: filepath.Join(work, "a"), Shared: shared}
	key := strings.Repeat("c3", 32)
	if err := a.Store(key, tree); err != nil {
		t.Fatal(err)
	}
	if shared.puts != 1 {
		t.Fatalf("Store put %d entries, want 1", shared.puts)
	}

	b := TreeCache{Dir: filepath.Join(work, "b"), Shared: shared}
	got, ok, err := b.Load(key, filepath.Join(work, "hit"))
	if !ok || err != nil {
		t.Fatalf("Load from the shared store = %v, %v", ok, err)
	}
	want, _ := listTree(tree.Dir)
	have, _ := listTree(got.Dir)
	if d := listingDiff(have, want); d != "" {
		t.Errorf("the pulled tree differs: %s", d)
	}
	one, _ := os.Lstat(filepath.Join(got.Dir, "bin/tool"))
	two, _ := os.Lstat(filepath.Join(got.Dir, "bin/tool-again"))
	if !os.SameFile(one, two) {
		t.Error("bin/tool and its hard link are two files")
	}
	// Times as the cache that stored the tree has them: a file's from its layer, a
	// directory's from when that cache made it.
	for _, p := range []string{"etc", "etc/os-release"} {
		w, _ := os.Lstat(filepath.Join(a.Dir, key, "tree", p))
		h, _ := os.Lstat(filepath.Join(b.Dir, key, "tree", p))
		if !w.ModTime().Equal(h.ModTime()) {
			t.Errorf("%s: time %v, stored %v", p, h.ModTime(), w.ModTime())
		}
	}
	if fi, _ := os.Lstat(filepath.Join(got.Dir, "etc/os-release")); !fi.ModTime().Equal(time.Unix(1.6e9, 0)) {
		t.Errorf("etc/os-release: time %v, its layer's %v", fi.ModTime(), time.Unix(1.6e9, 0))
	}
	if o := got.Owners["home/app"]; o.UID != 1000 || o.GID != 1000 {
		t.Errorf("owner of home/app from the shared store = %+v", o)
	}
	if shared.puts != 1 {
		t.Errorf("a pulled entry was put back (%d puts)", shared.puts)
	}

	// A stream whose tree no longer matches its record (a file's content cut) is refused.
	c := TreeCache{Dir: filepath.Join(work, "c"), Shared: shared}
	shared.spoil = func(data []byte) []byte {
		var out bytes.Buffer
		tw := tar.NewWriter(&out)
		tr := tar.NewReader(bytes.NewReader(data))
		for {
			hdr, err := tr.Next()
			if err != nil {
				break
			}
			body, _ := io.ReadAll(tr)
			if hdr.Name == "tree/etc/os-release" {
				body, hdr.Size = body[:2], 2
			}
			tw.WriteHeader(hdr)
			tw.Write(body)
		}
		tw.Close()
		return out.Bytes()
	}
	if _, ok, err := c.Load(key, filepath.Join(work, "spoiled")); ok || err != nil {
		t.Errorf("Load of a spoiled shared entry = %v, %v; want a miss", ok, err)
	}
	if entries, _ := os.ReadDir(c.Dir); len(entries) != 0 {
		t.Errorf("a refused entry left %v in the cache", entries)
	}
}

// TestImportEntryRefuses: a stream that would write outside the entry, or is not an entry.
func TestImportEntryRefuses(t *testing.T) {
	record := testkit.Entry{Name: "tree.json", Body: "{}"}
	root := testkit.Entry{Name: "tree", Dir: true}
	for _, tc := range []struct {
		name    string
		entries []testkit.Entry
		want    string
	}{
		{"a name that climbs", []testkit.Entry{record, root, {Name: "tree/../../x", Body: "x"}}, "unexpected name"},
		{"a name outside tree", []testkit.Entry{record, root, {Name: "other", Body: "x"}}, "unexpected name"},
		{"through a symlink", []testkit.Entry{record, root, {Name: "tree/up", Link: "/"}, {Name: "tree/up/etc/x", Body: "x"}}, "tree/up/etc/x"},
		{"a hard link out", []testkit.Entry{record, root, {Name: "tree/pw", Type: tar.TypeLink, Link: "/etc/passwd"}}, "hard link"},
		{"a device", []testkit.Entry{record, root, {Name: "tree/null", Type: tar.TypeChar}}, "entry type"},
		{"no record", []testkit.Entry{root, {Name: "tree/x", Body: "x"}}, "no tree.json"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "entry")
			err := importEntry(bytes.NewReader(testkit.Tar(t, tc.entries...)), dir)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("importEntry = %v, want an error saying %q", err, tc.want)
			}
			if _, err := os.Stat("/etc/x"); !errors.Is(err, os.ErrNotExist) {
				t.Fatal("an entry wrote /etc/x")
			}
		})
	}
}
