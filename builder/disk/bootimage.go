package disk

import (
	"fmt"
	pathpkg "path"
	"strings"
	"time"

	diskfs "github.com/diskfs/go-diskfs"

	"github.com/kilnproject/kiln/internal/nodeimage"
)

// MinBootImageSize is the least size of a boot image: a FAT32 volume needs 65525 clusters, and
// go-diskfs makes 512-byte clusters below 260 MiB, so anything smaller would be read as FAT16
// by UEFI's FAT driver.
const MinBootImageSize = 40 * MiB

// BootImage is what WriteBootImage puts in a FAT image: the ESP's boot files and a loader entry
// with Cmdline, the whole kernel command line.
type BootImage struct {
	// Kernel, Initrd and Bootloader are host paths of vmlinuz, the initramfs and
	// systemd-bootx64.efi.
	Kernel, Initrd, Bootloader string
	// Cmdline is the loader entry's options line (no root= for a live boot).
	Cmdline string
	// Title is the loader entry's title; "kiln" when empty.
	Title string
	// ModTime stamps the files; zero means 1980-01-01.
	ModTime time.Time
	// More are further loader entries, beside the default one (nodeimage.LoaderEntryPath):
	// systemd-boot's menu offers them when a key is held at boot.
	More []BootEntry
}

// BootEntry is a loader entry of a boot image besides its default: the file name in
// nodeimage.LoaderEntriesDir (ending in .conf), the title and the kernel command line; the
// kernel and initramfs are the default entry's.
type BootEntry struct {
	Name, Title, Cmdline string
}

// WriteBootImage writes path as a FAT32 image without a partition table, labelled ESPLabel,
// holding the files an ESP of Build holds (systemd-boot, loader.conf, the loader entry, the
// kernel and the initramfs; no image.json): the El Torito EFI boot image of an ISO. It is
// sized to its files, at least MinBootImageSize. path is written next to itself and renamed
// into place, so on error it is left as it was.
func WriteBootImage(path string, b BootImage) error {
	if strings.ContainsAny(b.Title+b.Cmdline, "\r\n") {
		return fmt.Errorf("boot image %s: title and kernel arguments must be one line", path)
	}
	if strings.TrimSpace(b.Cmdline) == "" {
		return fmt.Errorf("boot image %s: no kernel command line", path)
	}
	for _, e := range b.More {
		if !strings.HasSuffix(e.Name, ".conf") || strings.ContainsAny(e.Name, "/\\") || e.Name == nodeimage.LoaderEntryName {
			return fmt.Errorf("boot image %s: loader entry name %q: want a file name ending in .conf other than %s", path, e.Name, nodeimage.LoaderEntryName)
		}
		if strings.ContainsAny(e.Title+e.Cmdline, "\r\n") || strings.TrimSpace(e.Cmdline) == "" {
			return fmt.Errorf("boot image %s: loader entry %s: title and kernel arguments must be one non-empty line", path, e.Name)
		}
	}
	files, err := readESPFiles(Spec{Kernel: b.Kernel, Initrd: b.Initrd, Bootloader: b.Bootloader})
	if err != nil {
		return fmt.Errorf("boot image %s: %w", path, err)
	}
	files = files[:len(files)-1] // image.json: the root image carries it
	files = append(files, espFile{nodeimage.LoaderConfPath, []byte(LoaderConf)},
		espFile{nodeimage.LoaderEntryPath, []byte(LoaderEntry(b.Title, b.Cmdline))})
	for _, e := range b.More {
		files = append(files, espFile{nodeimage.LoaderEntriesDir + "/" + e.Name, []byte(LoaderEntry(e.Title, e.Cmdline))})
	}
	var total int64
	for _, f := range files {
		total += alignUp(int64(len(f.data)), 4096)
	}
	// The FATs take about 1/128 of a volume of 512-byte clusters; 8 MiB covers them and the
	// directories.
	size := max(MinBootImageSize, alignUp(total+total/64+8*MiB, MiB))
	return writeReplacing(path, func(tmp string) (err error) {
		d, err := diskfs.Create(tmp, size, SectorSize)
		if err != nil {
			return fmt.Errorf("create boot image %s: %w", tmp, err)
		}
		defer func() {
			if cerr := d.Close(); cerr != nil && err == nil {
				err = fmt.Errorf("close boot image %s: %w", tmp, cerr)
			}
		}()
		return writeESP(d, 0, files, b.ModTime)
	})
}

// ReadBootImage reads a boot image written by WriteBootImage: its label, files, loader
// configuration and default entry (ImageJSON stays empty).
func ReadBootImage(path string) (*ESPInfo, error) {
	d, err := diskfs.Open(path, diskfs.WithOpenMode(diskfs.ReadOnly), diskfs.WithSectorSize(SectorSize))
	if err != nil {
		return nil, fmt.Errorf("open boot image %s: %w", path, err)
	}
	defer d.Close()
	fs, err := d.GetFilesystem(0)
	if err != nil {
		return nil, fmt.Errorf("boot image %s: read FAT: %w", path, err)
	}
	defer fs.Close()
	info := &ESPInfo{Label: strings.TrimSpace(fs.Label())}
	if err := walkESP(fs, ".", info); err != nil {
		return info, fmt.Errorf("boot image %s: list files: %w", path, err)
	}
	conf, err := readESPFile(fs, nodeimage.LoaderConfPath)
	if err != nil {
		return info, fmt.Errorf("boot image %s: %s: %w", path, nodeimage.LoaderConfPath, err)
	}
	info.LoaderConf = string(conf)
	if info.EntryName = confValue(info.LoaderConf, "default"); info.EntryName == "" {
		return info, fmt.Errorf("boot image %s: %s names no default entry", path, nodeimage.LoaderConfPath)
	}
	entry, err := readESPFile(fs, nodeimage.LoaderEntriesDir+"/"+info.EntryName)
	if err != nil {
		return info, fmt.Errorf("boot image %s: entry %s: %w", path, info.EntryName, err)
	}
	info.Entry = string(entry)
	for _, f := range info.Files {
		dir, name := pathpkg.Split(f.Path)
		if dir != nodeimage.LoaderEntriesDir+"/" || name == info.EntryName {
			continue
		}
		b, err := readESPFile(fs, f.Path)
		if err != nil {
			return info, fmt.Errorf("boot image %s: entry %s: %w", path, name, err)
		}
		if info.More == nil {
			info.More = map[string]string{}
		}
		info.More[name] = string(b)
	}
	return info, nil
}
