package initramfs

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/kilnproject/kiln/internal/testkit"
	"github.com/u-root/u-root/pkg/cpio"

	"github.com/kilnproject/kiln/internal/nodeimage"
)

// staticInit builds a tiny static Go program to stand in for kiln-init.
func staticInit(t *testing.T) string {
	return testkit.GoProgram(t, "package main\n\nfunc main() { println(\"fake init\") }\n")
}

func TestWrite(t *testing.T) {
	root := t.TempDir()
	fakeModulesDir(t, root, modulesKver)
	if err := os.Symlink("usr/lib", filepath.Join(root, "lib")); err != nil {
		t.Fatal(err)
	}
	initBin := staticInit(t)
	initData, err := os.ReadFile(initBin)
	if err != nil {
		t.Fatal(err)
	}
	spec := Spec{Root: root, KernelVersion: modulesKver, Init: initBin,
		Modules: []string{"virtio_blk", "squashfs", "ext4", "erofs"}}

	for _, comp := range []string{"", Zstd, Gzip, None} {
		t.Run("compression="+comp, func(t *testing.T) {
			spec := spec
			spec.Compression = comp
			var buf bytes.Buffer
			man, err := Write(&buf, spec)
			if err != nil {
				t.Fatal(err)
			}
			entries, contents, err := listArchive(bytes.NewReader(buf.Bytes()))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(entries, man.Entries) {
				t.Errorf("archive records differ from manifest:\n got %v\nwant %v", entries, man.Entries)
			}
			byName := checkEntryOrder(t, entries)
			in := byName["/init"]
			if in.Mode != cpio.S_IFREG|0o755 || !bytes.Equal(contents["/init"], initData) {
				t.Errorf("/init: mode %o, %d bytes; want regular 0755 with the %d bytes of %s", in.Mode, len(contents["/init"]), len(initData), initBin)
			}
			checkBaseEntries(t, byName)
			checkModulesLoaded(t, root, man, contents)

			var again bytes.Buffer
			if _, err := Write(&again, spec); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(buf.Bytes(), again.Bytes()) {
				t.Error("two writes of the same spec differ")
			}
		})
	}
}

// checkEntryOrder checks that the records are sorted, each after its directory, and
// returns them by name.
func checkEntryOrder(t *testing.T, entries []entry) map[string]entry {
	t.Helper()
	byName := map[string]entry{}
	for i, e := range entries {
		byName[e.Name] = e
		if i > 0 && entries[i-1].Name >= e.Name {
			t.Errorf("records not sorted: %s before %s", entries[i-1].Name, e.Name)
		}
		if parent := filepath.Dir(e.Name); parent != "/" {
			if p, ok := byName[parent]; !ok || !p.IsDir() {
				t.Errorf("%s comes before its directory %s", e.Name, parent)
			}
		}
	}
	return byName
}

// checkBaseEntries checks the directories and device nodes every initramfs has.
func checkBaseEntries(t *testing.T, byName map[string]entry) {
	t.Helper()
	for _, d := range []string{"/dev", "/proc", "/sys", "/run", "/sysroot", "/tmp", "/etc/kiln"} {
		if !byName[d].IsDir() {
			t.Errorf("directory %s missing", d)
		}
	}
	for name, dev := range map[string][2]uint64{"/dev/console": {5, 1}, "/dev/null": {1, 3}} {
		e := byName[name]
		if !e.isCharDev() || e.Major != dev[0] || e.Minor != dev[1] {
			t.Errorf("%s = mode %o %d:%d, want char device %d:%d", name, e.Mode, e.Major, e.Minor, dev[0], dev[1])
		}
	}
}

