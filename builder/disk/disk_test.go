package disk

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"flag"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kilnproject/kiln/internal/nodeimage"
	"github.com/kilnproject/kiln/internal/testkit"
)

var update = flag.Bool("update", false, "rewrite golden files under testdata/")

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// extractRange copies size bytes at offset of img (to the end when size
// is negative) into a new file and returns its path.
func extractRange(t *testing.T, img string, offset, size int64) string {
	t.Helper()
	in, err := os.Open(img)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	if size < 0 {
		st, err := in.Stat()
		if err != nil {
			t.Fatal(err)
		}
		size = st.Size() - offset
	}
	out := filepath.Join(t.TempDir(), "range.img")
	f, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := io.Copy(f, io.NewSectionReader(in, offset, size)); err != nil {
		t.Fatal(err)
	}
	return out
}

func randomFile(t *testing.T, dir, name string, size int) string {
	t.Helper()
	b := make([]byte, size)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// fixture makes a root filesystem image of the small tree and fake boot
// files, and returns a Spec for them.
func fixture(t *testing.T, fsType string) Spec {
	t.Helper()
	dir := t.TempDir()
	img := filepath.Join(dir, "root.img")
	if err := MakeRootFS(context.Background(), smallTree(t), img, RootFSOptions{Type: fsType}); err != nil {
		t.Fatal(err)
	}
	return Spec{
		Size:       1 << 30,
		RootFS:     img,
		RootFSType: fsType,
		Kernel:     randomFile(t, dir, "vmlinuz", 6<<20+123),
		Initrd:     randomFile(t, dir, "initrd.img", 2<<20+7),
		Bootloader: randomFile(t, dir, "systemd-bootx64.efi", 120<<10),
		Platform:   "qemu",
		Cmdline:    "console=ttyS0,115200  quiet",
		ImageJSON:  []byte(`{"name":"test","role":"worker","platform":"qemu"}`),
		Title:      "kiln test image",
		Seed:       "test-seed",
	}
}

func TestBuild(t *testing.T) {
	for _, fsType := range []string{SquashFS, EROFS} {
		t.Run(fsType, func(t *testing.T) {
			spec := fixture(t, fsType)
			path := filepath.Join(t.TempDir(), "disk.raw")
			start := time.Now()
			res, err := Build(path, spec)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("Build took %s", time.Since(start).Round(time.Millisecond))
			checkDiskFile(t, path, spec)

			got, esp, err := Read(path)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, res) {
				t.Errorf("Read = %+v\nBuild returned %+v", got, res)
			}
			checkLayout(t, res, spec)
			checkESPInfo(t, fsType, res, esp, spec)
			checkWithTools(t, fsType, path, res, spec)
		})
	}
}

// checkDiskFile checks the built disk at path is spec.Size, sparse and left no partial file.
func checkDiskFile(t *testing.T, path string, spec Spec) {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Size() != spec.Size {
		t.Errorf("disk is %d bytes, want %d", st.Size(), spec.Size)
	}
	allocated := st.Sys().(*syscall.Stat_t).Blocks * 512
	if allocated > 32<<20 {
		t.Errorf("disk allocates %d bytes of %d: not sparse", allocated, spec.Size)
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(path), ".disk.raw.partial")); err == nil {
		t.Error("partial file left behind")
	}
}

// checkESPInfo checks the command line, boot entry, loader.conf, label, image.json and file list
// Read found on the ESP.
func checkESPInfo(t *testing.T, fsType string, res *Result, esp *ESPInfo, spec Spec) {
	t.Helper()
	wantCmdline := "root=PARTUUID=" + res.Partitions[1].GUID + " rootfstype=" + fsType +
		" ro kiln.platform=qemu console=ttyS0,115200 quiet"
	if res.Cmdline != wantCmdline {
		t.Errorf("cmdline %q, want %q", res.Cmdline, wantCmdline)
	}
	golden(t, "kiln-a-"+fsType+".conf", esp.Entry)
	if esp.LoaderConf != "default kiln-a.conf\ntimeout 0\n" || esp.EntryName != "kiln-a.conf" {
		t.Errorf("loader.conf %q (default %q)", esp.LoaderConf, esp.EntryName)
	}
	if esp.Label != "ESP" {
		t.Errorf("ESP label %q", esp.Label)
	}
	if !bytes.Equal(esp.ImageJSON, spec.ImageJSON) {
		t.Errorf("image.json %q, want %q", esp.ImageJSON, spec.ImageJSON)
	}
	wantFiles := []ESPFile{
		{"/EFI/BOOT/BOOTX64.EFI", size(t, spec.Bootloader)},
		{"/kiln/a/initrd.img", size(t, spec.Initrd)},
		{"/kiln/a/vmlinuz", size(t, spec.Kernel)},
		{"/kiln/image.json", int64(len(spec.ImageJSON))},
		{"/loader/entries/kiln-a.conf", int64(len(esp.Entry))},
		{"/loader/loader.conf", int64(len(esp.LoaderConf))},
	}
	if !reflect.DeepEqual(esp.Files, wantFiles) {
		t.Errorf("ESP files %v\nwant %v", esp.Files, wantFiles)
	}
}

