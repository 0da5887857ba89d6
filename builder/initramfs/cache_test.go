package initramfs

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"
)

// With a cache directory, an archive of the same records is the same bytes as one written
// without it, taken from the cache; other records miss; a damaged entry is not used.
func TestWriteCached(t *testing.T) {
	root := t.TempDir()
	fakeModulesDir(t, root, modulesKver)
	if err := os.Symlink("usr/lib", filepath.Join(root, "lib")); err != nil {
		t.Fatal(err)
	}
	spec := Spec{Root: root, KernelVersion: modulesKver, Init: staticInit(t), Modules: []string{"virtio_blk", "ext4"}}
	write := func(s Spec) ([]byte, *Manifest) {
		t.Helper()
		var buf bytes.Buffer
		man, err := Write(&buf, s)
		if err != nil {
			t.Fatal(err)
		}
		return buf.Bytes(), man
	}
	plain, plainMan := write(spec)

	cached := spec
	cached.CacheDir = filepath.Join(t.TempDir(), "initramfs")
	for i, what := range []string{"first (miss)", "second (hit)"} {
		got, man := write(cached)
		if !bytes.Equal(got, plain) || !reflect.DeepEqual(man, plainMan) {
			t.Errorf("%s write with a cache: %d bytes, manifest %+v; want the %d bytes and manifest of a write without", what, len(got), man, len(plain))
		}
		entries, _ := filepath.Glob(filepath.Join(cached.CacheDir, "*.zstd"))
		if len(entries) != 1 {
			t.Fatalf("after write %d the cache holds %q, want one zstd archive", i+1, entries)
		}
	}

	entries, _ := filepath.Glob(filepath.Join(cached.CacheDir, "*.zstd"))
	// A hit marks the entry used: kiln cache prune keeps it.
	week := time.Now().Add(-7 * 24 * time.Hour)
	if err := os.Chtimes(entries[0], week, week); err != nil {
		t.Fatal(err)
	}
	if unused, err := UnusedCache(cached.CacheDir, time.Now().Add(-time.Hour)); err != nil || len(unused) != 1 {
		t.Fatalf("UnusedCache of an entry a week old = %v, %v", unused, err)
	}
	write(cached)
	if unused, err := UnusedCache(cached.CacheDir, time.Now().Add(-time.Hour)); err != nil || len(unused) != 0 {
		t.Errorf("UnusedCache after a hit = %v, %v; want none", unused, err)
	}
	other := spec
	other.Modules = []string{"squashfs"}
	otherData, _ := write(other)
	if bytes.Equal(otherData, plain) {
		t.Fatal("other modules made the same archive")
	}
	// A damaged entry (truncated) is written again, not served.
	if err := os.WriteFile(entries[0], plain[:len(plain)/2], 0o644); err != nil {
		t.Fatal(err)
	}
	if got, _ := write(cached); !bytes.Equal(got, plain) {
		t.Errorf("with a truncated cache entry: %d bytes, want the %d of a fresh write", len(got), len(plain))
	}
	if data, err := os.ReadFile(entries[0]); err != nil || !bytes.Equal(data, plain) {
		t.Errorf("the truncated entry was not replaced (%d bytes, %v)", len(data), err)
	}
	// Other records: another entry.
	other.CacheDir = cached.CacheDir
	if got, _ := write(other); !bytes.Equal(got, otherData) {
		t.Error("other modules with the cache: not the archive written without it")
	}
	if all, _ := filepath.Glob(filepath.Join(cached.CacheDir, "*.zstd")); len(all) != 2 {
		t.Errorf("the cache holds %q, want two archives", all)
	}
}

// mapShared is a Shared in memory; spoil, when set, changes an entry on its way out.
type mapShared struct {
	entries    map[string][]byte
	spoil      bool
	gets, puts int
}

func (m *mapShared) Get(key string, read func(io.Reader) error) bool {
	m.gets++
	data, ok := m.entries[key]
	if !ok {
		return false
	}
	if m.spoil {
		data = data[:len(data)/2]
	}
	return read(bytes.NewReader(data)) == nil
}

func (m *mapShared) Put(key string, write func(io.Writer) error) {
	var b bytes.Buffer
	if write(&b) == nil {
		m.entries[key] = b.Bytes()
		m.puts++
	}
}

// With a shared store, an archive compressed on one machine is taken by another whose cache
// lacks it (the same bytes, nothing compressed or put again); an entry that does not
// decompress to the records' stream is not used.
func TestWriteShared(t *testing.T) {
	root := t.TempDir()
	fakeModulesDir(t, root, modulesKver)
	spec := Spec{Root: root, KernelVersion: modulesKver, Init: staticInit(t), Modules: []string{"virtio_blk"}}
	var plain bytes.Buffer
	if _, err := Write(&plain, spec); err != nil {
		t.Fatal(err)
	}
	shared := &mapShared{entries: map[string][]byte{}}
	for i, what := range []string{"first machine (put)", "second machine (get)", "third machine (a spoiled entry)"} {
		s := spec
		s.CacheDir, s.Shared = filepath.Join(t.TempDir(), "initramfs"), shared
		shared.spoil = i == 2
		var got bytes.Buffer
		if _, err := Write(&got, s); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got.Bytes(), plain.Bytes()) {
			t.Errorf("%s: %d bytes, want the %d of a write without a cache", what, got.Len(), plain.Len())
		}
		if want := []int{1, 1, 2}[i]; shared.puts != want {
			t.Errorf("%s: %d puts, want %d", what, shared.puts, want)
		}
	}
	if shared.gets != 3 {
		t.Errorf("%d gets, want one per machine", shared.gets)
	}
}

// BenchmarkWriteCached writes the same initramfs with and without its cache.
func BenchmarkWriteCached(b *testing.B) {
	root := b.TempDir()
	fakeModulesDir(b, root, modulesKver)
	os.Symlink("usr/lib", filepath.Join(root, "lib"))
	init := os.Getenv("KILN_INIT")
	if init == "" {
		b.Skip("KILN_INIT (a kiln-init binary, make build) is needed: the init dominates the archive")
	}
	spec := Spec{Root: root, KernelVersion: modulesKver, Init: init, Modules: []string{"virtio_blk", "ext4"}}
	for _, bc := range []struct {
		name  string
		cache string
	}{{"compressed", ""}, {"from-cache", b.TempDir()}} {
		b.Run(bc.name, func(b *testing.B) {
			s := spec
			s.CacheDir = bc.cache
			for b.Loop() {
				if _, err := Write(&bytes.Buffer{}, s); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
