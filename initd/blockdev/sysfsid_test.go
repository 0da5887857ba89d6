package blockdev

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// vpd80 is a VPD page 0x80 holding serial, padded as drives pad it.
func vpd80(serial string) string {
	s := serial + "    "
	return string([]byte{0, 0x80, 0, byte(len(s))}) + s
}

// TestReadDiskIDs: the by-id names derived from sysfs are the ones udev makes for the same
// disk (the names in byIDCases and in QEMU guests), and each selector form finds the disk.
func TestReadDiskIDs(t *testing.T) {
	tests := []struct {
		name     string
		disk     string
		attrs    map[string]string // sysfs files under /sys/block/<disk>
		links    []string
		serial   string
		byID     []string // names udev may give the disk that must select it
		notByID  []string
		byserial string
	}{
		{
			name: "virtio", disk: "vdb", attrs: map[string]string{"serial": "etcd-main\n"},
			links: []string{"virtio-etcd-main"}, serial: "etcd-main", byserial: "etcd-main",
			byID: []string{"virtio-etcd-main", "/dev/disk/by-id/virtio-etcd-main"}, notByID: []string{"virtio-etcd-main-part1", "virtio-etcd"},
		},
		{
			name: "virtio without serial", disk: "vda", attrs: map[string]string{"serial": "\n"},
			notByID: []string{"virtio-"},
		},
		{
			name: "nvme", disk: "nvme0n1",
			attrs:  map[string]string{"device/serial": "etcd-main    \n", "device/model": "QEMU NVMe Ctrl                          \n", "nsid": "1\n", "wwid": "eui.0011223344556677\n"},
			links:  []string{"nvme-QEMU_NVMe_Ctrl_etcd-main", "nvme-QEMU_NVMe_Ctrl_etcd-main_1", "nvme-eui.0011223344556677"},
			serial: "etcd-main", byserial: "etcd-main", byID: []string{"nvme-eui.0011223344556677"},
		},
		{
			name: "virtio-scsi", disk: "sdb",
			attrs:  map[string]string{"device/vendor": "QEMU    \n", "device/model": "QEMU HARDDISK   \n", "device/vpd_pg80": vpd80("etcd-main")},
			links:  []string{"scsi-0QEMU_QEMU_HARDDISK_etcd-main", "scsi-SQEMU_QEMU_HARDDISK_etcd-main"},
			serial: "etcd-main", byserial: "etcd-main",
		},
		{
			name: "ata with a world-wide name", disk: "sda",
			attrs: map[string]string{"device/vendor": "ATA     \n", "device/model": "Samsung SSD 860 \n",
				"device/vpd_pg80": vpd80("S3Z1NB0K123456X"), "device/wwid": "naa.5002538E40A1B2C3\n"},
			links:  []string{"ata-Samsung_SSD_860_S3Z1NB0K123456X", "wwn-0x5002538e40a1b2c3", "scsi-35002538e40a1b2c3"},
			serial: "S3Z1NB0K123456X", byserial: "S3Z1NB0K123456X",
			// udev's ata_id reads the whole model from the drive.
			byID:    []string{"ata-Samsung_SSD_860_EVO_500GB_S3Z1NB0K123456X", "wwn-0x5002538e40a1b2c3"},
			notByID: []string{"ata-Samsung_SSD_860_EVO_500GB_S3Z1NB0K123456X-part1", "ata-Other_S3Z1NB0K123456"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "block", tt.disk)
			for rel, v := range tt.attrs {
				p := filepath.Join(dir, rel)
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, []byte(v), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			ids := ReadDiskIDs(dir)
			if !slices.Equal(ids.Links, tt.links) || ids.Serial != tt.serial {
				t.Errorf("ReadDiskIDs = links %q serial %q; want %q, %q", ids.Links, ids.Serial, tt.links, tt.serial)
			}
			for _, id := range append(slices.Clone(tt.links), tt.byID...) {
				if !ids.SelectedByID(id) {
					t.Errorf("SelectedByID(%q) = false", id)
				}
			}
			for _, id := range tt.notByID {
				if ids.SelectedByID(id) {
					t.Errorf("SelectedByID(%q) = true", id)
				}
			}
			if tt.byserial != "" && !ids.SelectedBySerial(tt.byserial) {
				t.Errorf("SelectedBySerial(%q) = false", tt.byserial)
			}
			if ids.SelectedBySerial("other") {
				t.Error(`SelectedBySerial("other") = true`)
			}
		})
	}
}
