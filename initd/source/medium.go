package source

import (
	"context"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"

	"github.com/diskfs/go-diskfs/filesystem"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

// ISOMedium reads the config from the iso output's own volume, labelled nodeimage.ISOLabel,
// that `kiln iso add-config` put it in: the file nodeimage.ISOConfigPath. It serves a live boot
// from the ISO and a disk installed from it while the ISO is still in the drive. As CIDATA, the
// volume is read in place with go-diskfs, never mounted. A kiln ISO without the file has no
// config.
type ISOMedium struct {
	// ByLabel is the directory of label symlinks; "" means /dev/disk/by-label.
	ByLabel string
}

// Name implements Provider.
func (ISOMedium) Name() string { return "iso-medium" }

func (m ISOMedium) device() string {
	dir := m.ByLabel
	if dir == "" {
		dir = "/dev/disk/by-label"
	}
	return filepath.Join(dir, nodeimage.ISOLabel)
}

// Probe implements Provider: true when the volume exists and holds the config file.
func (m ISOMedium) Probe(context.Context) bool {
	fsys, closeFS, err := openVolume(m.device())
	if err != nil {
		return false
	}
	defer closeFS()
	_, err = fsys.Stat(strings.TrimPrefix(nodeimage.ISOConfigPath, "/"))
	return err == nil
}

// Fetch implements Provider.
func (m ISOMedium) Fetch(context.Context) ([]byte, error) {
	dev := m.device()
	fsys, closeFS, err := openVolume(dev)
	if err != nil {
		return nil, err
	}
	defer closeFS()
	name := strings.TrimPrefix(nodeimage.ISOConfigPath, "/")
	fi, err := fsys.Stat(name)
	if err != nil {
		return nil, fmt.Errorf("%s on %s: %w", nodeimage.ISOConfigPath, dev, err)
	}
	return readVolumeFile(fsys, name, fi, nodeimage.ISOConfigPath+" on "+dev)
}

// readVolumeFile reads the config file name, whose entry is fi, from a volume's filesystem;
// what names it in errors. A directory, or a file the filesystem says is over MaxConfigSize, is
// refused; the size claimed is not trusted, reading stops at the cap anyway.
func readVolumeFile(fsys filesystem.FileSystem, name string, fi fs.FileInfo, what string) ([]byte, error) {
	if fi.IsDir() {
		return nil, fmt.Errorf("%s is a directory", what)
	}
	if fi.Size() > MaxConfigSize {
		return nil, &TooLargeError{What: what, Limit: MaxConfigSize}
	}
	f, err := fsys.Open(name)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", what, err)
	}
	defer f.Close()
	return ReadLimited(f, MaxConfigSize, what)
}
