package config

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"strings"
	"testing"

	"github.com/kilnproject/kiln/internal/testkit"
	"github.com/vincent-petithory/dataurl"
)

// zeroBomb returns a gzip stream of n bytes of zeros, built from concatenated gzip
// members (gzip readers read them as one stream), so a bomb of any size costs one
// compression of at most 64 MiB.
func zeroBomb(t *testing.T, n int64) []byte {
	t.Helper()
	const member = 64 << 20
	compress := func(size int64) []byte {
		var b bytes.Buffer
		zw, err := gzip.NewWriterLevel(&b, gzip.BestCompression)
		if err != nil {
			t.Fatal(err)
		}
		zeros := make([]byte, 1<<20)
		for size > 0 {
			k := min(size, int64(len(zeros)))
			zw.Write(zeros[:k])
			size -= k
		}
		if err := zw.Close(); err != nil {
			t.Fatal(err)
		}
		return b.Bytes()
	}
	full := compress(min(n, member))
	var out bytes.Buffer
	for ; n >= member; n -= member {
		out.Write(full)
	}
	if n > 0 {
		out.Write(compress(n))
	}
	return out.Bytes()
}

// TestAttackDataURLBomb: gzip'd data: URLs that decompress to more than the node can
// hold are refused, naming the entry, before more than the caps is decompressed: one
// 10 GiB bomb (over the 64 MiB cap on one file's contents) and files that are each under
// that cap but add up to more than the 128 MiB cap on all of them.
func TestAttackDataURLBomb(t *testing.T) {
	tests := []struct {
		name      string
		sizes     []int64 // decompressed size of each file
		wantField string
		wantCap   string
	}{
		{name: "one 10 GiB file", sizes: []int64{10 << 30}, wantField: "storage.files[0].contents", wantCap: "64 MiB cap"},
		{name: "three 60 MiB files", sizes: []int64{60 << 20, 60 << 20, 60 << 20}, wantField: "storage.files[2].contents", wantCap: "128 MiB cap"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var entries []string
			for i, n := range tc.sizes {
				entries = append(entries, fmt.Sprintf(`{"path":"/var/bomb%d","contents":{"source":%q,"compression":"gzip"}}`,
					i, dataurl.EncodeBytes(zeroBomb(t, n))))
			}
			raw := `{"ignition":{"version":"3.4.0"},"storage":{"files":[` + strings.Join(entries, ",") + `]}}`
			c, err := Parse([]byte(raw))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if err := c.Validate(); err != nil {
				t.Fatalf("Validate: %v", err)
			}
			before := testkit.HeapAllocated()
			files, err := c.Files()
			grown := testkit.HeapAllocated() - before
			if err == nil {
				var total int
				for _, f := range files {
					total += len(f.Contents)
				}
				t.Fatalf("Files decompressed %d MiB without complaint", total>>20)
			}
			if !strings.Contains(err.Error(), tc.wantField+": ") || !strings.Contains(err.Error(), tc.wantCap) {
				t.Errorf("error %q; want it to name %s and the %s", err, tc.wantField, tc.wantCap)
			}
			// Decompressing into a growing buffer allocates about twice what it holds.
			if limit := uint64(3 * MaxFilesSize); grown > limit {
				t.Errorf("Files allocated %d MiB, want at most %d MiB", grown>>20, limit>>20)
			}
		})
	}
}
