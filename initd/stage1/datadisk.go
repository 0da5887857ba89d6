package stage1

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"github.com/kilnproject/kiln/initd/blockdev"
	"github.com/kilnproject/kiln/initd/etcdvolume"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

// Where a live boot's /var is, as varChoice.kind says.
const (
	varNamed    = "kiln.data.dev" // the disk or partition kiln.data.dev= names
	varDataDisk = "data disk"     // a disk holding only the data partition, from an earlier live boot
	varBlank    = "blank disk"    // the first blank disk, which gets a GPT and the data partition
	varTmpfs    = "tmpfs"         // no disk: /var is in RAM
)

// varChoice is where a live boot puts /var, and why.
type varChoice struct {
	kind string // varNamed, varDataDisk, varBlank or varTmpfs
	// disk is the whole disk chosen; zero for varTmpfs and for a named partition.
	disk blockdev.Disk
	// partition is the node of a named partition; empty otherwise.
	partition string
	// blank is true when disk is blank and needs its GPT and data partition.
	blank bool
	// why says on the console why this one.
	why string
	// skipped lists the disks passed over and why, for the console.
	skipped []string
	// etcdUnseen is the etcd volume's selector when it selects none of the disks and blank
	// disks were passed over for that: one of them may be the etcd volume.
	etcdUnseen string
}

// liveScan is what a live boot sees of the disks.
type liveScan struct {
	// disks are the disks a live boot may use: real disks, not loop devices (the root image
	// is one), RAM disks, optical drives or device-mapper and RAID devices, and not read-only
	// ones nor, unless removable was asked for, removable ones.
	disks []blockdev.Disk
	// skipped says why each other real disk is not among them.
	skipped []string
	// etcd are the kernel names of the disks the node config's etcd volume selects, among
	// all disks; a live boot never puts /var on one.
	etcd []string
}

// liveDisks scans the disks for a live boot's /var; etcd is the node config's etcd volume,
// nil when it names none.
func liveDisks(sysBlock, devDir string, removable bool, etcd *etcdvolume.Selection) (liveScan, error) {
	disks, err := blockdev.ScanDisks(sysBlock, devDir)
	if err != nil {
		return liveScan{}, err
	}
	var s liveScan
	for _, d := range disks {
		if hasAnyPrefix(d.Name, "loop", "ram", "zram", "sr", "fd", "dm-", "md", "nbd") {
			continue
		}
		// udev does not run in the initramfs: the ids come from sysfs, as udev would make them.
		if etcd != nil && etcd.Selects(blockdev.ReadDiskIDs(filepath.Join(sysBlock, d.Name))) {
			s.etcd = append(s.etcd, d.Name)
		}
		switch {
		case sysFlag(sysBlock, d.Name, "ro"):
			s.skipped = append(s.skipped, d.Path+": read-only")
		case !removable && sysFlag(sysBlock, d.Name, "removable"):
			s.skipped = append(s.skipped, d.Path+": removable")
		default:
			s.disks = append(s.disks, d)
		}
	}
	slices.SortFunc(s.disks, func(a, b blockdev.Disk) int { return strings.Compare(a.Name, b.Name) })
	return s, nil
}

