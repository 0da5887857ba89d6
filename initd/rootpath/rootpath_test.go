package rootpath

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestResolve(t *testing.T) {
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "usr/lib/systemd"), 0o755)
	os.Symlink("usr/lib", filepath.Join(root, "lib"))
	os.Symlink("/usr/lib/systemd", filepath.Join(root, "abs"))
	os.Symlink("../../../../../etc", filepath.Join(root, "usr/lib/escape"))
	os.WriteFile(filepath.Join(root, "file"), nil, 0o644)
	os.Symlink("loop", filepath.Join(root, "loop"))
	r, err := os.OpenRoot(root)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for _, tc := range []struct{ in, want, err string }{
		{in: "lib/systemd/x.service", err: "no such file"},
		{in: "lib/systemd", want: "usr/lib/systemd"},
		{in: "abs", want: "usr/lib/systemd"},
		{in: "usr/lib/escape", err: "no such file"}, // ".." stops at the root: /etc is absent
		{in: "file/x", err: "/file is not a directory"},
		{in: "loop", err: "too many levels"},
		{in: "/", want: "."},
	} {
		got, err := Resolve(r, tc.in, nil)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("Resolve(%q) = %q, %v; want error %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("Resolve(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	if _, err := Resolve(r, "lib/none/x", nil); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing component: %v, want fs.ErrNotExist", err)
	}
	var made []string
	got, err := Resolve(r, "lib/new/dir", func(rel string) error { made = append(made, rel); return r.Mkdir(rel, 0o755) })
	if err != nil || got != "usr/lib/new/dir" || strings.Join(made, ",") != "usr/lib/new,usr/lib/new/dir" {
		t.Errorf("Resolve with mkdir = %q, %v (made %v)", got, err, made)
	}
}
