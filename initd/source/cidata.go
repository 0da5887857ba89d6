package source

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/diskfs/go-diskfs/backend/file"
	"github.com/diskfs/go-diskfs/filesystem/iso9660"

	diskfs "github.com/diskfs/go-diskfs"
	"github.com/diskfs/go-diskfs/filesystem"
)

// CIDATA reads the config from a volume labelled CIDATA or cidata (cloud-init NoCloud) or
// config-2 (OpenStack config drive): the file user-data, else openstack/latest/user_data.
//
// The volume is never mounted: its ISO9660 (with Rock Ridge or Joliet names) or FAT
// (FAT12, FAT16 or FAT32, as mkfs.vfat picks by size) filesystem is read in place with
// go-diskfs, so the first boot needs no kernel filesystem modules and leaves no mount
// behind. A volume without either file (meta-data only, say) has no config; a volume that
// cannot be read is an error.
type CIDATA struct {
	// ByLabel is the directory of label symlinks; "" means /dev/disk/by-label.
	ByLabel string
}

// Name implements Provider.
func (CIDATA) Name() string { return "cidata" }

func (c CIDATA) device() (string, bool) {
	dir := c.ByLabel
	if dir == "" {
		dir = "/dev/disk/by-label"
	}
	// The NoCloud labels, then the OpenStack config drive's.
	for _, label := range []string{"CIDATA", "cidata", "config-2"} {
		p := filepath.Join(dir, label)
		if _, err := os.Stat(p); err == nil {
			return p, true
		}
	}
	return "", false
}

// Probe implements Provider: true when a volume with one of the labels exists.
func (c CIDATA) Probe(context.Context) bool {
	_, ok := c.device()
	return ok
}

// Fetch implements Provider.
func (c CIDATA) Fetch(context.Context) ([]byte, error) {
	dev, ok := c.device()
	if !ok {
		return nil, errors.New("no CIDATA volume")
	}
	fsys, closeFS, err := openVolume(dev)
	if err != nil {
		return nil, err
	}
	defer closeFS()
	return readUserData(fsys, dev)
}

// openVolume reads the filesystem on dev. A block device reports its own sector size (512
// on virtio and SCSI disks), which go-diskfs then also takes as ISO9660's block size and
// fails; so when the generic probe finds nothing, ISO9660 is read with its own 2048-byte
// blocks.
func openVolume(dev string) (filesystem.FileSystem, func(), error) {
	d, err := diskfs.Open(dev, diskfs.WithOpenMode(diskfs.ReadOnly))
	if err != nil {
		return nil, nil, fmt.Errorf("open %s: %w", dev, err)
	}
	fsys, err := d.GetFilesystem(0)
	if err == nil {
		return fsys, func() { fsys.Close(); d.Close() }, nil
	}
	d.Close()
	probeErr := fmt.Errorf("read filesystem on %s (want ISO9660 or FAT): %w", dev, err)
	b, err := file.OpenFromPath(dev, true)
	if err != nil {
		return nil, nil, probeErr
	}
	f, err := os.Open(dev)
	if err != nil {
		b.Close()
		return nil, nil, probeErr
	}
	size, err := f.Seek(0, io.SeekEnd)
	f.Close()
	if err != nil {
		b.Close()
		return nil, nil, probeErr
	}
	iso, err := iso9660.Read(b, size, 0, 2048)
	if err != nil {
		b.Close()
		return nil, nil, probeErr
	}
	return iso, func() { iso.Close(); b.Close() }, nil
}

func readUserData(fsys filesystem.FileSystem, dev string) ([]byte, error) {
	// NoCloud's file, then the config drive's.
	for _, name := range []string{"user-data", "openstack/latest/user_data"} {
		fi, err := fsys.Stat(name)
		if err != nil {
			// Each filesystem reports a missing file its own way; treat any failure to
			// find the entry as absent and any failure to read it below as an error.
			continue
		}
		return readVolumeFile(fsys, name, fi, name+" on "+dev)
	}
	return nil, nil
}
