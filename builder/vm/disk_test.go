package vm

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// diskDevices returns the -device values of Args that attach disks or their controller.
func diskDevices(t *testing.T, cfg Config) ([]string, error) {
	t.Helper()
	args, err := Args(context.Background(), cfg, t.TempDir())
	if err != nil {
		return nil, err
	}
	var devs []string
	for i := 0; i+1 < len(args); i++ {
		if args[i] != "-device" {
			continue
		}
		for _, p := range []string{"virtio-blk-pci,", "nvme,", "scsi-hd,", "virtio-scsi-pci,"} {
			if strings.HasPrefix(args[i+1], p) {
				devs = append(devs, args[i+1])
			}
		}
	}
	return devs, nil
}

// The root disk and the extra disks sit on the bus asked for, with the serial (and SCSI
// strings) the guest's udev rules name them by: EBS volumes as NVMe controllers, GCE
// persistent disks as Google PersistentDisk SCSI disks.
func TestDiskBuses(t *testing.T) {
	img := testImage(t)
	for _, tc := range []struct {
		name string
		cfg  Config
		want []string
	}{
		{
			name: "virtio by default",
			cfg:  Config{Disks: []Disk{{Name: "etcd-main", Size: "1M"}}},
			want: []string{"virtio-blk-pci,drive=root,bootindex=0", "virtio-blk-pci,drive=disk0,serial=etcd-main"},
		},
		{
			name: "EC2: NVMe root and volume",
			cfg: Config{Root: Disk{Bus: BusNVMe, Name: "vol0aaaaaaaaaaaaaaaa"},
				Disks: []Disk{{Name: "vol0123456789abcdef0", Size: "1M", Bus: BusNVMe}}},
			want: []string{"nvme,drive=root,serial=vol0aaaaaaaaaaaaaaaa,bootindex=0", "nvme,drive=disk0,serial=vol0123456789abcdef0"},
		},
		{
			name: "GCE: SCSI root and persistent disk share one controller",
			cfg: Config{Root: Disk{Bus: BusSCSI, Name: "persistent-disk-0", Vendor: "Google", Product: "PersistentDisk"},
				Disks: []Disk{{Name: "etcd-main", Size: "1M", Bus: BusSCSI, Vendor: "Google", Product: "PersistentDisk"}, {Name: "plain", Size: "1M"}}},
			want: []string{
				"virtio-scsi-pci,id=scsi0",
				"scsi-hd,bus=scsi0.0,drive=root,vendor=Google,product=PersistentDisk,serial=persistent-disk-0,bootindex=0",
				"scsi-hd,bus=scsi0.0,drive=disk0,vendor=Google,product=PersistentDisk,serial=etcd-main",
				"virtio-blk-pci,drive=disk1,serial=plain",
			},
		},
		{
			name: "SCSI extra disk with QEMU's strings",
			cfg:  Config{Disks: []Disk{{Name: "d", Size: "1M", Bus: BusSCSI}}},
			want: []string{"virtio-scsi-pci,id=scsi0", "virtio-blk-pci,drive=root,bootindex=0", "scsi-hd,bus=scsi0.0,drive=disk0,serial=d"},
		},
		{
			name: "direct kernel boot: no boot index",
			cfg:  Config{Root: Disk{Bus: BusNVMe, Name: "root"}, Boot: &BootFiles{Kernel: "k", Initrd: "i"}},
			want: []string{"nvme,drive=root,serial=root"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			cfg.Image, cfg.Accel = img, "tcg"
			got, err := diskDevices(t, cfg)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("devices\n got %q\nwant %q", got, tc.want)
			}
		})
	}
}

func TestDiskBusErrors(t *testing.T) {
	img := testImage(t)
	for _, tc := range []struct {
		name, want string
		cfg        Config
	}{
		{"NVMe root without serial", "root disk: an NVMe disk needs a serial", Config{Root: Disk{Bus: BusNVMe}}},
		{"NVMe serial too long", "disk vol0123456789abcdef01: an NVMe disk needs a serial of 1 to 20 bytes",
			Config{Disks: []Disk{{Name: "vol0123456789abcdef01", Size: "1M", Bus: BusNVMe}}}},
		{"unknown bus", `disk d: bus "ide"`, Config{Disks: []Disk{{Name: "d", Size: "1M", Bus: "ide"}}}},
		{"vendor off SCSI", "disk d: vendor and product need bus scsi", Config{Disks: []Disk{{Name: "d", Size: "1M", Vendor: "Google"}}}},
		{"vendor too long", `root disk: SCSI vendor "GoogleInc"`, Config{Root: Disk{Bus: BusSCSI, Vendor: "GoogleInc"}}},
		{"comma in product", "may not contain ','", Config{Root: Disk{Bus: BusSCSI, Product: "a,b"}}},
		{"root with a path", "root disk: Size and Path must be empty", Config{Root: Disk{Path: "/x"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			cfg.Image, cfg.Accel = img, "tcg"
			work := t.TempDir()
			_, err := Args(context.Background(), cfg, work)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
			// A refused disk is not created.
			if m, _ := filepath.Glob(filepath.Join(work, "*.qcow2")); len(m) > 0 {
				t.Errorf("left behind %v", m)
			}
		})
	}
}

// QEMU builds machines with the root disk on NVMe (EC2) and on virtio-scsi (GCE).
func TestQEMUAcceptsDiskArgs(t *testing.T) {
	img := testImage(t)
	for name, cfg := range map[string]Config{
		"nvme": {Root: Disk{Bus: BusNVMe, Name: "vol0aaaaaaaaaaaaaaaa"},
			Disks: []Disk{{Name: "vol0123456789abcdef0", Size: "1M", Bus: BusNVMe}}},
		"scsi": {Root: Disk{Bus: BusSCSI, Name: "persistent-disk-0", Vendor: "Google", Product: "PersistentDisk"},
			Disks: []Disk{{Name: "etcd-main", Size: "1M", Bus: BusSCSI, Vendor: "Google", Product: "PersistentDisk"}}},
	} {
		t.Run(name, func(t *testing.T) {
			cfg.Image, cfg.Accel, cfg.MemoryMB, cfg.Offline = img, "tcg", 128, true
			qemuAccepts(t, cfg)
		})
	}
}
