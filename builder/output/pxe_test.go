package output

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kilnproject/kiln/internal/nodeimage"
)

var update = flag.Bool("update", false, "rewrite golden files under testdata/")

// pxeSource writes a kernel, an initramfs and a root image of distinct content into dir.
func pxeSource(t *testing.T, dir string) PXESource {
	t.Helper()
	file := func(name string, n int) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, bytes.Repeat([]byte(name), n), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	return PXESource{Kernel: file("kernel", 1000), Initrd: file("initrd", 3000), RootFS: file("root.squashfs", 50000),
		KernelArgs: "ro kiln.platform=metal console=tty0 console=ttyS0,115200n8", Title: "metal worker (6.1.0-test)"}
}

func sha(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// The pxe directory holds the very bytes of its sources under the names a network boot
// fetches, each recorded with its digest and size, and a boot.ipxe that boots them live.
func TestWritePXE(t *testing.T) {
	src := pxeSource(t, t.TempDir())
	dir := filepath.Join(t.TempDir(), "metal-worker-pxe")
	info, err := WritePXE(dir, src)
	if err != nil {
		t.Fatal(err)
	}
	if info.Dir != "metal-worker-pxe" || info.KernelArgs != src.KernelArgs {
		t.Errorf("dir %q, kernel args %q", info.Dir, info.KernelArgs)
	}
	for _, tc := range []struct {
		got      nodeimage.PXEFile
		name, of string
	}{
		{info.Kernel, "vmlinuz", src.Kernel},
		{info.Initrd, "initrd.img", src.Initrd},
		{info.RootFS, "rootfs.img", src.RootFS},
	} {
		p := filepath.Join(dir, tc.name)
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if tc.got.File != tc.name || tc.got.SHA256 != sha(t, tc.of) || tc.got.SHA256 != sha(t, p) || tc.got.Size != fi.Size() {
			t.Errorf("%s recorded as %+v; file has sha256 %s, %d bytes; source %s", tc.name, tc.got, sha(t, p), fi.Size(), sha(t, tc.of))
		}
	}
	script, err := os.ReadFile(filepath.Join(dir, "boot.ipxe"))
	if err != nil {
		t.Fatal(err)
	}
	if info.Script.File != "boot.ipxe" || info.Script.SHA256 != sha(t, filepath.Join(dir, "boot.ipxe")) {
		t.Errorf("script recorded as %+v", info.Script)
	}
	if !strings.Contains(string(script), "kiln.live.rootfs_sha256="+info.RootFS.SHA256+"\n") {
		t.Errorf("boot.ipxe does not pin rootfs.img's sha256 %s:\n%s", info.RootFS.SHA256, script)
	}
	if checks, err := CheckPXE(dir, info); err != nil || len(checks) != 4 {
		t.Errorf("CheckPXE of the directory just written: %d checks, %v", len(checks), err)
	}
	if _, err := os.Stat(dir + ".partial"); !os.IsNotExist(err) {
		t.Errorf("partial directory left: %v", err)
	}
}

// boot.ipxe as a user reads and iPXE runs it.
func TestPXEScriptGolden(t *testing.T) {
	got := PXEScript("metal-worker-pxe", "metal worker (6.1.0-28-cloud-amd64)",
		"ro kiln.platform=metal console=tty0 console=ttyS0,115200n8", strings.Repeat("ab", 32))
	golden := filepath.Join("testdata", "boot.ipxe.golden")
	if *update {
		if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("boot.ipxe differs from %s:\n%s", golden, got)
	}
}

// A pxe directory that cannot be written completely is not there at all, and what would make
// the script mean something else is refused.
func TestWritePXEFailsLeavingNothing(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(s *PXESource, dir string)
		want   string
	}{
		{"missing root image", func(s *PXESource, _ string) { s.RootFS += ".gone" }, "root.squashfs.gone"},
		{"empty initramfs", func(s *PXESource, _ string) { os.Truncate(s.Initrd, 0) }, "initrd is empty"},
		{"kernel is a directory", func(s *PXESource, _ string) { s.Kernel = filepath.Dir(s.Kernel) }, "not a regular file"},
		{"iPXE variable in an argument", func(s *PXESource, _ string) { s.KernelArgs += " x=${net0/mac}" }, `"x=${net0/mac}"`},
		{"line break in the title", func(s *PXESource, _ string) { s.Title += "\nboot" }, "one line"},
		{"directory exists", func(_ *PXESource, dir string) { os.Mkdir(dir, 0o755) }, "exists already"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := pxeSource(t, t.TempDir())
			out := t.TempDir()
			dir := filepath.Join(out, "metal-worker-pxe")
			tc.mutate(&src, dir)
			before, _ := os.ReadDir(out)
			_, err := WritePXE(dir, src)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one mentioning %q", err, tc.want)
			}
			after, _ := os.ReadDir(out)
			if len(after) != len(before) {
				t.Errorf("failed WritePXE left %d entries in %s, had %d", len(after), out, len(before))
			}
		})
	}
}

// CheckPXE names each file that is not what the metadata records, and nothing else.
func TestCheckPXE(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(dir string, info *nodeimage.PXEInfo)
		want   []string // parts of the error; none: the directory matches
	}{
		{"as written", func(string, *nodeimage.PXEInfo) {}, nil},
		{"a byte changed in the root image", func(dir string, _ *nodeimage.PXEInfo) {
			f, _ := os.OpenFile(filepath.Join(dir, "rootfs.img"), os.O_WRONLY, 0)
			f.WriteAt([]byte("X"), 100)
			f.Close()
		}, []string{"rootfs.img has sha256", "the metadata says"}},
		{"initramfs cut short", func(dir string, _ *nodeimage.PXEInfo) {
			os.Truncate(filepath.Join(dir, "initrd.img"), 10)
		}, []string{"initrd.img is 10 bytes, the metadata says 18000"}},
		{"kernel missing", func(dir string, _ *nodeimage.PXEInfo) { os.Remove(filepath.Join(dir, "vmlinuz")) }, []string{"vmlinuz:", "no such file"}},
		{"script edited", func(dir string, _ *nodeimage.PXEInfo) {
			os.WriteFile(filepath.Join(dir, "boot.ipxe"), []byte("#!ipxe\nshell\n"), 0o644)
		}, []string{"boot.ipxe is 13 bytes"}},
		{"recorded name leaves the directory", func(_ string, info *nodeimage.PXEInfo) { info.RootFS.File = "../rootfs.img" }, []string{`"../rootfs.img" is not a name inside`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "metal-worker-pxe")
			info, err := WritePXE(dir, pxeSource(t, t.TempDir()))
			if err != nil {
				t.Fatal(err)
			}
			tc.mutate(dir, info)
			checks, err := CheckPXE(dir, info)
			bad := 0
			for _, c := range checks {
				if c.Problem != "" {
					bad++
				}
			}
			if len(tc.want) == 0 {
				if err != nil || bad != 0 {
					t.Fatalf("CheckPXE: %v, %d problems", err, bad)
				}
				return
			}
			if err == nil || bad != 1 {
				t.Fatalf("CheckPXE: %v, %d problems; want exactly one", err, bad)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}
