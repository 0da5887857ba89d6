// Package disk writes kiln's bootable GPT disk image and the read-only root
// filesystem that goes on it.
//
// The layout is the boot contract shared with kiln-init (its names and paths
// are in internal/nodeimage): partition 1, the ESP (FAT32, 256 MiB) holding
// systemd-boot, one loader entry, the kernel, the initramfs and image.json;
// partitions 2 and 3, root-a and root-b (Linux root x86-64, same size), of
// which root-a holds the root filesystem and root-b stays empty. The data
// partition is not written: it is created by kiln-init at first boot in the
// space left after root-b.
//
// Everything is done on a sparse regular file with go-diskfs (GPT, FAT32)
// and mksquashfs/mkfs.erofs: no root, no loop devices, no mounts. With a
// Seed (and the same inputs) the output is byte for byte reproducible.
package disk

import (
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	diskfs "github.com/diskfs/go-diskfs"
	"github.com/diskfs/go-diskfs/disk"
	"github.com/diskfs/go-diskfs/filesystem"
	"github.com/diskfs/go-diskfs/partition/gpt"
	"github.com/google/uuid"

	"github.com/kilnproject/kiln/internal/nodeimage"
)

// Sizes of the layout.
const (
	MiB        = int64(1 << 20)
	SectorSize = 512
	// Align is the alignment of every partition's start and size.
	Align = MiB
	// ESPSize is the size of the EFI system partition.
	ESPSize = 256 * MiB
	// MinHeadroom and HeadroomPercent size a fitted root partition: the
	// root filesystem plus max(HeadroomPercent %, MinHeadroom), so that a
	// somewhat bigger image still fits root-b on an A/B update.
	MinHeadroom     = 64 * MiB
	HeadroomPercent = 20
	// MinDataSize is the least space Build leaves after root-b for the data
	// partition kiln-init creates at first boot.
	MinDataSize = 128 * MiB
)

// Platforms kiln-init knows (kiln.platform=).
var platforms = []string{"qemu", "aws", "gce", "metal"}

// kilnNamespace is the UUIDv5 namespace from which seeded GUIDs derive.
var kilnNamespace = uuid.MustParse("5e0c3f52-6b0e-4a7c-9d35-0f2b8a4e6c11")

// Spec describes the disk Build writes.
type Spec struct {
	// Size is the disk size in bytes: it must hold the ESP, root-a, root-b
	// and MinDataSize. The disk may later be grown; kiln-init moves the
	// backup GPT to the real end.
	Size int64
	// RootFS is the root filesystem image made by MakeRootFS, RootFSType
	// its type (SquashFS or EROFS).
	RootFS     string
	RootFSType string
	// ESPSize is the EFI system partition's size; 0 means ESPSize (256 MiB).
	ESPSize int64
	// RootPartitionSize overrides the fitted size of root-a and root-b
	// (bytes, a multiple of 1 MiB, at least the RootFS size).
	RootPartitionSize int64
	// SizeMultiple, when set, is what the disk size must be a multiple of (GCE
	// images: 1 GiB): a fitted size is rounded up to it (the data partition
	// takes the rest), a given Size that is no multiple is an error.
	SizeMultiple int64
	// Kernel, Initrd and Bootloader are host paths of vmlinuz, the
	// initramfs and systemd-bootx64.efi.
	Kernel, Initrd, Bootloader string
	// Platform is qemu, aws, gce or metal (kiln.platform=).
	Platform string
	// Cmdline holds the extra kernel arguments (e.g. "console=ttyS0");
	// Build puts root=, rootfstype=, ro and kiln.platform= before them.
	Cmdline string
	// ImageJSON is the image metadata, written to /kiln/image.json.
	ImageJSON []byte
	// Title is the loader entry's title; "kiln" when empty.
	Title string
	// Seed makes the disk and partition GUIDs derive from it (UUIDv5) so
	// the output is reproducible; they are random when it is empty.
	Seed string
	// ModTime stamps the files on the ESP; zero means 1980-01-01, the
	// earliest time FAT can store.
	ModTime time.Time
}

// Result describes a disk that Build wrote or Read found.
type Result struct {
	Size       int64
	DiskGUID   string // lowercase
	Partitions []nodeimage.Partition
	// Cmdline is the full kernel command line of the loader entry.
	Cmdline string
}

