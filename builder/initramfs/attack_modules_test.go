package initramfs

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kilnproject/kiln/internal/testkit"
)

// The kernel version and squashfs module path of the trees in modulesInTreeCases.
const (
	modulesKver = "6.1.0-test-amd64"
	squashfsKo  = "kernel/fs/squashfs/squashfs.ko"
)

// hostTree stands for the build host's files: an ELF module whose .modinfo carries the
// sentinel, and a module directory naming it.
type hostTree struct {
	dir      string
	sentinel string
	climb    string // a relative path from anywhere in a tree up to dir
	files    testkit.Tree
}

func newHostTree(t *testing.T) hostTree {
	t.Helper()
	host := t.TempDir()
	sentinel := "HOST-SENTINEL " + strings.Repeat("build host secret ", 4)
	hostModule := elfModule("name=squashfs", "description="+sentinel)
	write(t, filepath.Join(host, "sentinel.ko"), string(hostModule))
	write(t, filepath.Join(host, "squashfs.ko"), string(hostModule))
	write(t, filepath.Join(host, "modules.dep"), "kernel/fs/squashfs/squashfs.ko:\n# "+sentinel+"\n")
	write(t, filepath.Join(host, "modules.alias"), "alias "+strings.ReplaceAll(sentinel, " ", "_")+" squashfs\n")
	write(t, filepath.Join(host, "mods", modulesKver, "modules.dep"), "kernel/fs/squashfs/squashfs.ko:\n")
	write(t, filepath.Join(host, "mods", modulesKver, squashfsKo), string(hostModule))
	return hostTree{
		dir: host, sentinel: sentinel,
		climb: strings.Repeat("../", 64) + strings.TrimPrefix(host, "/"),
		files: testkit.Snapshot(t, host),
	}
}

// expand puts the host's directory and the climb to it in for {host} and {climb}.
func (h hostTree) expand(s string) string {
	return strings.NewReplacer("{host}", h.dir, "{climb}", h.climb).Replace(s)
}

// modulesInTreeCase changes a tree's modules directory and says how Write must fail on it.
type modulesInTreeCase struct {
	name    string
	setup   func(t *testing.T, h hostTree, root, dir string) // dir: the tree's usr/lib/modules/<kver>
	modules []string
	wantErr []string // none: Write succeeds and squashfs.ko is the tree's own; {host} and {climb} are expanded
}

var modulesInTreeCases = []modulesInTreeCase{
	{
		name: "modules.dep entry climbing out",
		setup: func(t *testing.T, h hostTree, root, dir string) {
			write(t, filepath.Join(dir, "modules.dep"), "kernel/fs/squashfs/squashfs.ko:\n"+h.climb+"/sentinel.ko:\n")
		},
		modules: []string{"sentinel"},
		wantErr: []string{"modules.dep:2", "{climb}/sentinel.ko", "not a plain path"},
	},
	{
		name: "absolute modules.dep entry",
		setup: func(t *testing.T, h hostTree, root, dir string) {
			write(t, filepath.Join(dir, "modules.dep"), h.dir+"/sentinel.ko:\n")
		},
		modules: []string{"sentinel"},
		wantErr: []string{"modules.dep:1", "{host}/sentinel.ko", "not a plain path"},
	},
	{
		name: "dependency climbing out",
		setup: func(t *testing.T, h hostTree, root, dir string) {
			write(t, filepath.Join(dir, "modules.dep"), "kernel/fs/squashfs/squashfs.ko: ../../../../sentinel.ko\n")
		},
		modules: []string{"squashfs"},
		wantErr: []string{"modules.dep:1", `"../../../../sentinel.ko"`},
	},
	{
		name: "module file: absolute symlink to a host file",
		setup: func(t *testing.T, h hostTree, root, dir string) {
			symlink(t, h.dir+"/sentinel.ko", filepath.Join(dir, squashfsKo))
		},
		modules: []string{"squashfs"},
		wantErr: []string{squashfsKo, `a symlink to "{host}/sentinel.ko"`, "refused"},
	},
	{
		name: "module file: relative symlink climbing out",
		setup: func(t *testing.T, h hostTree, root, dir string) {
			symlink(t, h.climb+"/sentinel.ko", filepath.Join(dir, squashfsKo))
		},
		modules: []string{"squashfs"},
		wantErr: []string{squashfsKo, "a symlink to", "refused"},
	},
	{
		name: "module's directory symlinked to the host",
		setup: func(t *testing.T, h hostTree, root, dir string) {
			if err := os.RemoveAll(filepath.Join(dir, "kernel/fs/squashfs")); err != nil {
				t.Fatal(err)
			}
			symlink(t, h.dir, filepath.Join(dir, "kernel/fs/squashfs"))
		},
		modules: []string{"squashfs"},
		wantErr: []string{squashfsKo, "refused"},
	},
	{
		name: "modules.dep symlinked to the host",
		setup: func(t *testing.T, h hostTree, root, dir string) {
			symlink(t, h.dir+"/modules.dep", filepath.Join(dir, "modules.dep"))
		},
		modules: []string{"squashfs"},
		wantErr: []string{modulesKver + "/modules.dep", "refused"},
	},
	{
		name: "modules.alias climbing out",
		setup: func(t *testing.T, h hostTree, root, dir string) {
			symlink(t, h.climb+"/modules.alias", filepath.Join(dir, "modules.alias"))
		},
		modules: []string{"squashfs"},
		wantErr: []string{"modules.alias", "refused"},
	},
	{
		name: "modules.softdep symlinked to the host",
		setup: func(t *testing.T, h hostTree, root, dir string) {
			symlink(t, h.dir+"/modules.dep", filepath.Join(dir, "modules.softdep"))
		},
		modules: []string{"squashfs"},
		wantErr: []string{"modules.softdep", "refused"},
	},
	{
		name: "modules.builtin.modinfo symlinked to the host",
		setup: func(t *testing.T, h hostTree, root, dir string) {
			symlink(t, h.dir+"/sentinel.ko", filepath.Join(dir, "modules.builtin.modinfo"))
		},
		modules: []string{"squashfs"},
		wantErr: []string{"modules.builtin.modinfo", "refused"},
	},
	{
		name: "module directory symlinked to the host",
		setup: func(t *testing.T, h hostTree, root, dir string) {
			if err := os.RemoveAll(dir); err != nil {
				t.Fatal(err)
			}
			symlink(t, filepath.Join(h.dir, "mods", modulesKver), dir)
		},
		modules: []string{"squashfs"},
		wantErr: []string{modulesKver + "/modules.dep", "refused"},
	},
	{
		name: "module file: relative symlink inside the tree",
		setup: func(t *testing.T, h hostTree, root, dir string) {
			write(t, filepath.Join(root, "usr/share/mods/squashfs.ko"), string(elfModule("name=squashfs")))
			symlink(t, "../../../../../../share/mods/squashfs.ko", filepath.Join(dir, squashfsKo))
		},
		modules: []string{"squashfs"},
	},
	{
		name: "module directory: relative symlink inside the tree",
		setup: func(t *testing.T, h hostTree, root, dir string) {
			if err := os.Rename(dir, filepath.Join(root, "opt-kernel")); err != nil {
				t.Fatal(err)
			}
			symlink(t, "../../../opt-kernel", dir)
		},
		modules: []string{"squashfs"},
	},
}