// checkWithTools checks that outside tools (sgdisk, fsck.fat, mtools, the root filesystem's own
// tools) agree with what Build wrote.
func checkWithTools(t *testing.T, fsType, path string, res *Result, spec Spec) {
	t.Helper()
	if out := run(t, "sgdisk", "-v", path); !strings.Contains(out, "No problems found") {
		t.Errorf("sgdisk -v:\n%s", out)
	}
	info := run(t, "sgdisk", "-p", path)
	for _, want := range []string{"ESP", "root-a", "root-b", "EF00", "8304"} {
		if !strings.Contains(info, want) {
			t.Errorf("sgdisk -p lacks %q:\n%s", want, info)
		}
	}
	espImg := extractRange(t, path, res.Partitions[0].Start, res.Partitions[0].Size)
	checkFAT(t, espImg)
	if label := run(t, "fatlabel", espImg); strings.TrimSpace(label) != "ESP" {
		t.Errorf("fatlabel says %q", label)
	}
	for src, dst := range map[string]string{spec.Kernel: "::/kiln/a/vmlinuz", spec.Initrd: "::/kiln/a/initrd.img", spec.Bootloader: "::/EFI/BOOT/BOOTX64.EFI"} {
		want, _ := os.ReadFile(src)
		if got := run(t, "mtype", "-i", espImg, dst); sha256.Sum256([]byte(got)) != sha256.Sum256(want) {
			t.Errorf("%s on the ESP differs from %s", dst, src)
		}
	}
	rootA := res.Partitions[1]
	if got := readBack(t, fsType, path, rootA.Start, rootA.Size, "usr/lib/kiln/data.txt"); got != strings.Repeat("kiln root filesystem test data\n", 2000) {
		t.Errorf("root-a data.txt read back as %d bytes", len(got))
	}
	if fsType == SquashFS {
		listing := run(t, "unsquashfs", "-o", itoa(rootA.Start), "-l", path)
		for _, want := range []string{"squashfs-root/etc/os-release", "squashfs-root/usr/bin/hello", "squashfs-root/bin"} {
			if !strings.Contains(listing, want) {
				t.Errorf("unsquashfs -l lacks %s:\n%s", want, listing)
			}
		}
	}
}

// knownFATQuirks are what fsck.fat reports on every FAT32 go-diskfs v1.9.4
// writes: a top-level directory's ".." points at the root cluster instead of
// 0, and the FSInfo free-cluster count is left "unknown". Linux and UEFI
// firmware read such a filesystem; fsck.fat would rewrite both.
var knownFATQuirks = []string{
	"Invalid '..' entry in the second slot. Fixing.",
	"Free cluster summary uninitialized",
}

// checkFAT runs fsck.fat -n on a FAT image and fails on any finding other
// than knownFATQuirks.
func checkFAT(t *testing.T, img string) {
	t.Helper()
	testkit.Tool(t, "fsck.fat", "dosfstools")
	out, err := exec.Command("fsck.fat", "-n", img).CombinedOutput()
	if err == nil {
		return
	}
	var unexpected []string
	for _, line := range strings.Split(string(out), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "fsck.fat ") || strings.HasPrefix(line, "/") ||
			line == "Leaving filesystem unchanged." || strings.HasPrefix(line, img+":") {
			continue
		}
		known := false
		for _, q := range knownFATQuirks {
			known = known || strings.HasPrefix(line, q)
		}
		if !known {
			unexpected = append(unexpected, line)
		}
	}
	if len(unexpected) > 0 {
		t.Errorf("fsck.fat -n %s: %v\n%s", img, err, out)
	}
}

func size(t *testing.T, name string) int64 {
	t.Helper()
	st, err := os.Stat(name)
	if err != nil {
		t.Fatal(err)
	}
	return st.Size()
}