// Partition returns the partition with the given GPT name.
func (r *Result) Partition(name string) (nodeimage.Partition, bool) {
	for _, p := range r.Partitions {
		if p.Name == name {
			return p, true
		}
	}
	return nodeimage.Partition{}, false
}

// layout computes the partitions; sizes in bytes.
// A zero s.Size is replaced by the smallest size that fits; the size used is returned.
func layout(s Spec, rootfsSize int64) ([]nodeimage.Partition, int64, error) {
	rootSize := s.RootPartitionSize
	if rootSize == 0 {
		headroom := max(rootfsSize*HeadroomPercent/100, MinHeadroom)
		rootSize = alignUp(rootfsSize+headroom, Align)
	} else {
		if rootSize%Align != 0 {
			return nil, 0, fmt.Errorf("root partition size %d is not a multiple of 1 MiB", rootSize)
		}
		if rootSize < rootfsSize {
			return nil, 0, fmt.Errorf("root partition size %d MiB is smaller than root filesystem %s (%d bytes)",
				rootSize/MiB, s.RootFS, rootfsSize)
		}
	}
	espSize := s.ESPSize
	if espSize == 0 {
		espSize = ESPSize
	}
	if espSize%Align != 0 {
		return nil, 0, fmt.Errorf("ESP size %d is not a multiple of 1 MiB", espSize)
	}
	espStart := Align
	rootAStart := espStart + espSize
	rootBStart := rootAStart + rootSize
	end := rootBStart + rootSize
	if s.Size == 0 {
		// Just large enough: the data partition gets its minimum; clouds grow the disk.
		s.Size = alignUp(end+MinDataSize+33*SectorSize, max(Align, s.SizeMultiple))
	} else if s.SizeMultiple > 0 && s.Size%s.SizeMultiple != 0 {
		return nil, 0, fmt.Errorf("disk size %d bytes (%d MiB) is not a multiple of %d MiB", s.Size, s.Size/MiB, s.SizeMultiple/MiB)
	}
	// The backup GPT takes the last 33 sectors.
	lastUsable := (s.Size/SectorSize - 34 + 1) * SectorSize
	need := end + MinDataSize + 33*SectorSize
	if s.Size < need || lastUsable-end < MinDataSize {
		return nil, 0, fmt.Errorf("disk size %d bytes (%d MiB) is too small: the ESP takes %d MiB, root-a and root-b %d MiB each "+
			"(root filesystem %d bytes + headroom), the data partition needs at least %d MiB; give at least %d MiB",
			s.Size, s.Size/MiB, espSize/MiB, rootSize/MiB, rootfsSize, MinDataSize/MiB, alignUp(need, MiB)/MiB)
	}
	return []nodeimage.Partition{
		{Number: 1, Name: nodeimage.ESPName, Type: nodeimage.TypeESP, Start: espStart, Size: espSize},
		{Number: 2, Name: nodeimage.RootAName, Type: nodeimage.TypeRootX86, Start: rootAStart, Size: rootSize},
		{Number: 3, Name: nodeimage.RootBName, Type: nodeimage.TypeRootX86, Start: rootBStart, Size: rootSize},
	}, s.Size, nil
}

func alignUp(n, a int64) int64 { return (n + a - 1) / a * a }

// guid returns the GUID for what ("disk", a partition name), seeded or random.
func guid(seed, what string) string {
	if seed == "" {
		return uuid.New().String()
	}
	return uuid.NewHash(sha256.New(), kilnNamespace, []byte(seed+"\x00"+what), 5).String()
}

// KernelCmdline returns the options line for a root partition GUID: root= and rootfstype=
// naming root-a, then BootArgs.
func KernelCmdline(rootGUID, rootFSType, platform, extra string) string {
	return fmt.Sprintf("root=PARTUUID=%s rootfstype=%s %s", strings.ToLower(rootGUID), rootFSType, BootArgs(platform, extra))
}

// BootArgs are the kernel arguments every boot of an image has, from a disk or the network:
// ro, kiln.platform= and the extra arguments (the definition's kernel.args). A network boot
// (the pxe output) boots with these and no root=.
func BootArgs(platform, extra string) string {
	c := "ro kiln.platform=" + platform
	if extra = strings.Join(strings.Fields(extra), " "); extra != "" {
		c += " " + extra
	}
	return c
}

