package lastuse

import (
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestUnused(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	week := now.Add(-7 * 24 * time.Hour)
	for _, f := range []struct {
		name string
		at   time.Time
	}{
		{"old", week}, {"new", now}, {"old-marked", week}, {"other-old", week},
		{"old-dir/", week}, {"dir-used/", week}, {"dir-used/mark", now},
	} {
		p := filepath.Join(dir, strings.TrimSuffix(f.name, "/"))
		if strings.HasSuffix(f.name, "/") {
			if err := os.Mkdir(p, 0o755); err != nil {
				t.Fatal(err)
			}
		} else if err := os.WriteFile(p, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, f.at, f.at); err != nil {
			t.Fatal(err)
		}
	}
	Mark(filepath.Join(dir, "old-marked"))
	ours := func(e fs.DirEntry) bool { return !strings.HasPrefix(e.Name(), "other") }
	marking := func(entry string) string {
		if m := filepath.Join(entry, "mark"); exists(m) {
			return m
		}
		return entry
	}
	got, err := Unused(dir, now.Add(-24*time.Hour), ours, marking)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{filepath.Join(dir, "old"), filepath.Join(dir, "old-dir")}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("Unused = %v, want %v", got, want)
	}
	if got, err := Unused(filepath.Join(dir, "none"), now, ours, nil); got != nil || err != nil {
		t.Errorf("Unused of a missing directory = %v, %v; want none", got, err)
	}
	if _, err := Unused(filepath.Join(dir, "old"), now, ours, nil); err == nil {
		t.Error("Unused of a file: no error")
	}
}

func exists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}
