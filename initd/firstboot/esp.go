package firstboot

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/diskfs/go-diskfs/backend/file"
	"github.com/diskfs/go-diskfs/filesystem/fat32"

	"github.com/kilnproject/kiln/initd/blockdev"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

// espFS is the EFI system partition as first boot edits it; names are paths from its root
// (nodeimage.LoaderEntryPath).
type espFS interface {
	ReadDir(dir string) ([]string, error)
	ReadFile(name string) ([]byte, error)
	WriteFile(name string, data []byte) error
	// Close writes what is pending to the disk.
	Close() error
}

// maxEntrySize bounds a boot loader entry first boot reads.
const maxEntrySize = 64 << 10

// openESP opens the ESP first boot writes kernel arguments to: opts.ESP, a directory holding
// an ESP's files, or else the EFI system partition of the disk holding the root partition
// partuuid names (the node's ESP is not mounted: first boot reads its FAT itself, as the
// installer does). where names it for errors.
func openESP(opts Options, partuuid string) (esp espFS, where string, err error) {
	if opts.ESP != "" {
		r, err := os.OpenRoot(opts.ESP)
		if err != nil {
			return nil, "", fmt.Errorf("the ESP: %w", err)
		}
		return &dirESP{root: r}, opts.ESP, nil
	}
	sys, dev := opts.Facts.SysRoot, opts.DevDir
	if sys == "" {
		sys = "/sys"
	}
	if dev == "" {
		dev = "/dev"
	}
	return bootDiskESP(filepath.Join(sys, "block"), dev, partuuid)
}

// bootDiskESP opens the EFI system partition of the disk holding partition partuuid, the
// disks listed in sysBlock and opened in devDir.
func bootDiskESP(sysBlock, devDir, partuuid string) (espFS, string, error) {
	disks, err := blockdev.ScanDisks(sysBlock, devDir)
	if err != nil {
		return nil, "", fmt.Errorf("find the boot disk: %w", err)
	}
	disk, _, ok := blockdev.FindPartition(disks, partuuid)
	if !ok {
		return nil, "", fmt.Errorf("find the boot disk: no disk holds the root partition PARTUUID=%s", partuuid)
	}
	var esp *blockdev.Partition
	for i, p := range disk.Partitions {
		if p.Type == nodeimage.TypeESP {
			esp = &disk.Partitions[i]
			break
		}
	}
	if esp == nil {
		return nil, "", fmt.Errorf("the boot disk %s has no EFI system partition", disk.Path)
	}
	where := fmt.Sprintf("the ESP (%s partition %d)", disk.Path, esp.Index)
	// Not O_EXCL: the disk's other partitions are mounted; the ESP is not.
	f, err := os.OpenFile(disk.Path, os.O_RDWR, 0)
	if err != nil {
		return nil, "", fmt.Errorf("open %s: %w", where, err)
	}
	ss := int64(disk.SectorSize)
	fs, err := fat32.Read(file.New(f, false), int64(esp.End-esp.Start+1)*ss, int64(esp.Start)*ss, ss)
	if err != nil {
		f.Close()
		return nil, "", fmt.Errorf("read %s: %w", where, err)
	}
	return &fatESP{f: f, fs: fs}, where, nil
}

// fatESP is the ESP's FAT filesystem on the boot disk.
type fatESP struct {
	f  *os.File
	fs *fat32.FileSystem
}

func (e *fatESP) ReadDir(dir string) ([]string, error) {
	entries, err := e.fs.ReadDir(rel(dir)) // an io/fs path: no leading slash
	if err != nil {
		return nil, err
	}
	var names []string
	for _, d := range entries {
		if !d.IsDir() {
			names = append(names, d.Name())
		}
	}
	return names, nil
}

func (e *fatESP) ReadFile(name string) ([]byte, error) {
	f, err := e.fs.OpenFile(name, os.O_RDONLY)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return readBounded(f, name)
}

func (e *fatESP) WriteFile(name string, data []byte) error {
	f, err := e.fs.OpenFile(name, os.O_RDWR|os.O_TRUNC)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// Close syncs the disk, so the entry is there whatever happens next (a reboot).
func (e *fatESP) Close() error {
	if e.f == nil {
		return nil
	}
	err := errors.Join(e.f.Sync(), e.f.Close())
	e.f = nil
	return err
}

// dirESP is a directory holding an ESP's files (tests).
type dirESP struct{ root *os.Root }

func (d *dirESP) ReadDir(dir string) ([]string, error) {
	f, err := d.root.Open(rel(dir))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	entries, err := f.ReadDir(-1)
	var names []string
	for _, e := range entries {
		if !e.IsDir() {
			names = append(names, e.Name())
		}
	}
	return names, err
}

func (d *dirESP) ReadFile(name string) ([]byte, error) {
	f, err := d.root.Open(rel(name))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return readBounded(f, name)
}

func (d *dirESP) WriteFile(name string, data []byte) error {
	return d.root.WriteFile(rel(name), data, 0o644)
}

func (d *dirESP) Close() error { return d.root.Close() }

func rel(name string) string { return strings.TrimPrefix(name, "/") }

// readBounded reads r to the end, at most maxEntrySize bytes.
func readBounded(r io.Reader, name string) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, maxEntrySize+1))
	if err == nil && len(b) > maxEntrySize {
		err = fmt.Errorf("%s is larger than %d KiB", name, maxEntrySize>>10)
	}
	return b, err
}
