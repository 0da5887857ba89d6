package rootfs

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/kilnproject/kiln/internal/testkit"
)

// LinkDir lays a directory of laid files (a cached artifact) over the tree as AddOverlay
// would copy it: files replaced, placed through the tree's own symlinks (merged /usr), never
// through them out of the tree; each file is the source's inode, with its mode.
func TestLinkDir(t *testing.T) {
	work := t.TempDir()
	host := filepath.Join(work, "host")
	if err := os.MkdirAll(host, 0o755); err != nil {
		t.Fatal(err)
	}
	before := testkit.Snapshot(t, host)
	dir := filepath.Join(work, "tree")
	for _, d := range []string{"usr/bin", "usr/sbin"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "usr/bin/tool"), []byte("the base's"), 0o644); err != nil {
		t.Fatal(err)
	}
	for name, target := range map[string]string{"sbin": "usr/sbin", "escape": host} {
		if err := os.Symlink(target, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	src := filepath.Join(work, "laid")
	for name, mode := range map[string]os.FileMode{"usr/bin/tool": 0o755, "sbin/runc": 0o755, "escape/x": 0o644, "opt/cni/bin/bridge": 0o4755} {
		p := filepath.Join(src, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(name), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
	}
	tree := &Tree{Dir: dir, Owners: map[string]Owner{}}
	if err := tree.LinkDir(src); err != nil {
		t.Fatal(err)
	}
	for from, to := range map[string]string{
		"usr/bin/tool":       "usr/bin/tool",
		"sbin/runc":          "usr/sbin/runc",
		"escape/x":           filepath.Join(host[1:], "x"),
		"opt/cni/bin/bridge": "opt/cni/bin/bridge",
	} {
		fi, err := os.Lstat(filepath.Join(dir, to))
		if err != nil {
			t.Errorf("%s did not land at /%s: %v", from, to, err)
			continue
		}
		si, err := os.Lstat(filepath.Join(src, from))
		if err != nil {
			t.Fatal(err)
		}
		if !os.SameFile(fi, si) || fi.Mode() != si.Mode() {
			t.Errorf("/%s: %v, not a link to %s (%v)", to, fi.Mode(), from, si.Mode())
		}
	}
	if d := before.Diff(testkit.Snapshot(t, host), nil); len(d) > 0 {
		t.Errorf("LinkDir wrote through a symlink out of the tree: %v", d)
	}
	if fi, err := os.Lstat(filepath.Join(dir, "sbin")); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Errorf("the tree's /sbin symlink was replaced: %v, %v", fi.Mode(), err)
	}
}
