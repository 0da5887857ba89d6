package qemutests

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"

	diskfs "github.com/diskfs/go-diskfs"
	"github.com/diskfs/go-diskfs/disk"
	"github.com/diskfs/go-diskfs/filesystem"
	"github.com/diskfs/go-diskfs/filesystem/iso9660"
)

// makeCIDATA writes an ISO9660 volume labelled CIDATA holding files (cloud-init's NoCloud
// layout: user-data, meta-data), as a user would attach to a VM or burn for a bare-metal node.
func makeCIDATA(dir string, files map[string][]byte) (string, error) {
	path := filepath.Join(dir, "cidata.img")
	var size int64 = 1 << 20
	for _, b := range files {
		size += int64(len(b)) + 2048
	}
	d, err := diskfs.Create(path, size, diskfs.SectorSize(2048))
	if err != nil {
		return "", err
	}
	defer d.Close()
	d.LogicalBlocksize = 2048
	fs, err := d.CreateFilesystem(disk.FilesystemSpec{Partition: 0, FSType: filesystem.TypeISO9660, VolumeLabel: "CIDATA"})
	if err != nil {
		return "", fmt.Errorf("cidata: %w", err)
	}
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		f, err := fs.OpenFile("/"+n, os.O_CREATE|os.O_RDWR)
		if err != nil {
			return "", fmt.Errorf("cidata %s: %w", n, err)
		}
		if _, err := f.Write(files[n]); err != nil {
			return "", fmt.Errorf("cidata %s: %w", n, err)
		}
	}
	iso, ok := fs.(*iso9660.FileSystem)
	if !ok {
		return "", fmt.Errorf("cidata: not an ISO9660 filesystem")
	}
	if err := iso.Finalize(iso9660.FinalizeOptions{RockRidge: true, Joliet: true, VolumeIdentifier: "CIDATA"}); err != nil {
		return "", fmt.Errorf("cidata: %w", err)
	}
	return path, nil
}