func hasAnyPrefix(s string, prefixes ...string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

// sysFlag reports whether the disk's sysfs attribute attr is 1.
func sysFlag(sysBlock, name, attr string) bool {
	n, err := blockdev.ReadSysInt(filepath.Join(sysBlock, name, attr))
	return err == nil && n == 1
}

// chooseVar decides where a live boot's /var goes, writing nothing: the disk or partition
// named (dataDev), else a disk an earlier live boot made its data disk, else the first blank
// disk, else tmpfs. A disk holding anything else is never chosen, nor the disk the node
// config's etcd volume (etcd, nil when it names none) selects; while that selects none of
// the disks, no blank disk is taken either, as it may be the etcd volume.
func chooseVar(sysBlock, devDir, dataDev string, etcd *etcdvolume.Selection) (varChoice, error) {
	scan, err := liveDisks(sysBlock, devDir, dataDev != "", etcd)
	if err != nil {
		return varChoice{}, err
	}
	if dataDev != "" {
		// A disk named on the command line may be removable.
		return chooseNamed(sysBlock, devDir, dataDev, scan, etcd)
	}
	skipped := scan.skipped
	var blank []blockdev.Disk
	for _, d := range scan.disks {
		if slices.Contains(scan.etcd, d.Name) {
			skipped = append(skipped, fmt.Sprintf("%s: the etcd volume (%s)", d.Path, etcd))
			continue
		}
		kind, what := classifyDisk(d)
		switch kind {
		case diskData:
			return varChoice{kind: varDataDisk, disk: d, skipped: skipped,
				why: fmt.Sprintf("%s is the kiln data disk of an earlier live boot", d.Path)}, nil
		case diskBlank:
			blank = append(blank, d)
		default:
			skipped = append(skipped, d.Path+": "+what)
		}
	}
	if etcd != nil && len(scan.etcd) == 0 && len(blank) > 0 {
		for _, d := range blank {
			skipped = append(skipped, fmt.Sprintf("%s: blank, and may be the etcd volume: the node config's %s selects none of the disks", d.Path, etcd))
		}
		return varChoice{kind: varTmpfs, skipped: skipped, etcdUnseen: etcd.String(),
			why: fmt.Sprintf("the node config's %s selects none of the disks, so no blank disk is taken (kiln.data.dev= names one): /var is in RAM and is lost at reboot", etcd)}, nil
	}
	if len(blank) == 0 {
		return varChoice{kind: varTmpfs, skipped: skipped, why: "no blank disk: /var is in RAM and is lost at reboot"}, nil
	}
	why := fmt.Sprintf("%s is the first blank disk: it gets a GPT with one data partition", blank[0].Path)
	if len(blank) > 1 {
		var others []string
		for _, d := range blank[1:] {
			others = append(others, d.Path)
		}
		why += fmt.Sprintf(" (%s stay blank; kiln.data.dev= names the disk to use)", strings.Join(others, ", "))
	}
	return varChoice{kind: varBlank, disk: blank[0], blank: true, skipped: skipped, why: why}, nil
}

type diskKind int

const (
	diskUsed  diskKind = iota // holds something: never touched
	diskData                  // only the data partition, ext4 labelled DataLabel or still blank
	diskBlank                 // no partition table, no signature at either end
)

// classifyDisk says what d holds: for diskUsed, what.
func classifyDisk(d blockdev.Disk) (diskKind, string) {
	if d.Err == nil {
		if len(d.Partitions) != 1 || d.Partitions[0].Name != nodeimage.DataName || d.Partitions[0].Type != nodeimage.TypeLinuxData {
			return diskUsed, fmt.Sprintf("holds a GPT with %d partitions%s", len(d.Partitions), partNames(d.Partitions))
		}
		p := d.Partitions[0]
		fs, label, err := blockdev.ProbeFilesystemAt(d.Path, int64(p.Start)*int64(d.SectorSize))
		switch {
		case err != nil:
			return diskUsed, "cannot be read: " + err.Error()
		case fs == blockdev.FSNone, fs == blockdev.FSExt4 && label == nodeimage.DataLabel:
			return diskData, ""
		case fs == blockdev.FSExt4:
			return diskUsed, fmt.Sprintf("holds a data partition with ext4 labelled %q, not %q", label, nodeimage.DataLabel)
		}
		return diskUsed, "holds a data partition with " + fs
	}
	blank, what, err := blockdev.IsBlank(d.Path)
	switch {
	case err != nil:
		return diskUsed, "cannot be read: " + err.Error()
	case !blank:
		return diskUsed, "holds " + what
	}
	return diskBlank, ""
}

func partNames(parts []blockdev.Partition) string {
	var names []string
	for _, p := range parts {
		names = append(names, fmt.Sprintf("%q", p.Name))
	}
	if len(names) == 0 {
		return ""
	}
	return " (" + strings.Join(names, ", ") + ")"
}