func checkLayout(t *testing.T, res *Result, spec Spec) {
	t.Helper()
	want := []struct{ name, typ string }{{"ESP", nodeimage.TypeESP}, {"root-a", nodeimage.TypeRootX86}, {"root-b", nodeimage.TypeRootX86}}
	if len(res.Partitions) != len(want) {
		t.Fatalf("%d partitions, want %d: %+v", len(res.Partitions), len(want), res.Partitions)
	}
	guids := map[string]bool{res.DiskGUID: true}
	for i, p := range res.Partitions {
		if p.Number != i+1 || p.Name != want[i].name || p.Type != want[i].typ {
			t.Errorf("partition %d = %d %q %s, want %d %q %s", i, p.Number, p.Name, p.Type, i+1, want[i].name, want[i].typ)
		}
		if p.Start%MiB != 0 || p.Size%MiB != 0 {
			t.Errorf("%s at %d size %d is not 1 MiB aligned", p.Name, p.Start, p.Size)
		}
		if p.GUID != strings.ToLower(p.GUID) || len(p.GUID) != 36 || guids[p.GUID] {
			t.Errorf("%s GUID %q is not a fresh lowercase GUID", p.Name, p.GUID)
		}
		guids[p.GUID] = true
		if i > 0 && p.Start != res.Partitions[i-1].Start+res.Partitions[i-1].Size {
			t.Errorf("%s does not follow %s", p.Name, res.Partitions[i-1].Name)
		}
	}
	esp, a, b := res.Partitions[0], res.Partitions[1], res.Partitions[2]
	if esp.Start != MiB || esp.Size != 256*MiB {
		t.Errorf("ESP at %d size %d, want 1 MiB, 256 MiB", esp.Start, esp.Size)
	}
	rootfs := size(t, spec.RootFS)
	if a.Size != b.Size || a.Size < rootfs+MinHeadroom || a.Size > rootfs+MinHeadroom+MiB+rootfs/5 {
		t.Errorf("root-a %d, root-b %d bytes for a %d byte root filesystem", a.Size, b.Size, rootfs)
	}
	if free := spec.Size - 34*SectorSize - (b.Start + b.Size); free < MinDataSize {
		t.Errorf("only %d bytes left for data", free)
	}
}

func golden(t *testing.T, name, got string) {
	t.Helper()
	p := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.WriteFile(p, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(p)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("%s differs from %s:\n got %q\nwant %q", name, p, got, want)
	}
}

func TestBuildReproducible(t *testing.T) {
	spec := fixture(t, SquashFS)
	spec.Size = 600 * MiB
	dir := t.TempDir()
	build := func(s Spec, name string) (string, *Result) {
		p := filepath.Join(dir, name)
		res, err := Build(p, s)
		if err != nil {
			t.Fatal(err)
		}
		return p, res
	}
	a, resA := build(spec, "a.raw")
	b, resB := build(spec, "b.raw")
	if !sameContent(t, a, b) {
		t.Error("two builds with the same seed differ")
	}
	if !reflect.DeepEqual(resA, resB) {
		t.Errorf("results differ: %+v %+v", resA, resB)
	}
	other := spec
	other.Seed = "another seed"
	_, resC := build(other, "c.raw")
	random := spec
	random.Seed = ""
	_, resD := build(random, "d.raw")
	_, resE := build(random, "e.raw")
	if resC.DiskGUID == resA.DiskGUID || resC.Partitions[1].GUID == resA.Partitions[1].GUID {
		t.Error("another seed gave the same GUIDs")
	}
	if resD.DiskGUID == resE.DiskGUID || resD.Partitions[1].GUID == resE.Partitions[1].GUID {
		t.Error("two unseeded builds share GUIDs")
	}
}

func sameContent(t *testing.T, a, b string) bool {
	t.Helper()
	fa, err := os.Open(a)
	if err != nil {
		t.Fatal(err)
	}
	defer fa.Close()
	fb, err := os.Open(b)
	if err != nil {
		t.Fatal(err)
	}
	defer fb.Close()
	ba, bb := make([]byte, 4<<20), make([]byte, 4<<20)
	for {
		na, ea := io.ReadFull(fa, ba)
		nb, eb := io.ReadFull(fb, bb)
		if na != nb || !bytes.Equal(ba[:na], bb[:nb]) {
			return false
		}
		if ea != nil || eb != nil {
			return ea == eb || (ea == io.ErrUnexpectedEOF && eb == io.ErrUnexpectedEOF)
		}
	}
}

