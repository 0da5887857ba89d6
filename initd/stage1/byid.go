package stage1

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// byIDNames are the /dev/disk/by-id names udev would give the whole disk name, derived from
// sysfs as udev's rules do, since udev does not run in the initramfs: virtio-<serial> (virtio-blk),
// nvme-<model>_<serial>, ata-<model>_<serial> (SATA behind libata) and
// scsi-0<vendor>_<model>_<serial>, scsi-S<vendor>_<model>_<serial> (SCSI, virtio-scsi).
// White space inside a field becomes one '_', as udev writes it.
func byIDNames(sysBlock, name string) []string {
	dir := filepath.Join(sysBlock, name)
	attr := func(p string) string {
		b, _ := os.ReadFile(filepath.Join(dir, p))
		return udevClean(string(b))
	}
	switch {
	case strings.HasPrefix(name, "vd"):
		if s := attr("serial"); s != "" {
			return []string{"virtio-" + s}
		}
	case strings.HasPrefix(name, "nvme"):
		if m, s := attr("device/model"), attr("device/serial"); m != "" && s != "" {
			return []string{"nvme-" + m + "_" + s}
		}
	case strings.HasPrefix(name, "sd"):
		vendor, model, serial := attr("device/vendor"), attr("device/model"), vpdSerial(filepath.Join(dir, "device/vpd_pg80"))
		switch {
		case serial == "" || model == "":
		case vendor == "ATA":
			return []string{"ata-" + model + "_" + serial}
		default:
			id := vendor + "_" + model + "_" + serial
			return []string{"scsi-0" + id, "scsi-S" + id}
		}
	}
	return nil
}

// udevClean trims s and turns each run of white space into one '_'.
func udevClean(s string) string {
	return strings.Join(strings.Fields(s), "_")
}

// vpdSerial reads the unit serial number from a SCSI VPD page 0x80 file.
func vpdSerial(path string) string {
	b, err := os.ReadFile(path)
	if err != nil || len(b) < 4 || b[1] != 0x80 {
		return ""
	}
	n := min(int(b[2])<<8|int(b[3]), len(b)-4)
	return udevClean(string(b[4 : 4+n]))
}

// errNotFound is wrapped by chooseNamed's error when the named device is not there (yet).
var errNotFound = errors.New("not found")

// chooseNamed resolves kiln.data.dev= (a /dev path, a /dev/disk/by-id name, a by-id name's
// -part<N>) to a whole disk or a partition and checks it may hold /var: a disk must be blank or
// a kiln data disk, a partition blank or ext4.
func chooseNamed(sysBlock, devDir, dataDev string, disks []Disk) (VarChoice, error) {
	kname, part, err := resolveDataDev(sysBlock, dataDev, disks)
	if err != nil {
		return VarChoice{}, fmt.Errorf("kiln.data.dev=%s: %w", dataDev, err)
	}
	if part != 0 {
		node, ok := partitionDevice(sysBlock, devDir, kname, part)
		if !ok {
			return VarChoice{}, fmt.Errorf("kiln.data.dev=%s: partition %d of %s: %w", dataDev, part, kname, errNotFound)
		}
		fs, err := ProbeFilesystem(node)
		if err != nil {
			return VarChoice{}, fmt.Errorf("kiln.data.dev=%s: %w", dataDev, err)
		}
		if fs != FSNone && fs != FSExt4 {
			return VarChoice{}, fmt.Errorf("kiln.data.dev=%s: %s holds %s, not ext4: refusing to put /var on it (wipe it to use it)", dataDev, node, fs)
		}
		return VarChoice{Kind: VarNamed, Partition: node, Why: fmt.Sprintf("kiln.data.dev=%s names %s", dataDev, node)}, nil
	}
	for _, d := range disks {
		if d.Name != kname {
			continue
		}
		kind, what := classifyDisk(d)
		if kind == diskUsed {
			return VarChoice{}, fmt.Errorf("kiln.data.dev=%s: %s %s: refusing to put /var on it (wipe it to use it)", dataDev, d.Path, what)
		}
		return VarChoice{Kind: VarNamed, Disk: d, Blank: kind == diskBlank, Why: fmt.Sprintf("kiln.data.dev=%s names %s", dataDev, d.Path)}, nil
	}
	return VarChoice{}, fmt.Errorf("kiln.data.dev=%s: %s is not a disk stage 1 may use (read-only, or no size)", dataDev, kname)
}

// resolveDataDev finds the kernel name of the disk kiln.data.dev= names and the partition
// number, 0 for the whole disk.
func resolveDataDev(sysBlock, dataDev string, disks []Disk) (string, int, error) {
	if name, ok := strings.CutPrefix(dataDev, "/dev/"); ok && !strings.HasPrefix(name, "disk/by-id/") {
		if _, err := os.Stat(filepath.Join(sysBlock, name)); err == nil {
			return name, 0, nil
		}
		ents, _ := filepath.Glob(filepath.Join(sysBlock, "*", name, "partition"))
		if len(ents) == 1 {
			n, err := readSysInt(ents[0])
			if err == nil {
				return filepath.Base(filepath.Dir(filepath.Dir(ents[0]))), int(n), nil
			}
		}
		return "", 0, fmt.Errorf("no disk or partition %s: %w", dataDev, errNotFound)
	}
	id := strings.TrimPrefix(dataDev, "/dev/disk/by-id/")
	part := 0
	if i := strings.LastIndex(id, "-part"); i > 0 {
		if n, err := strconv.Atoi(id[i+5:]); err == nil && n > 0 {
			id, part = id[:i], n
		}
	}
	var seen []string
	for _, d := range disks {
		names := byIDNames(sysBlock, d.Name)
		for _, n := range names {
			if n == id {
				return d.Name, part, nil
			}
		}
		seen = append(seen, fmt.Sprintf("%s (%s)", d.Path, strings.Join(names, ", ")))
	}
	return "", 0, fmt.Errorf("no disk has the by-id name %s (disks: %s): %w", id, strings.Join(seen, "; "), errNotFound)
}