// LoaderConf is the content of nodeimage.LoaderConfPath.
const LoaderConf = "default " + nodeimage.LoaderEntryName + "\ntimeout 0\n"

// LoaderEntry returns the content of nodeimage.LoaderEntryPath.
func LoaderEntry(title, cmdline string) string {
	if title == "" {
		title = "kiln"
	}
	return "title " + title + "\n" +
		"linux " + nodeimage.KernelPath + "\n" +
		"initrd " + nodeimage.InitrdPath + "\n" +
		"options " + cmdline + "\n"
}

func (s Spec) check() error {
	var problems []string
	if s.Size < 0 {
		problems = append(problems, fmt.Sprintf("size %d is negative", s.Size))
	} else if s.Size%SectorSize != 0 {
		problems = append(problems, fmt.Sprintf("size %d is not a multiple of %d", s.Size, SectorSize))
	}
	if s.RootFSType != SquashFS && s.RootFSType != EROFS {
		problems = append(problems, fmt.Sprintf("root filesystem type %q is not %s or %s", s.RootFSType, SquashFS, EROFS))
	}
	if !contains(platforms, s.Platform) {
		problems = append(problems, fmt.Sprintf("platform %q is not one of %s", s.Platform, strings.Join(platforms, ", ")))
	}
	for field, p := range map[string]string{"rootfs": s.RootFS, "kernel": s.Kernel, "initrd": s.Initrd, "bootloader": s.Bootloader} {
		if p == "" {
			problems = append(problems, "no "+field+" file given")
		}
	}
	if len(s.ImageJSON) == 0 {
		problems = append(problems, "no image metadata (image.json) given")
	} else if !json.Valid(s.ImageJSON) {
		problems = append(problems, "image metadata (image.json) is not valid JSON")
	}
	if strings.ContainsAny(s.Title, "\n\r") || strings.ContainsAny(s.Cmdline, "\n\r") {
		problems = append(problems, "title and kernel arguments must be one line")
	}
	if len(problems) > 0 {
		return fmt.Errorf("disk spec: %s", strings.Join(problems, "; "))
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, l := range list {
		if l == s {
			return true
		}
	}
	return false
}

// Build writes the disk image to path as a sparse file. The image is
// written next to path and renamed into place at the end, so on any error
// path is left as it was and no partial file remains.
func Build(path string, s Spec) (*Result, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	rootfs, rootfsSize, err := openRootFS(s.RootFS)
	if err != nil {
		return nil, err
	}
	defer rootfs.Close()
	res, espFiles, err := plan(s, rootfsSize)
	if err != nil {
		return nil, err
	}
	err = writeReplacing(path, func(tmp string) error {
		return writeDisk(tmp, res, espFiles, s, rootfs, rootfsSize)
	})
	if err != nil {
		return nil, err
	}
	return res, nil
}

// openRootFS opens the root filesystem image and returns its size.
func openRootFS(name string) (*os.File, int64, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, 0, fmt.Errorf("root filesystem image: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, fmt.Errorf("root filesystem image: %w", err)
	}
	if st.Size() == 0 || !st.Mode().IsRegular() {
		f.Close()
		return nil, 0, fmt.Errorf("root filesystem image %s is empty or not a regular file", name)
	}
	return f, st.Size(), nil
}

// plan lays out the disk, names its GUIDs and kernel command line, and reads
// the files for the ESP: everything that can fail before a file is created.
func plan(s Spec, rootfsSize int64) (*Result, []espFile, error) {
	parts, size, err := layout(s, rootfsSize)
	if err != nil {
		return nil, nil, err
	}
	s.Size = size
	espFiles, err := readESPFiles(s)
	if err != nil {
		return nil, nil, err
	}
	res := &Result{Size: s.Size, DiskGUID: guid(s.Seed, "disk")}
	for i := range parts {
		parts[i].GUID = guid(s.Seed, parts[i].Name)
	}
	res.Partitions = parts
	res.Cmdline = KernelCmdline(parts[1].GUID, s.RootFSType, s.Platform, s.Cmdline)
	espFiles = append(espFiles, espFile{nodeimage.LoaderConfPath, []byte(LoaderConf)},
		espFile{nodeimage.LoaderEntryPath, []byte(LoaderEntry(s.Title, res.Cmdline))})
	return res, espFiles, nil
}

// writeReplacing runs write on a partial file next to path and renames it
// onto path when write succeeds; otherwise it removes it.
func writeReplacing(path string, write func(tmp string) error) error {
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".partial")
	if err := os.Remove(tmp); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove stale partial image: %w", err)
	}
	if err := write(tmp); err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("move disk image into place: %w", err)
	}
	return nil
}

