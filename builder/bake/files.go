package bake

import (
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"sort"
	"syscall"
)

func fileSHA256(p string) string {
	f, err := os.Open(p)
	if err != nil {
		return ""
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return ""
	}
	return hex.EncodeToString(h.Sum(nil))
}

func fileSize(p string) int64 {
	fi, err := os.Stat(p)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// allocated is the space a (sparse) file really takes on disk.
func allocated(p string) int64 {
	var st syscall.Stat_t
	if err := syscall.Stat(p, &st); err != nil {
		return 0
	}
	return st.Blocks * 512
}

func sortedStrings(s []string) []string {
	sort.Strings(s)
	return s
}
