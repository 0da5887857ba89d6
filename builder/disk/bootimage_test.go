package disk

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/kilnproject/kiln/internal/nodeimage"
)

func bootImageFixture(t *testing.T, kernelSize int) BootImage {
	t.Helper()
	dir := t.TempDir()
	return BootImage{
		Kernel:     randomFile(t, dir, "vmlinuz", kernelSize),
		Initrd:     randomFile(t, dir, "initrd.img", 2<<20+7),
		Bootloader: randomFile(t, dir, "systemd-bootx64.efi", 120<<10),
		Cmdline:    "ro kiln.platform=metal console=ttyS0 kiln.live.rootfs_url=medium:/kiln/root.img kiln.live.rootfs_sha256=" + strings.Repeat("a", 64),
		Title:      "kiln metal worker live",
	}
}

// A boot image holds what the ESP holds but image.json, with the live entry the default, and
// is sized to its files, never below the FAT32 minimum.
func TestWriteBootImage(t *testing.T) {
	for _, tt := range []struct {
		name       string
		kernelSize int
		wantSize   int64 // 0: more than MinBootImageSize
	}{
		{"small files", 6<<20 + 123, MinBootImageSize},
		{"a kernel larger than the minimum", 60 << 20, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b := bootImageFixture(t, tt.kernelSize)
			p := filepath.Join(t.TempDir(), "efi.img")
			if err := WriteBootImage(p, b); err != nil {
				t.Fatal(err)
			}
			fi, err := os.Stat(p)
			if err != nil {
				t.Fatal(err)
			}
			if tt.wantSize != 0 && fi.Size() != tt.wantSize || tt.wantSize == 0 && fi.Size() <= MinBootImageSize {
				t.Errorf("size %d, want %d (0: above the minimum %d)", fi.Size(), tt.wantSize, MinBootImageSize)
			}
			info, err := ReadBootImage(p)
			if err != nil {
				t.Fatal(err)
			}
			if info.Label != nodeimage.ESPLabel || info.EntryName != nodeimage.LoaderEntryName {
				t.Errorf("label %q, default entry %q", info.Label, info.EntryName)
			}
			if info.Entry != LoaderEntry(b.Title, b.Cmdline) {
				t.Errorf("entry\n%s\nwant\n%s", info.Entry, LoaderEntry(b.Title, b.Cmdline))
			}
			sizes := map[string]int64{}
			for _, f := range info.Files {
				sizes[f.Path] = f.Size
			}
			for path, src := range map[string]string{nodeimage.KernelPath: b.Kernel, nodeimage.InitrdPath: b.Initrd, nodeimage.BootloaderPath: b.Bootloader} {
				if sizes[path] != size(t, src) {
					t.Errorf("%s: %d bytes, its source %d", path, sizes[path], size(t, src))
				}
			}
			if _, ok := sizes[nodeimage.ESPImageJSONPath]; ok {
				t.Errorf("the boot image holds %s", nodeimage.ESPImageJSONPath)
			}
		})
	}
}

// More entries are written beside the default one, which loader.conf keeps the default.
func TestWriteBootImageMoreEntries(t *testing.T) {
	b := bootImageFixture(t, 1<<20)
	install := b.Cmdline
	b.Cmdline = "ro kiln.install.image_url=medium:/kiln/disk.raw.zst kiln.install.dev=auto"
	b.More = []BootEntry{{Name: "kiln-live.conf", Title: "kiln live", Cmdline: install}}
	p := filepath.Join(t.TempDir(), "efi.img")
	if err := WriteBootImage(p, b); err != nil {
		t.Fatal(err)
	}
	info, err := ReadBootImage(p)
	if err != nil {
		t.Fatal(err)
	}
	if info.EntryName != nodeimage.LoaderEntryName || info.Entry != LoaderEntry(b.Title, b.Cmdline) {
		t.Errorf("default entry %s:\n%s", info.EntryName, info.Entry)
	}
	if want := map[string]string{"kiln-live.conf": LoaderEntry("kiln live", install)}; !reflect.DeepEqual(info.More, want) {
		t.Errorf("more entries %q, want %q", info.More, want)
	}
}

// WriteBootImage refuses what would not make a loader entry and keeps an existing file.
func TestWriteBootImageRefuses(t *testing.T) {
	for _, tt := range []struct {
		name    string
		edit    func(*BootImage)
		wantErr string
	}{
		{"two-line cmdline", func(b *BootImage) { b.Cmdline += "\ninitrd /evil" }, "must be one line"},
		{"two-line title", func(b *BootImage) { b.Title = "a\rb" }, "must be one line"},
		{"no cmdline", func(b *BootImage) { b.Cmdline = " " }, "no kernel command line"},
		{"more entry named as the default", func(b *BootImage) { b.More = []BootEntry{{Name: nodeimage.LoaderEntryName, Cmdline: "ro"}} }, "loader entry name"},
		{"more entry not .conf", func(b *BootImage) { b.More = []BootEntry{{Name: "live", Cmdline: "ro"}} }, "loader entry name"},
		{"more entry without cmdline", func(b *BootImage) { b.More = []BootEntry{{Name: "live.conf"}} }, "one non-empty line"},
		{"missing kernel", func(b *BootImage) { b.Kernel = filepath.Join(t.TempDir(), "nope") }, "kernel: read:"},
		{"kernel is a directory", func(b *BootImage) { b.Kernel = t.TempDir() }, "is not a regular file"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b := bootImageFixture(t, 1<<20)
			tt.edit(&b)
			dir := t.TempDir()
			p := filepath.Join(dir, "efi.img")
			if err := os.WriteFile(p, []byte("previous"), 0o644); err != nil {
				t.Fatal(err)
			}
			err := WriteBootImage(p, b)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !strings.Contains(err.Error(), p) {
				t.Fatalf("WriteBootImage = %v, want an error naming %s and %q", err, p, tt.wantErr)
			}
			if got, _ := os.ReadFile(p); string(got) != "previous" {
				t.Errorf("the existing file was changed")
			}
			if entries, _ := os.ReadDir(dir); len(entries) != 1 {
				t.Errorf("files left beside it: %v", entries)
			}
		})
	}
}
