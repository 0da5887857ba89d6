package output

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	diskfs "github.com/diskfs/go-diskfs"
	"github.com/diskfs/go-diskfs/backend/file"
	"github.com/diskfs/go-diskfs/filesystem/iso9660"
	"github.com/diskfs/go-diskfs/partition/gpt"
	"github.com/klauspost/compress/zstd"

	"github.com/kilnproject/kiln/builder/disk"
	"github.com/kilnproject/kiln/internal/nodeimage"
	"github.com/kilnproject/kiln/internal/testkit"
)

// isoSource writes a root image and a boot image (disk.WriteBootImage of fake boot files, the
// loader entry booting cmdline) into dir.
func isoSource(t *testing.T, dir string) (ISOSource, string) {
	t.Helper()
	testkit.Tool(t, "xorriso", "xorriso")
	src := pxeSource(t, dir)
	boot := filepath.Join(dir, "systemd-bootx64.efi")
	if err := os.WriteFile(boot, bytes.Repeat([]byte("boot"), 2000), 0o644); err != nil {
		t.Fatal(err)
	}
	cmdline := ISOCmdline(src.KernelArgs, sha(t, src.RootFS))
	efi := filepath.Join(dir, "efi.img")
	if err := disk.WriteBootImage(efi, disk.BootImage{Kernel: src.Kernel, Initrd: src.Initrd, Bootloader: boot, Cmdline: cmdline, Title: src.Title}); err != nil {
		t.Fatal(err)
	}
	return ISOSource{RootFS: src.RootFS, BootImage: efi}, cmdline
}

// The ISO holds the very bytes of the root image and the boot image, the El Torito catalog
// names the boot image for UEFI, its loader entry boots the root image from the medium with its
// sha256, and the GPT in the system area makes the boot image the EFI system partition.
func TestWriteISO(t *testing.T) {
	src, cmdline := isoSource(t, t.TempDir())
	dst := filepath.Join(t.TempDir(), "metal-worker.iso")
	if err := WriteISO(context.Background(), dst, src); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	fsys, err := iso9660.Read(file.New(f, true), fi.Size(), 0, 2048)
	if err != nil {
		t.Fatalf("read %s as ISO 9660: %v", dst, err)
	}
	if got := strings.TrimSpace(fsys.Label()); got != nodeimage.ISOLabel {
		t.Errorf("volume label %q, want %q", got, nodeimage.ISOLabel)
	}
	dir := t.TempDir()
	for path, want := range map[string]string{nodeimage.ISORootFSPath: src.RootFS, nodeimage.ISOBootImagePath: src.BootImage} {
		in, err := fsys.OpenFile(path, os.O_RDONLY)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		out := filepath.Join(dir, filepath.Base(path))
		b, err := io.ReadAll(in)
		if err != nil {
			t.Fatalf("read %s: %v", path, err)
		}
		if err := os.WriteFile(out, b, 0o644); err != nil {
			t.Fatal(err)
		}
		if got, w := sha(t, out), sha(t, want); got != w {
			t.Errorf("%s has sha256 %s, its source %s", path, got, w)
		}
	}
	esp, err := disk.ReadBootImage(filepath.Join(dir, filepath.Base(nodeimage.ISOBootImagePath)))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(esp.Entry, "options "+cmdline+"\n") || !strings.Contains(cmdline, "kiln.live.rootfs_url=medium:/kiln/root.img kiln.live.rootfs_sha256="+sha(t, src.RootFS)) {
		t.Errorf("loader entry\n%s\ndoes not boot the medium's root image with cmdline %q", esp.Entry, cmdline)
	}
	bootLBA := checkElTorito(t, f)
	checkHybridGPT(t, dst, bootLBA, fileSize(t, src.BootImage))
}

