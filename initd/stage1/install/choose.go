package install

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/kilnproject/kiln/initd/blockdev"
)

// Refusing to write over data, and what to do about it.
const (
	refuseData = "refusing to write over it without kiln.install.wipe=1"
	bootOrder  = "A kiln disk installed earlier holds a GPT: set the firmware's boot order to disk first, network second, " +
		"so that an installed machine boots its disk instead of being offered for installation again"
)

// choose returns the disk p.dev names, or auto's choice, and checks that the installer may
// write an image of at least minSize bytes to it.
func choose(disks []hostDisk, p params, minSize int64) (hostDisk, error) {
	var (
		d   hostDisk
		err error
	)
	switch {
	case p.dev == auto:
		return chooseAuto(disks, p.wipe, minSize)
	case strings.HasPrefix(p.dev, "/"):
		d, err = byPath(disks, p.dev)
	default:
		d, err = byID(disks, p.dev)
	}
	if err != nil {
		return hostDisk{}, err
	}
	what := fmt.Sprintf("kiln.%s=%s: %s", paramDev, p.dev, d)
	switch {
	case d.etcd != "":
		return hostDisk{}, fmt.Errorf("%s is the etcd volume (%s): %w; the installer never writes it", what, d.etcd, errNoTarget)
	case d.medium:
		return hostDisk{}, fmt.Errorf("%s holds the boot medium the image is read from: %w; the installer never writes it", what, errNoTarget)
	case d.readOnly:
		return hostDisk{}, fmt.Errorf("%s is read-only: %w", what, errNoTarget)
	case d.size < minSize:
		return hostDisk{}, fmt.Errorf("%s is smaller than the image (at least %d MiB): %w", what, (minSize+(1<<20)-1)>>20, errNoTarget)
	case len(d.holds) > 0 && !p.wipe:
		return hostDisk{}, fmt.Errorf("%s %s; %s (%w). %s", what, d.holding(), refuseData, errNoTarget, bootOrder)
	}
	return d, nil
}

// byPath finds the whole disk at path among disks. A regular file (a disk image) is taken as
// it is.
func byPath(disks []hostDisk, path string) (hostDisk, error) {
	st, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return hostDisk{}, missing(fmt.Errorf("kiln.%s=%s: no such device (%w). Disks seen:%s", paramDev, path, errNoTarget, listDisks(disks, -1)))
	}
	if err != nil {
		return hostDisk{}, fmt.Errorf("kiln.%s=%s: %w", paramDev, path, err)
	}
	if st.Mode().IsRegular() {
		holds, err := blockdev.ProbeDisk(path)
		if err != nil {
			return hostDisk{}, err
		}
		return hostDisk{name: filepath.Base(path), path: path, size: st.Size(), sectorSize: 512, holds: holds}, nil
	}
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return hostDisk{}, fmt.Errorf("kiln.%s=%s: %w", paramDev, path, err)
	}
	for _, d := range disks {
		if d.path == real || d.path == path {
			return d, nil
		}
	}
	return hostDisk{}, fmt.Errorf("kiln.%s=%s: not a whole disk (a partition, or not a block device); %w. Disks seen:%s",
		paramDev, path, errNoTarget, listDisks(disks, -1))
}

// byID finds the one disk that the /dev/disk/by-id name id is.
func byID(disks []hostDisk, id string) (hostDisk, error) {
	var found []hostDisk
	for _, d := range disks {
		if d.ids.SelectedByID(id) {
			found = append(found, d)
		}
	}
	switch len(found) {
	case 1:
		return found[0], nil
	case 0:
		return hostDisk{}, missing(fmt.Errorf("kiln.%s=%s: no disk has this /dev/disk/by-id name; %w. Disks seen:%s",
			paramDev, id, errNoTarget, listDisks(disks, -1)))
	}
	return hostDisk{}, fmt.Errorf("kiln.%s=%s: %d disks have this name; %w. Disks seen:%s",
		paramDev, id, len(found), errNoTarget, listDisks(found, -1))
}

// chooseAuto takes the only empty disk auto may use. With wipe, and no empty disk, it takes
// the only disk auto may use even though it holds data.
func chooseAuto(disks []hostDisk, wipe bool, minSize int64) (hostDisk, error) {
	var usable, empty []hostDisk
	for _, d := range disks {
		if d.exclusion(minSize) != "" {
			continue
		}
		usable = append(usable, d)
		if len(d.holds) == 0 {
			empty = append(empty, d)
		}
	}
	prefix := fmt.Sprintf("kiln.%s=%s", paramDev, auto)
	switch {
	case len(empty) == 1:
		return empty[0], nil
	case len(empty) > 1:
		return hostDisk{}, fmt.Errorf("%s: %d empty disks, and auto takes only the one: %w; name one with kiln.%s=. Disks seen:%s",
			prefix, len(empty), errNoTarget, paramDev, listDisks(disks, minSize))
	case wipe && len(usable) == 1:
		return usable[0], nil
	case wipe && len(usable) > 1:
		return hostDisk{}, fmt.Errorf("%s with kiln.%s=1: no empty disk and %d disks holding data: %w; name one with kiln.%s=. Disks seen:%s",
			prefix, paramWipe, len(usable), errNoTarget, paramDev, listDisks(disks, minSize))
	case len(usable) > 0:
		return hostDisk{}, missing(fmt.Errorf("%s: no empty disk (%w): every disk auto may use holds data; %s. %s. Disks seen:%s",
			prefix, errNoTarget, refuseData, bootOrder, listDisks(disks, minSize)))
	}
	return hostDisk{}, missing(fmt.Errorf("%s: no disk auto may use: %w. Disks seen:%s", prefix, errNoTarget, listDisks(disks, minSize)))
}
