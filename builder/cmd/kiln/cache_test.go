package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// cacheWithOldEntry makes $KILN_CACHE a cache holding one initramfs archive of 64 KiB that no
// bake has used for a week, and returns the cache and the archive.
func cacheWithOldEntry(t *testing.T) (root, old string) {
	t.Helper()
	root = t.TempDir()
	t.Setenv("KILN_CACHE", root)
	ird := filepath.Join(root, "initramfs")
	if err := os.MkdirAll(ird, 0o755); err != nil {
		t.Fatal(err)
	}
	old = filepath.Join(ird, strings.Repeat("e", 64)+".zstd")
	if err := os.WriteFile(old, make([]byte, 64<<10), 0o644); err != nil {
		t.Fatal(err)
	}
	week := time.Now().Add(-7 * 24 * time.Hour)
	if err := os.Chtimes(old, week, week); err != nil {
		t.Fatal(err)
	}
	return root, old
}

func TestCachePrune(t *testing.T) {
	root, old := cacheWithOldEntry(t)
	out, err := kiln(t, "cache", "prune", "--unused-for", "72h", "--dry-run")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "would remove 1 entry,") || !strings.Contains(out, "initramfs") {
		t.Errorf("dry run printed:\n%s", out)
	}
	if _, err := os.Stat(old); err != nil {
		t.Fatalf("the dry run removed %s", old)
	}
	// Kept: used within --unused-for.
	out, err = kiln(t, "cache", "prune", "--unused-for", "240h", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Cache  string `json:"cache"`
		Pruned []struct {
			Kind    string   `json:"kind"`
			Entries []string `json:"entries"`
			Bytes   int64    `json:"bytes"`
		} `json:"pruned"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("-o json: %v\n%s", err, out)
	}
	for _, p := range rep.Pruned {
		if len(p.Entries) != 0 {
			t.Errorf("--unused-for 240h removed %s: %v", p.Kind, p.Entries)
		}
	}
	out, err = kiln(t, "cache", "prune", "--unused-for", "72h")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "removed 1 entry, 0.1 MiB") {
		t.Errorf("prune printed:\n%s", out)
	}
	if _, err := os.Stat(old); !os.IsNotExist(err) {
		t.Errorf("%s is still there: %v", old, err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--unused-for", "0s"}, "--unused-for 0s: want a duration above zero"},
		{[]string{"--layout", root}, "--layout " + root + ": not an OCI image layout"},
		{[]string{"-o", "yaml"}, `--output "yaml": want table or json`},
	} {
		_, err := kiln(t, append([]string{"cache", "prune"}, tc.args...)...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("kiln cache prune %s: %v, want %q", strings.Join(tc.args, " "), err, tc.want)
		}
	}
}

// TestCachePruneDuringBake: a prune while a bake holds the cache fails, saying so and what to
// do, and removes nothing.
func TestCachePruneDuringBake(t *testing.T) {
	root, old := cacheWithOldEntry(t)
	// What a running bake holds (bake.Bake).
	f, err := os.OpenFile(filepath.Join(root, ".kiln-lock"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_SH); err != nil {
		t.Fatal(err)
	}
	_, err = kiln(t, "cache", "prune", "--unused-for", "72h")
	if want := "a bake is running on the cache: prune when no bake runs, or pass --wait"; err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("prune during a bake: %v, want %q", err, want)
	}
	if _, err := os.Stat(old); err != nil {
		t.Fatalf("the refused prune removed %s", old)
	}
}
