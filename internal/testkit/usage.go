package testkit

import (
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
)

// DiskUse adds up the disk blocks, in bytes, that path takes and, for a directory, every
// file below it: a sparse file counts only what was written.
func DiskUse(path string) int64 {
	var n int64
	filepath.Walk(path, func(p string, fi os.FileInfo, err error) error {
		if err == nil {
			n += Allocated(fi)
		}
		return nil
	})
	return n
}

// Allocated is the bytes fi takes on disk, or its size where the file system does not say.
func Allocated(fi fs.FileInfo) int64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Blocks * 512
	}
	return fi.Size()
}

// HeapAllocated is the bytes allocated on the heap so far. It only grows, so the difference
// of two readings bounds what was held in between.
func HeapAllocated() uint64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.TotalAlloc
}

// SparseFile makes a file of size bytes, all a hole, in a new temporary directory, for a
// test to use as a disk.
func SparseFile(t testing.TB, size int64) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "disk.img")
	if err := os.WriteFile(p, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(p, size); err != nil {
		t.Fatal(err)
	}
	return p
}