// checkModulesLoaded checks modules.load and the manifest list the modules TestWrite asks
// for, dependencies first, and that the archive holds the tree's module files and
// modules.dep.
func checkModulesLoaded(t *testing.T, root string, man *Manifest, contents map[string][]byte) {
	t.Helper()
	const kver = modulesKver
	wantLoad := []string{
		"/lib/modules/" + kver + "/kernel/drivers/virtio/virtio_ring.ko",
		"/lib/modules/" + kver + "/kernel/drivers/virtio/virtio.ko",
		"/lib/modules/" + kver + "/kernel/drivers/block/virtio_blk.ko",
		"/lib/modules/" + kver + "/kernel/fs/squashfs/squashfs.ko",
		"/lib/modules/" + kver + "/kernel/arch/x86/crypto/crc32c-intel.ko",
		"/lib/modules/" + kver + "/kernel/lib/libcrc32c.ko",
		"/lib/modules/" + kver + "/kernel/fs/erofs/erofs.ko.xz",
	}
	if got := string(contents[nodeimage.ModulesLoadPath]); got != strings.Join(wantLoad, "\n")+"\n" {
		t.Errorf("modules.load =\n%s\nwant\n%s", got, strings.Join(wantLoad, "\n"))
	}
	if !reflect.DeepEqual(man.Modules, wantLoad) {
		t.Errorf("manifest modules %q, want %q", man.Modules, wantLoad)
	}
	for _, m := range wantLoad {
		rel := strings.TrimPrefix(m, "/lib/modules/"+kver+"/")
		want, err := os.ReadFile(filepath.Join(root, "usr/lib/modules", kver, rel))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(contents[m], want) {
			t.Errorf("%s holds %d bytes, want the %d bytes of the module file", m, len(contents[m]), len(want))
		}
	}
	if _, ok := contents["/lib/modules/"+kver+"/modules.dep"]; !ok {
		t.Error("modules.dep missing")
	}
}

// TestWriteCpioTool checks the archive with GNU cpio, the reader a person
// would reach for.
func TestWriteCpioTool(t *testing.T) {
	if _, err := exec.LookPath("cpio"); err != nil {
		t.Skip("cpio not installed")
	}
	const kver = "6.1.0-test-amd64"
	root := t.TempDir()
	fakeModulesDir(t, root, kver)
	out := filepath.Join(t.TempDir(), "initrd.cpio")
	f, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Write(f, Spec{Root: root, KernelVersion: kver, Init: staticInit(t), Modules: []string{"sd_mod"}, Compression: None}); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("cpio", "-itv", "--quiet", "-F", out)
	b, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("cpio -t: %v\n%s", err, b)
	}
	listing := string(b)
	for _, want := range []string{
		"-rwxr-xr-x   1 root     root", " init\n",
		"crw-------   1 root     root       5,   1 Jan  1  1970 dev/console",
		"crw-rw-rw-   1 root     root       1,   3 Jan  1  1970 dev/null",
		"drwxrwxrwt   2 root     root            0 Jan  1  1970 tmp",
		"lib/modules/" + kver + "/kernel/drivers/scsi/sd_mod.ko",
		"etc/kiln/modules.load",
	} {
		if !strings.Contains(listing, want) {
			t.Errorf("cpio -tv listing lacks %q:\n%s", want, listing)
		}
	}
}

func TestWriteErrors(t *testing.T) {
	const kver = "6.1.0-test-amd64"
	root := t.TempDir()
	fakeModulesDir(t, root, kver)
	good := staticInit(t)
	script := filepath.Join(t.TempDir(), "init.sh")
	write(t, script, "#!/bin/sh\n")
	dynamic, _ := exec.LookPath("ls") // a dynamically linked program on Debian
	tests := []struct {
		name    string
		spec    Spec
		wantErr []string
	}{
		{"unknown module", Spec{Root: root, KernelVersion: kver, Init: good, Modules: []string{"zfs"}}, []string{"zfs", kver}},
		{"wrong kernel", Spec{Root: root, KernelVersion: "5.10.0-9", Init: good}, []string{"5.10.0-9", "kernels present: " + kver}},
		{"no init", Spec{Root: root, KernelVersion: kver}, []string{"no init"}},
		{"missing init", Spec{Root: root, KernelVersion: kver, Init: "/nonexistent/kiln-init"}, []string{"/nonexistent/kiln-init"}},
		{"script init", Spec{Root: root, KernelVersion: kver, Init: script}, []string{script, "not an ELF"}},
		{"dynamic init", Spec{Root: root, KernelVersion: kver, Init: dynamic}, []string{dynamic, "dynamically linked"}},
		{"bad compression", Spec{Root: root, KernelVersion: kver, Init: good, Compression: "lzma"}, []string{`"lzma"`, "zstd"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.spec.Init == "" && tc.name == "dynamic init" {
				t.Skip("no ls on PATH")
			}
			_, err := Write(&bytes.Buffer{}, tc.spec)
			if err == nil {
				t.Fatal("Write succeeded, want an error")
			}
			for _, s := range tc.wantErr {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not mention %q", err, s)
				}
			}
		})
	}
}