func TestBuildErrors(t *testing.T) {
	base := fixture(t, SquashFS)
	bigRootFS := randomFile(t, t.TempDir(), "big.img", 3<<20)
	tests := []struct {
		name    string
		edit    func(*Spec)
		wantErr []string
	}{
		{"too small", func(s *Spec) { s.Size = 300 * MiB }, []string{"300 MiB", "too small", "256 MiB", "at least"}},
		{"root partition smaller than rootfs", func(s *Spec) { s.RootFS, s.RootPartitionSize = bigRootFS, MiB }, []string{"smaller than root filesystem", bigRootFS}},
		{"unaligned root partition", func(s *Spec) { s.RootPartitionSize = 100*MiB + 1 }, []string{"1 MiB"}},
		{"unknown platform", func(s *Spec) { s.Platform = "azure" }, []string{`"azure"`, "qemu, aws, gce, metal"}},
		{"unknown fs type", func(s *Spec) { s.RootFSType = "ext4" }, []string{`"ext4"`}},
		{"missing kernel", func(s *Spec) { s.Kernel = "/nonexistent/vmlinuz" }, []string{"kernel", "/nonexistent/vmlinuz"}},
		{"no initrd", func(s *Spec) { s.Initrd = "" }, []string{"no initrd"}},
		{"missing rootfs", func(s *Spec) { s.RootFS = "/nonexistent/root.img" }, []string{"/nonexistent/root.img"}},
		{"bad json", func(s *Spec) { s.ImageJSON = []byte("{name") }, []string{"image.json", "not valid JSON"}},
		{"multi-line cmdline", func(s *Spec) { s.Cmdline = "quiet\nsingle" }, []string{"one line"}},
		{"odd size", func(s *Spec) { s.Size = 1<<30 + 1 }, []string{"multiple of 512"}},
		{"size not a multiple of SizeMultiple", func(s *Spec) { s.Size, s.SizeMultiple = 1536*MiB, 1<<30 }, []string{"1536 MiB", "not a multiple of 1024 MiB"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			spec := base
			tc.edit(&spec)
			dir := t.TempDir()
			path := filepath.Join(dir, "disk.raw")
			if _, err := Build(path, spec); err == nil {
				t.Fatal("Build succeeded, want an error")
			} else {
				for _, s := range tc.wantErr {
					if !strings.Contains(err.Error(), s) {
						t.Errorf("error %q does not mention %q", err, s)
					}
				}
			}
			if left, _ := os.ReadDir(dir); len(left) != 0 {
				t.Errorf("files left behind: %v", left)
			}
		})
	}
}

func TestBuildKeepsOldImageOnError(t *testing.T) {
	spec := fixture(t, SquashFS)
	path := filepath.Join(t.TempDir(), "disk.raw")
	if err := os.WriteFile(path, []byte("previous image"), 0o644); err != nil {
		t.Fatal(err)
	}
	spec.Size = 10 * MiB
	if _, err := Build(path, spec); err == nil {
		t.Fatal("Build succeeded, want an error")
	}
	if b, _ := os.ReadFile(path); string(b) != "previous image" {
		t.Errorf("existing image changed to %d bytes", len(b))
	}
}

// GCE takes only disks of whole GiB: a fitted size is rounded up to SizeMultiple (the data
// partition, made at first boot, takes what the rounding adds), with a valid GPT at its end.
func TestBuildFittedSizeMultiple(t *testing.T) {
	spec := fixture(t, SquashFS)
	spec.Size, spec.SizeMultiple = 0, 1<<30
	path := filepath.Join(t.TempDir(), "disk.raw")
	if _, err := Build(path, spec); err != nil {
		t.Fatal(err)
	}
	if got := size(t, path); got != 1<<30 {
		t.Errorf("fitted disk is %d bytes, want 1 GiB", got)
	}
	if out := run(t, "sgdisk", "-v", path); !strings.Contains(out, "No problems found") {
		t.Errorf("sgdisk -v: %s", out)
	}
}

// A definition without disk.size gets the smallest disk that fits (clouds grow it), and
// esp_size moves the root slots.
func TestBuildFittedSizeAndESPSize(t *testing.T) {
	spec := fixture(t, SquashFS)
	spec.Size, spec.ESPSize = 0, 64*MiB
	path := filepath.Join(t.TempDir(), "disk.raw")
	res, err := Build(path, spec)
	if err != nil {
		t.Fatal(err)
	}
	esp, _ := res.Partition(nodeimage.ESPName)
	rootB, _ := res.Partition(nodeimage.RootBName)
	if esp.Size != 64*MiB {
		t.Errorf("ESP is %d MiB, want 64", esp.Size/MiB)
	}
	end := rootB.Start + rootB.Size
	if got := size(t, path); got < end+MinDataSize || got > end+MinDataSize+2*MiB {
		t.Errorf("fitted disk is %d MiB; root-b ends at %d MiB and data needs %d MiB", got/MiB, end/MiB, MinDataSize/MiB)
	}
	if out := run(t, "sgdisk", "-v", path); !strings.Contains(out, "No problems found") {
		t.Errorf("sgdisk -v: %s", out)
	}
}