// The initramfs takes kernel modules and their tables from the root tree only. A hostile
// tree — a modules.dep entry that is absolute or climbs out with "..", a module file or
// table that is an absolute symlink or one climbing out, a module directory symlinked out
// — fails Write with an error naming the entry, and the build host's file it points at is
// never read into the archive. Symlinks that stay inside the tree still work.
func TestWriteModulesStayInTree(t *testing.T) {
	host := newHostTree(t)
	initBin := staticInit(t)
	for _, tc := range modulesInTreeCases {
		t.Run(tc.name, func(t *testing.T) { checkModulesInTree(t, host, initBin, tc) })
	}
}

// checkModulesInTree writes an initramfs from a tree the case has changed and checks that
// no host file is read or changed, and that Write fails naming the entry or takes the
// tree's own module.
func checkModulesInTree(t *testing.T, h hostTree, initBin string, tc modulesInTreeCase) {
	root := t.TempDir()
	dir := fakeModulesDir(t, root, modulesKver)
	if err := os.Symlink("usr/lib", filepath.Join(root, "lib")); err != nil {
		t.Fatal(err)
	}
	own := elfModule("name=squashfs") // what fakeModulesDir wrote
	tc.setup(t, h, root, dir)
	var buf bytes.Buffer
	_, err := Write(&buf, Spec{Root: root, KernelVersion: modulesKver, Modules: tc.modules, Init: initBin, Compression: None})
	if bytes.Contains(buf.Bytes(), []byte(h.sentinel)) || bytes.Contains(buf.Bytes(), []byte(strings.ReplaceAll(h.sentinel, " ", "_"))) {
		t.Error("the host sentinel is in the initramfs")
	}
	if d := h.files.Diff(testkit.Snapshot(t, h.dir), nil); len(d) > 0 {
		t.Errorf("host files changed:\n%s", strings.Join(d, "\n"))
	}
	if len(tc.wantErr) == 0 {
		if err != nil {
			t.Fatalf("Write: %v", err)
		}
		_, contents, err := listArchive(bytes.NewReader(buf.Bytes()))
		if err != nil {
			t.Fatal(err)
		}
		if got := contents["/lib/modules/"+modulesKver+"/"+squashfsKo]; !bytes.Equal(got, own) {
			t.Errorf("initramfs %s has %d bytes, want the tree's %d", squashfsKo, len(got), len(own))
		}
		return
	}
	if err == nil {
		t.Fatal("Write succeeded; want an error naming the entry")
	}
	if strings.Contains(err.Error(), h.sentinel) {
		t.Errorf("the host sentinel is in the error: %v", err)
	}
	for _, s := range tc.wantErr {
		if s := h.expand(s); !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not mention %q", err, s)
		}
	}
}

func symlink(t *testing.T, target, name string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
		t.Fatal(err)
	}
	os.Remove(name)
	if err := os.Symlink(target, name); err != nil {
		t.Fatal(err)
	}
}