// writeDisk creates the disk image file name: the partition table, the ESP
// and the root filesystem in root-a.
func writeDisk(name string, res *Result, espFiles []espFile, s Spec, rootfs io.Reader, rootfsSize int64) (err error) {
	d, err := diskfs.Create(name, res.Size, SectorSize)
	if err != nil {
		return fmt.Errorf("create disk image %s: %w", name, err)
	}
	defer func() {
		if cerr := d.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("close disk image %s: %w", name, cerr)
		}
	}()
	if err := d.Partition(gptTable(res)); err != nil {
		return fmt.Errorf("write partition table: %w", err)
	}
	if err := writeESP(d, 1, espFiles, s.ModTime); err != nil {
		return err
	}
	rootA, ok := res.Partition(nodeimage.RootAName)
	if !ok {
		return fmt.Errorf("no %s partition in the layout", nodeimage.RootAName)
	}
	if err := writeRootFS(name, rootA, rootfs, rootfsSize); err != nil {
		return fmt.Errorf("write root filesystem %s to %s: %w", s.RootFS, nodeimage.RootAName, err)
	}
	return nil
}

// writeRootFS copies the root filesystem image into partition p of the disk image file name,
// in one copy the kernel does (copy_file_range where the file system has it) rather than
// go-diskfs's one read and one write per 512-byte sector, which took seconds for a few
// hundred MiB. The rest of the partition stays a hole.
func writeRootFS(name string, p nodeimage.Partition, rootfs io.Reader, rootfsSize int64) error {
	if rootfsSize > p.Size {
		return fmt.Errorf("%d bytes do not fit the partition's %d", rootfsSize, p.Size)
	}
	f, err := os.OpenFile(name, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := f.Seek(p.Start, io.SeekStart); err != nil {
		return err
	}
	n, err := io.Copy(f, io.LimitReader(rootfs, rootfsSize))
	if err != nil {
		return err
	}
	if n != rootfsSize {
		return fmt.Errorf("wrote %d of %d bytes", n, rootfsSize)
	}
	return f.Close()
}

// gptTable is the partition table of res for go-diskfs.
func gptTable(res *Result) *gpt.Table {
	table := &gpt.Table{
		LogicalSectorSize:  SectorSize,
		PhysicalSectorSize: SectorSize,
		ProtectiveMBR:      true,
		GUID:               strings.ToUpper(res.DiskGUID),
	}
	for _, p := range res.Partitions {
		table.Partitions = append(table.Partitions, &gpt.Partition{
			Index: p.Number,
			Start: uint64(p.Start / SectorSize),
			End:   uint64((p.Start+p.Size)/SectorSize - 1),
			Size:  uint64(p.Size),
			Type:  gpt.Type(strings.ToUpper(p.Type)),
			Name:  p.Name,
			GUID:  strings.ToUpper(p.GUID),
		})
	}
	return table
}

type espFile struct {
	path string
	data []byte
}

// readESPFiles reads the boot files. Each must be a regular file that fits
// the ESP: a bigger one could not be written there, and is not read into
// memory.
func readESPFiles(s Spec) ([]espFile, error) {
	espSize := s.ESPSize
	if espSize == 0 {
		espSize = ESPSize
	}
	var files []espFile
	for _, f := range []struct{ dst, src, what string }{
		{nodeimage.BootloaderPath, s.Bootloader, "bootloader"},
		{nodeimage.KernelPath, s.Kernel, "kernel"},
		{nodeimage.InitrdPath, s.Initrd, "initrd"},
	} {
		data, err := readBootFile(f.src, espSize)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f.what, err)
		}
		if len(data) == 0 {
			return nil, fmt.Errorf("%s %s is empty", f.what, f.src)
		}
		files = append(files, espFile{f.dst, data})
	}
	return append(files, espFile{nodeimage.ESPImageJSONPath, s.ImageJSON}), nil
}

