package output

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"path/filepath"
	"testing"
)

// extent is data written at an offset of a sparse file.
type extent struct {
	off  int64
	data []byte
}

func sparseFile(t testing.TB, size int64, extents ...extent) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "disk.raw")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	for _, e := range extents {
		if _, err := f.WriteAt(e.data, e.off); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

// HashFile of a sparse file is the SHA-256 of every byte it reads as, holes as zeros,
// wherever its data and holes lie.
func TestHashFileSparse(t *testing.T) {
	const mib = 1 << 20
	block := bytes.Repeat([]byte("kiln"), mib/4)
	for _, tc := range []struct {
		name    string
		size    int64
		extents []extent
	}{
		{"empty", 0, nil},
		{"all hole", 8 * mib, nil},
		{"dense", 2 * mib, []extent{{0, block}, {mib, block}}},
		{"data at the start", 8 * mib, []extent{{0, block}}},
		{"data in the middle", 9 * mib, []extent{{4 * mib, block}}},
		{"data at the end", 8 * mib, []extent{{7 * mib, block}}},
		{"data not on a block boundary", 5*mib + 3, []extent{{12345, []byte("partition table")}, {5*mib - 7, []byte("last ten")}}},
		{"many extents", 64 * mib, []extent{{0, block}, {10 * mib, block}, {33*mib + 17, block}, {63 * mib, block}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := sparseFile(t, tc.size, tc.extents...)
			whole, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			want := sha256.Sum256(whole)
			got, size, err := HashFile(p)
			if err != nil || got != hex.EncodeToString(want[:]) || size != int64(len(whole)) {
				t.Errorf("HashFile = %s, %d, %v; want %x, %d", got, size, err, want, len(whole))
			}
		})
	}
}

// BenchmarkHashFileFreshSparse hashes a 1 GiB sparse file with 64 MiB of data right after
// it is written, as the bake hashes its raw disk: HashFile, and reading the whole file for
// comparison.
func BenchmarkHashFileFreshSparse(b *testing.B) {
	data := bytes.Repeat([]byte{0xa5}, 32<<20)
	for _, bc := range []struct {
		name string
		hash func(p string) error
	}{
		{"holes-not-read", func(p string) error { _, _, err := HashFile(p); return err }},
		{"read-whole", func(p string) error {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = io.Copy(sha256.New(), f)
			return err
		}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				b.StopTimer()
				p := sparseFile(b, 1<<30, extent{0, data}, extent{512 << 20, data})
				b.StartTimer()
				if err := bc.hash(p); err != nil {
					b.Fatal(err)
				}
			}
			b.SetBytes(1 << 30)
		})
	}
}