func fileSize(t *testing.T, p string) int64 {
	t.Helper()
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

// checkElTorito reads the boot record volume descriptor (sector 17) and its catalog: one
// bootable no-emulation entry for platform 0xEF (UEFI). It returns the entry's 2048-byte LBA.
func checkElTorito(t *testing.T, f *os.File) int64 {
	t.Helper()
	brvd := make([]byte, 2048)
	if _, err := f.ReadAt(brvd, 17*2048); err != nil {
		t.Fatal(err)
	}
	if brvd[0] != 0 || string(brvd[1:6]) != "CD001" || !strings.HasPrefix(string(brvd[7:39]), "EL TORITO SPECIFICATION") {
		t.Fatalf("sector 17 is no El Torito boot record: % x", brvd[:40])
	}
	cat := make([]byte, 2048)
	if _, err := f.ReadAt(cat, int64(binary.LittleEndian.Uint32(brvd[71:]))*2048); err != nil {
		t.Fatal(err)
	}
	// Validation entry (header 1, key 55 AA), then the initial entry; a UEFI image is either
	// the validation entry's platform or a section header's (0x90/0x91) before its entry.
	if cat[0] != 1 || cat[30] != 0x55 || cat[31] != 0xaa {
		t.Fatalf("boot catalog has no validation entry: % x", cat[:32])
	}
	platform, entry := cat[1], cat[32:64]
	if platform != 0xef && (cat[64] == 0x90 || cat[64] == 0x91) {
		platform, entry = cat[65], cat[96:128]
	}
	if platform != 0xef {
		t.Fatalf("boot catalog: platform %#x, want 0xef (UEFI)", platform)
	}
	if entry[0] != 0x88 || entry[1] != 0 {
		t.Fatalf("boot entry: indicator %#x, media %#x; want 0x88 (bootable), 0 (no emulation)", entry[0], entry[1])
	}
	return int64(binary.LittleEndian.Uint32(entry[8:]))
}

// checkHybridGPT reads the GPT in the ISO's system area: an EFI system partition that is the
// boot image, so the image boots from a USB stick too.
func checkHybridGPT(t *testing.T, iso string, bootLBA, bootSize int64) {
	t.Helper()
	d, err := diskfs.Open(iso, diskfs.WithOpenMode(diskfs.ReadOnly), diskfs.WithSectorSize(512))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	pt, err := d.GetPartitionTable()
	if err != nil {
		t.Fatalf("%s has no partition table in its system area: %v", iso, err)
	}
	table, ok := pt.(*gpt.Table)
	if !ok {
		t.Fatalf("partition table is %s, not GPT", pt.Type())
	}
	for _, p := range table.Partitions {
		if p.Type == gpt.EFISystemPartition {
			if int64(p.Start)*512 != bootLBA*2048 || int64(p.End-p.Start+1)*512 < bootSize {
				t.Errorf("EFI system partition at byte %d, %d bytes; the boot image is at %d, %d bytes",
					p.Start*512, (p.End-p.Start+1)*512, bootLBA*2048, bootSize)
			}
			return
		}
	}
	t.Errorf("GPT of %s has no EFI system partition", iso)
}

// WriteISO refuses bad sources with the reason and writes nothing: neither the ISO nor its
// partial files remain.
func TestWriteISORefuses(t *testing.T) {
	good, _ := isoSource(t, t.TempDir())
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty")
	notFAT := filepath.Join(dir, "not-fat.img")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(notFAT, bytes.Repeat([]byte("x"), 4096), 0o644); err != nil {
		t.Fatal(err)
	}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tt := range []struct {
		name    string
		ctx     context.Context
		src     ISOSource
		exists  bool
		wantErr string
	}{
		{name: "no root image", src: ISOSource{BootImage: good.BootImage}, wantErr: "no root filesystem image file given"},
		{name: "missing root image", src: ISOSource{RootFS: filepath.Join(dir, "nope"), BootImage: good.BootImage}, wantErr: "root filesystem image: stat " + filepath.Join(dir, "nope")},
		{name: "empty root image", src: ISOSource{RootFS: empty, BootImage: good.BootImage}, wantErr: "root filesystem image " + empty + " is empty"},
		{name: "root image is a directory", src: ISOSource{RootFS: dir, BootImage: good.BootImage}, wantErr: "is not a regular file"},
		{name: "boot image not FAT", src: ISOSource{RootFS: good.RootFS, BootImage: notFAT}, wantErr: "boot image " + notFAT + " is not a FAT volume"},
		{name: "both missing", src: ISOSource{}, wantErr: "no root filesystem image file given; no boot image file given"},
		{name: "empty disk image", src: ISOSource{RootFS: good.RootFS, BootImage: good.BootImage, Disk: empty}, wantErr: "compressed disk image " + empty + " is empty"},
		{name: "destination exists", src: good, exists: true, wantErr: "exists already"},
		{name: "xorriso cancelled", ctx: cancelled, src: good, wantErr: "xorriso"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			out := t.TempDir()
			dst := filepath.Join(out, "metal-worker.iso")
			if tt.exists {
				if err := os.WriteFile(dst, []byte("old"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			ctx := tt.ctx
			if ctx == nil {
				ctx = context.Background()
			}
			err := WriteISO(ctx, dst, tt.src)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("WriteISO = %v, want an error containing %q", err, tt.wantErr)
			}
			entries, _ := os.ReadDir(out)
			var names []string
			for _, e := range entries {
				names = append(names, e.Name())
			}
			want := ""
			if tt.exists {
				want = "metal-worker.iso"
			}
			if strings.Join(names, " ") != want {
				t.Errorf("after the error the directory holds %q, want %q", names, want)
			}
			if tt.exists {
				if b, _ := os.ReadFile(dst); string(b) != "old" {
					t.Errorf("the existing %s was changed", dst)
				}
			}
		})
	}
}

// An installer ISO: CompressDisk's file decompresses to the raw disk byte for byte and declares
// its size, the ISO holds it at ISODiskPath, and the boot image's default entry installs it
// from the medium with its sha256 while the live entry stays the other one.
func TestWriteInstallerISO(t *testing.T) {
	dir := t.TempDir()
	src, liveCmdline := isoSource(t, dir)
	raw := filepath.Join(dir, "disk.raw")
	f, err := os.Create(raw)
	if err != nil {
		t.Fatal(err)
	}
	// A sparse disk with data at both ends, as a kiln image's GPT has.
	for _, off := range []int64{0, 300 << 20} {
		if _, err := f.WriteAt(bytes.Repeat([]byte("kiln disk "), 100000), off); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()
	zst := filepath.Join(dir, "disk.raw.zst")
	sum, err := CompressDisk(context.Background(), raw, zst)
	if err != nil {
		t.Fatal(err)
	}
	if sum != sha(t, zst) {
		t.Errorf("CompressDisk returned sha256 %s, the file has %s", sum, sha(t, zst))
	}
	if _, err := CompressDisk(context.Background(), raw, zst); err == nil {
		t.Errorf("CompressDisk wrote over an existing file")
	}
	zf, err := os.Open(zst)
	if err != nil {
		t.Fatal(err)
	}
	head := make([]byte, zstd.HeaderMaxSize)
	io.ReadFull(zf, head)
	var zh zstd.Header
	if err := zh.Decode(head); err != nil || !zh.HasFCS || int64(zh.FrameContentSize) != fileSize(t, raw) {
		t.Errorf("frame header: %v, content size %d (set %v), want the raw size %d", err, zh.FrameContentSize, zh.HasFCS, fileSize(t, raw))
	}
	zf.Seek(0, io.SeekStart)
	dec, err := zstd.NewReader(zf)
	if err != nil {
		t.Fatal(err)
	}
	back := filepath.Join(dir, "back.raw")
	bf, err := os.Create(back)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(bf, dec); err != nil {
		t.Fatal(err)
	}
	bf.Close()
	dec.Close()
	zf.Close()
	if sha(t, back) != sha(t, raw) {
		t.Errorf("the compressed disk does not decompress to the raw disk")
	}

	installCmdline := ISOInstallCmdline("ro kiln.platform=metal", sum, "auto", false)
	if want := "ro kiln.platform=metal kiln.install.image_url=medium:/kiln/disk.raw.zst kiln.install.image_sha256=" + sum + " kiln.install.dev=auto"; installCmdline != want {
		t.Errorf("install cmdline %q, want %q", installCmdline, want)
	}
	if got := ISOInstallCmdline("ro", sum, "/dev/sdb", true); !strings.HasSuffix(got, " kiln.install.dev=/dev/sdb kiln.install.wipe=1") {
		t.Errorf("install cmdline with wipe: %q", got)
	}
	b := disk.BootImage{Kernel: filepath.Join(dir, "kernel"), Initrd: filepath.Join(dir, "initrd"), Bootloader: filepath.Join(dir, "systemd-bootx64.efi"),
		Cmdline: installCmdline, Title: "install", More: []disk.BootEntry{{Name: nodeimage.ISOLiveEntryName, Title: "live", Cmdline: liveCmdline}}}
	src.BootImage = filepath.Join(dir, "efi-install.img")
	if err := disk.WriteBootImage(src.BootImage, b); err != nil {
		t.Fatal(err)
	}
	src.Disk = zst
	dst := filepath.Join(t.TempDir(), "metal-worker.iso")
	if err := WriteISO(context.Background(), dst, src); err != nil {
		t.Fatal(err)
	}
	isoF, err := os.Open(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer isoF.Close()
	fsys, err := iso9660.Read(file.New(isoF, true), fileSize(t, dst), 0, 2048)
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	for path, want := range map[string]string{nodeimage.ISODiskPath: zst, nodeimage.ISORootFSPath: src.RootFS, nodeimage.ISOBootImagePath: src.BootImage} {
		in, err := fsys.OpenFile(path, os.O_RDONLY)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		b, err := io.ReadAll(in)
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(out, filepath.Base(path))
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		if sha(t, p) != sha(t, want) {
			t.Errorf("%s differs from its source", path)
		}
	}
	esp, err := disk.ReadBootImage(filepath.Join(out, filepath.Base(nodeimage.ISOBootImagePath)))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(esp.Entry, "options "+installCmdline+"\n") {
		t.Errorf("default entry\n%s\nwant the install command line %q", esp.Entry, installCmdline)
	}
	if live := esp.More[nodeimage.ISOLiveEntryName]; !strings.Contains(live, "options "+liveCmdline+"\n") {
		t.Errorf("live entry %s:\n%s\nwant the live command line %q", nodeimage.ISOLiveEntryName, live, liveCmdline)
	}
}

// isoFile reads the file p from the ISO 9660 image iso.
func isoFile(t *testing.T, iso, p string) ([]byte, error) {
	t.Helper()
	f, err := os.Open(iso)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fsys, err := iso9660.Read(file.New(f, true), fileSize(t, iso), 0, 2048)
	if err != nil {
		t.Fatalf("read %s as ISO 9660: %v", iso, err)
	}
	in, err := fsys.OpenFile(p, os.O_RDONLY)
	if err != nil {
		return nil, err
	}
	return io.ReadAll(in)
}

// AddISOConfig copies an ISO with the config at ISOConfigPath, a second time replacing it; the
// copy keeps the label, every other file's bytes, the El Torito EFI entry and the hybrid GPT.
// It refuses an existing destination, an empty config and an ISO that is no kiln iso, leaving
// no file behind.
func TestAddISOConfig(t *testing.T) {
	src, _ := isoSource(t, t.TempDir())
	iso := filepath.Join(t.TempDir(), "metal-worker.iso")
	if err := WriteISO(context.Background(), iso, src); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	one, two := filepath.Join(dir, "one.iso"), filepath.Join(dir, "two.iso")
	if err := AddISOConfig(context.Background(), iso, one, []byte(`{"ignition":{"version":"3.4.0"}}`)); err != nil {
		t.Fatal(err)
	}
	if err := AddISOConfig(context.Background(), one, two, []byte(`{"ignition":{"version":"3.5.0"}}`)); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]string{one: `{"ignition":{"version":"3.4.0"}}`, two: `{"ignition":{"version":"3.5.0"}}`} {
		got, err := isoFile(t, p, nodeimage.ISOConfigPath)
		if err != nil || string(got) != want {
			t.Errorf("%s: %s = %q, %v; want %q", filepath.Base(p), nodeimage.ISOConfigPath, got, err, want)
		}
		for path, src := range map[string]string{nodeimage.ISORootFSPath: src.RootFS, nodeimage.ISOBootImagePath: src.BootImage} {
			b, err := isoFile(t, p, path)
			want, _ := os.ReadFile(src)
			if err != nil || !bytes.Equal(b, want) {
				t.Errorf("%s: %s differs from its source (%v)", filepath.Base(p), path, err)
			}
		}
		if id, err := nodeimage.ISOVolumeID(p); err != nil || id != nodeimage.ISOLabel {
			t.Errorf("%s: volume %q, %v", filepath.Base(p), id, err)
		}
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		bootLBA := checkElTorito(t, f)
		f.Close()
		checkHybridGPT(t, p, bootLBA, fileSize(t, src.BootImage))
	}
	if _, err := isoFile(t, iso, nodeimage.ISOConfigPath); err == nil {
		t.Errorf("the source ISO was changed: it holds %s", nodeimage.ISOConfigPath)
	}

	notKiln := filepath.Join(dir, "cidata.iso")
	tree := t.TempDir()
	if err := os.WriteFile(filepath.Join(tree, "user-data"), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	testkit.Run(t, "xorriso", "-as", "mkisofs", "-quiet", "-V", "CIDATA", "-o", notKiln, tree)
	for _, tt := range []struct {
		name, src, dst string
		config         string
		wantErr        string
	}{
		{"destination exists", iso, one, "{}", "exists already"},
		{"empty config", iso, filepath.Join(dir, "new.iso"), "", "the config is empty"},
		{"not a kiln iso", notKiln, filepath.Join(dir, "new.iso"), "{}", `volume "CIDATA" is not a kiln iso`},
		{"not an iso", src.RootFS, filepath.Join(dir, "new.iso"), "{}", "no ISO 9660"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			before, _ := os.ReadDir(dir)
			err := AddISOConfig(context.Background(), tt.src, tt.dst, []byte(tt.config))
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("AddISOConfig = %v, want %q", err, tt.wantErr)
			}
			if after, _ := os.ReadDir(dir); len(after) != len(before) {
				t.Errorf("files left behind: %v", after)
			}
		})
	}
}

// The same files give the same ISO bytes whenever they are written and whatever their dates
// on the host: every date in the volume is the source's Created time.
func TestWriteISOReproducible(t *testing.T) {
	src, _ := isoSource(t, t.TempDir())
	src.Created = time.Unix(1.7e9, 0)
	write := func(name string) []byte {
		dst := filepath.Join(t.TempDir(), name)
		if err := WriteISO(context.Background(), dst, src); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(dst)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	a := write("a.iso")
	for _, p := range []string{src.RootFS, src.BootImage} {
		later := time.Now().Add(time.Hour)
		if err := os.Chtimes(p, later, later); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(1100 * time.Millisecond) // another second on the clock
	if b := write("b.iso"); !bytes.Equal(a, b) {
		t.Error("the same files written again gave other bytes")
	}
	src.Created = src.Created.Add(time.Hour)
	if c := write("c.iso"); bytes.Equal(a, c) {
		t.Error("another creation time gave the same bytes: the volume's dates are not Created")
	}
}