func readBootFile(name string, limit int64) ([]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, fmt.Errorf("read: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("read: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file (%s)", name, fi.Mode().Type())
	}
	if fi.Size() > limit {
		return nil, fmt.Errorf("%s is %d bytes, more than the %d MiB ESP holds", name, fi.Size(), limit/MiB)
	}
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err == nil && int64(len(data)) > limit {
		err = fmt.Errorf("%s grew past %d MiB while read", name, limit/MiB)
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	return data, nil
}

// fatEpoch is the earliest timestamp FAT can store.
var fatEpoch = time.Date(1980, 1, 1, 0, 0, 0, 0, time.UTC)

// writeESP makes a FAT32 filesystem labelled ESPLabel on partition part of d (0: the whole of
// d, as in a boot image without a partition table) and writes files to it.
func writeESP(d *disk.Disk, part int, files []espFile, mtime time.Time) error {
	if mtime.IsZero() || mtime.Before(fatEpoch) {
		mtime = fatEpoch
	}
	mtime = mtime.UTC()
	fs, err := d.CreateFilesystem(disk.FilesystemSpec{Partition: part, FSType: filesystem.TypeFat32, VolumeLabel: nodeimage.ESPLabel, Reproducible: true})
	if err != nil {
		return fmt.Errorf("create FAT32 on %s: %w", nodeimage.ESPName, err)
	}
	defer fs.Close()
	dirs := map[string]bool{}
	var dirOrder []string
	for _, f := range files {
		for dir := filepath.Dir(f.path); dir != "/"; dir = filepath.Dir(dir) {
			if !dirs[dir] {
				dirs[dir] = true
				dirOrder = append(dirOrder, dir)
			}
		}
	}
	for _, f := range files {
		if err := fs.Mkdir(filepath.Dir(f.path)); err != nil {
			return fmt.Errorf("ESP: mkdir %s: %w", filepath.Dir(f.path), err)
		}
		w, err := fs.OpenFile(f.path, os.O_CREATE|os.O_RDWR|os.O_TRUNC)
		if err != nil {
			return fmt.Errorf("ESP: create %s: %w", f.path, err)
		}
		n, err := w.Write(f.data)
		if err == nil && n != len(f.data) {
			err = io.ErrShortWrite
		}
		if cerr := w.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("ESP: write %s: %w", f.path, err)
		}
	}
	// go-diskfs stamps every directory entry it makes with the current
	// time (or SOURCE_DATE_EPOCH); restamp them all, including the "." and
	// ".." entries and the volume label, so the ESP is reproducible.
	stamp := []string{"/" + nodeimage.ESPLabel}
	for _, f := range files {
		stamp = append(stamp, f.path)
	}
	for _, dir := range dirOrder {
		stamp = append(stamp, dir, dir+"/.", dir+"/..")
	}
	for _, p := range stamp {
		if err := fs.Chtimes(p, mtime, mtime, mtime); err != nil {
			return fmt.Errorf("ESP: set time of %s: %w", p, err)
		}
	}
	return nil
}

// ESPFile is a file found on the ESP.
type ESPFile struct {
	Path string
	Size int64
}

// ESPInfo is what Read finds on the EFI system partition.
type ESPInfo struct {
	Label      string
	LoaderConf string
	// EntryName is the loader entry that loader.conf makes the default.
	EntryName string
	Entry     string
	ImageJSON []byte
	Files     []ESPFile // every file, sorted by path
	// More holds the other loader entries by file name (ReadBootImage reads them).
	More map[string]string
}

