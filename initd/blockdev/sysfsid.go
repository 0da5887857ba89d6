package blockdev

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// DiskIDs is what udev would know of a whole disk, derived from its sysfs directory for a
// system where udev does not run (stage 1, in the initramfs). Its Links are the names udev's
// persistent-storage rules give the disk in /dev/disk/by-id for the buses kiln runs on, so a
// selector the node's config writes for udev (etcd.volume.serial, etcd.volume.byId) selects
// the same disk before udev runs:
//
//   - virtio-blk: virtio-<serial>
//   - NVMe: nvme-<model>_<serial>, nvme-<model>_<serial>_<nsid> and nvme-<wwid>
//   - ATA behind libata: ata-<model>_<serial> (sysfs holds the first 16 characters of the
//     model only, where udev's ata_id reads all 40: a name udev made matches by its serial)
//   - other SCSI (virtio-scsi): scsi-0<vendor>_<model>_<serial>, scsi-S<vendor>_<model>_<serial>
//   - a SCSI or ATA disk with an NAA world-wide name: wwn-0x<naa> and scsi-3<naa>
//
// The serial of SCSI and ATA disks is read from VPD page 0x80 (device/vpd_pg80).
type DiskIDs struct {
	Serial string
	Model  string
	Links  []string
}

// ReadDiskIDs derives the ids of the whole disk whose sysfs directory is dir
// (/sys/block/vdb). Attributes the kernel does not offer leave their fields empty.
func ReadDiskIDs(dir string) DiskIDs {
	name := filepath.Base(dir)
	attr := func(rel string) string {
		v, _ := readTrim(filepath.Join(dir, rel))
		return v
	}
	var ids DiskIDs
	switch {
	case strings.HasPrefix(name, "vd"):
		ids.Serial = attr("serial")
		ids.add("virtio-", ids.Serial)
	case strings.HasPrefix(name, "nvme"):
		ids.Serial, ids.Model = attr("device/serial"), attr("device/model")
		if ids.Serial != "" && ids.Model != "" {
			ids.add("nvme-", udevName(ids.Model)+"_"+ids.Serial)
			if nsid := attr("nsid"); nsid != "" {
				ids.add("nvme-", udevName(ids.Model)+"_"+ids.Serial+"_"+nsid)
			}
		}
		ids.add("nvme-", attr("wwid"))
	default:
		ids.Serial, ids.Model = vpdSerial(filepath.Join(dir, "device/vpd_pg80")), attr("device/model")
		ids.addSCSI(attr("device/vendor"), attr("device/wwid"))
	}
	return ids
}

// addSCSI adds the names of a SCSI disk (an ATA one when vendor is "ATA").
func (ids *DiskIDs) addSCSI(vendor, wwid string) {
	if ids.Serial != "" && ids.Model != "" {
		model := udevName(ids.Model)
		if vendor == "ATA" {
			ids.add("ata-", model+"_"+ids.Serial)
		} else if vendor != "" {
			v := udevName(vendor) + "_" + model + "_" + ids.Serial
			ids.add("scsi-0", v)
			ids.add("scsi-S", v)
		}
	}
	if naa, ok := strings.CutPrefix(wwid, "naa."); ok {
		ids.add("wwn-0x", strings.ToLower(naa))
		ids.add("scsi-3", strings.ToLower(naa))
	}
}

func (ids *DiskIDs) add(prefix, v string) {
	if v == "" {
		return
	}
	if link := prefix + udevName(v); !slices.Contains(ids.Links, link) {
		ids.Links = append(ids.Links, link)
	}
}

// SelectedBySerial reports whether the disk is the one a ByID selector with this serial
// finds (see SerialLinkMatches).
func (ids DiskIDs) SelectedBySerial(serial string) bool {
	for _, l := range ids.Links {
		if SerialLinkMatches(l, serial) {
			return true
		}
	}
	return false
}

// SelectedByID reports whether the by-id name id (with or without the /dev/disk/by-id/
// prefix) is this disk: one of its Links, or a name udev made of its serial (an ATA name
// with the full 40-character model).
func (ids DiskIDs) SelectedByID(id string) bool {
	id = strings.TrimPrefix(id, ByIDDir+"/")
	if id == "" || isPartitionLink(id) {
		return false
	}
	if slices.Contains(ids.Links, id) {
		return true
	}
	return ids.Serial != "" && SerialLinkMatches(id, udevName(ids.Serial))
}

// udevName makes s safe as a link name the way udev does: outer white space trimmed, each
// run of white space one '_', and a character outside [A-Za-z0-9#+-.:=@_] a '_'.
func udevName(s string) string {
	var b strings.Builder
	for i, f := range strings.Fields(s) {
		if i > 0 {
			b.WriteByte('_')
		}
		for _, c := range f {
			switch {
			case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', strings.ContainsRune("#+-.:=@_", c):
				b.WriteRune(c)
			default:
				b.WriteByte('_')
			}
		}
	}
	return b.String()
}

// vpdSerial reads the unit serial number from a VPD page 0x80 file: a 4-byte header whose
// last byte is the length, then the serial, padded with spaces.
func vpdSerial(file string) string {
	b, err := os.ReadFile(file)
	if err != nil || len(b) < 4 || b[1] != 0x80 {
		return ""
	}
	n := min(int(b[3]), len(b)-4)
	return strings.Trim(string(b[4:4+n]), " \x00")
}

// SerialLinkMatches reports whether a /dev/disk/by-id link name belongs to a whole disk with serial.
func SerialLinkMatches(name, serial string) bool {
	if isPartitionLink(name) {
		return false
	}
	for _, prefix := range []string{"virtio-", "scsi-0QEMU_QEMU_HARDDISK_", "scsi-SQEMU_QEMU_HARDDISK_"} {
		if name == prefix+serial {
			return true
		}
	}
	for _, bus := range []string{"nvme-", "ata-", "scsi-"} {
		if strings.HasPrefix(name, bus) && strings.HasSuffix(name, "_"+serial) {
			return true
		}
	}
	return false
}

// isPartitionLink reports whether a by-id link name ends in -part<N>, udev's suffix for partitions.
func isPartitionLink(name string) bool {
	i := strings.LastIndex(name, "-part")
	if i < 0 || i+5 == len(name) {
		return false
	}
	for _, c := range name[i+5:] {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// ByIDDir is where udev links disks by their serial and bus identity.
const ByIDDir = "/dev/disk/by-id"