// Read reads a disk written by Build: its partition table and, from the
// ESP, the loader configuration, the default entry and image.json.
func Read(name string) (*Result, *ESPInfo, error) {
	d, err := diskfs.Open(name, diskfs.WithOpenMode(diskfs.ReadOnly), diskfs.WithSectorSize(SectorSize))
	if err != nil {
		return nil, nil, fmt.Errorf("open disk image %s: %w", name, err)
	}
	defer d.Close()
	pt, err := d.GetPartitionTable()
	if err != nil {
		return nil, nil, fmt.Errorf("%s: read partition table: %w", name, err)
	}
	table, ok := pt.(*gpt.Table)
	if !ok {
		return nil, nil, fmt.Errorf("%s: partition table is %s, not GPT", name, pt.Type())
	}
	res := &Result{Size: d.Size, DiskGUID: strings.ToLower(table.GUID)}
	espIndex := 0
	for i, p := range table.Partitions {
		if p == nil || p.Type == gpt.Unused {
			continue
		}
		part := nodeimage.Partition{
			Number: i + 1,
			Name:   p.Name,
			Type:   strings.ToLower(string(p.Type)),
			GUID:   strings.ToLower(p.GUID),
			Start:  int64(p.Start) * SectorSize,
			Size:   int64(p.End-p.Start+1) * SectorSize,
		}
		if part.Type == nodeimage.TypeESP && espIndex == 0 {
			espIndex = part.Number
		}
		res.Partitions = append(res.Partitions, part)
	}
	if espIndex == 0 {
		return res, nil, fmt.Errorf("%s: no EFI system partition", name)
	}
	fs, err := d.GetFilesystem(espIndex)
	if err != nil {
		return res, nil, fmt.Errorf("%s: read ESP (partition %d): %w", name, espIndex, err)
	}
	defer fs.Close()
	info := &ESPInfo{Label: strings.TrimSpace(fs.Label())}
	if err := walkESP(fs, ".", info); err != nil {
		return res, info, fmt.Errorf("%s: list ESP: %w", name, err)
	}
	readText := func(p string) (string, error) {
		b, err := readESPFile(fs, p)
		if err != nil {
			return "", fmt.Errorf("%s: ESP %s: %w", name, p, err)
		}
		return string(b), nil
	}
	if info.LoaderConf, err = readText(nodeimage.LoaderConfPath); err != nil {
		return res, info, err
	}
	info.EntryName = confValue(info.LoaderConf, "default")
	if info.EntryName == "" {
		return res, info, fmt.Errorf("%s: ESP %s names no default entry", name, nodeimage.LoaderConfPath)
	}
	if info.Entry, err = readText(nodeimage.LoaderEntriesDir + "/" + info.EntryName); err != nil {
		return res, info, err
	}
	res.Cmdline = confValue(info.Entry, "options")
	if info.ImageJSON, err = readESPFile(fs, nodeimage.ESPImageJSONPath); err != nil {
		return res, info, fmt.Errorf("%s: ESP %s: %w", name, nodeimage.ESPImageJSONPath, err)
	}
	return res, info, nil
}

// readESPFile reads the file p of the ESP in one read of exactly its size: go-diskfs's FAT
// reader returns bytes past the end of a file when a read starts inside a cluster, which
// io.ReadAll's growing reads do for any file over 512 bytes.
func readESPFile(fs filesystem.FileSystem, p string) ([]byte, error) {
	f, err := fs.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	b := make([]byte, fi.Size())
	if _, err := io.ReadFull(f, b); err != nil {
		return nil, err
	}
	return b, nil
}

func walkESP(fs filesystem.FileSystem, dir string, info *ESPInfo) error {
	entries, err := fs.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("read directory %s: %w", dir, err)
	}
	for _, e := range entries {
		name := e.Name()
		if name == "." || name == ".." {
			continue
		}
		p := path.Join(dir, name) // io/fs style: no leading slash
		if e.IsDir() {
			if err := walkESP(fs, p, info); err != nil {
				return err
			}
			continue
		}
		fi, err := e.Info()
		if err != nil {
			return fmt.Errorf("stat %s: %w", p, err)
		}
		info.Files = append(info.Files, ESPFile{Path: "/" + p, Size: fi.Size()})
	}
	sort.Slice(info.Files, func(i, j int) bool { return info.Files[i].Path < info.Files[j].Path })
	return nil
}

// confValue returns the value of the first "key value" line of a
// systemd-boot configuration text.
func confValue(text, key string) string {
	for _, line := range strings.Split(text, "\n") {
		k, v, _ := strings.Cut(strings.TrimSpace(line), " ")
		if k == key {
			return strings.TrimSpace(v)
		}
	}
	return ""
}
