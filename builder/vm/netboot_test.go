package vm

import (
	"context"
	"slices"
	"strings"
	"testing"
)

// A network boot comes after the disk: the root disk keeps boot index 0, the user NIC gets 1
// and DHCP hands out the boot file; a diskless machine has no disk at all, and a blank extra
// disk never boots.
func TestNetBootArgs(t *testing.T) {
	img := testImage(t)
	const script = "http://10.0.2.2:8080/boot.ipxe"
	for _, tc := range []struct {
		name             string
		cfg              Config
		netdevs, devices []string
		disks            []string
	}{
		{
			name:    "diskless",
			cfg:     Config{NetBoot: &NetBoot{BootFile: script, MAC: "02:00:00:00:00:0A"}},
			netdevs: []string{"user,id=user0,bootfile=" + script},
			devices: []string{"virtio-net-pci,netdev=user0,addr=18,mac=02:00:00:00:00:0a,bootindex=1"},
		},
		{
			name:    "blank disk first, then the network",
			cfg:     Config{Image: img, NetBoot: &NetBoot{BootFile: script}, Disks: []Disk{{Name: "etcd-main", Size: "1M"}}},
			netdevs: []string{"user,id=user0,bootfile=" + script},
			devices: []string{"virtio-net-pci,netdev=user0,addr=18,bootindex=1"},
			disks:   []string{"virtio-blk-pci,drive=root,bootindex=0", "virtio-blk-pci,drive=disk0,serial=etcd-main"},
		},
		{
			name: "NVMe root, own network range, comma in the URL",
			cfg: Config{Image: img, Root: Disk{Bus: BusNVMe, Name: "disk-0"}, Net: "10.0.3.0/24",
				NetBoot: &NetBoot{BootFile: "http://10.0.3.2:8080/boot.ipxe?mac=a,b"}},
			netdevs: []string{"user,id=user0,net=10.0.3.0/24,bootfile=http://10.0.3.2:8080/boot.ipxe?mac=a,,b"},
			devices: []string{"virtio-net-pci,netdev=user0,addr=18,bootindex=1"},
			disks:   []string{"nvme,drive=root,serial=disk-0,bootindex=0"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.Accel = "tcg"
			netdevs, devices, err := nicArgs(t, tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(netdevs, tc.netdevs) || !slices.Equal(devices, tc.devices) {
				t.Errorf("netdevs %q NICs %q\nwant %q %q", netdevs, devices, tc.netdevs, tc.devices)
			}
			disks, err := diskDevices(t, tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(disks, tc.disks) {
				t.Errorf("disks %q, want %q", disks, tc.disks)
			}
		})
	}
}

func TestNetBootArgsErrors(t *testing.T) {
	img := testImage(t)
	nb := &NetBoot{BootFile: "http://10.0.2.2:8080/boot.ipxe"}
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"no image, no network boot", Config{}, "image: none given (only a network or CD-ROM boot can be diskless)"},
		{"diskless with a root bus", Config{NetBoot: nb, Root: Disk{Bus: BusNVMe, Name: "x"}}, "root disk: a diskless machine has none"},
		{"diskless snapshot", Config{NetBoot: nb, Snapshot: true}, "snapshot: a diskless machine"},
		{"relative URL", Config{NetBoot: &NetBoot{BootFile: "boot.ipxe"}}, `network boot file "boot.ipxe": want an http://`},
		{"no host", Config{NetBoot: &NetBoot{BootFile: "http:///boot.ipxe"}}, "names no host"},
		{"space", Config{NetBoot: &NetBoot{BootFile: "http://10.0.2.2/a b"}}, "spaces and quotes"},
		{"too long", Config{NetBoot: &NetBoot{BootFile: "http://10.0.2.2/" + strings.Repeat("a", 120)}}, "at most 127"},
		{"multicast MAC", Config{NetBoot: &NetBoot{BootFile: nb.BootFile, MAC: "01:00:00:00:00:01"}}, "network boot: MAC"},
		{"with a direct kernel boot", Config{Image: img, NetBoot: nb, Boot: &BootFiles{Kernel: "k", Initrd: "i"}}, "exclude each other"},
		{"bad UUID", Config{NetBoot: nb, UUID: "node-1"}, `machine UUID "node-1"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.Accel = "tcg"
			_, err := Args(context.Background(), tc.cfg, t.TempDir())
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

// QEMU builds a diskless network-booting machine, and one whose blank disk boots before the
// network, with the SMBIOS UUID iPXE reports.
func TestQEMUAcceptsNetBootArgs(t *testing.T) {
	img := testImage(t)
	nb := &NetBoot{BootFile: "http://10.0.2.2:8080/boot.ipxe", MAC: "02:00:00:00:00:0a"}
	for name, cfg := range map[string]Config{
		"diskless": {NetBoot: nb, UUID: "8f6c4c1e-0b5a-4d2e-9a57-3f0c2b1d9e11"},
		"disk first": {Image: img, NetBoot: nb, Root: Disk{Name: "disk-0"},
			Disks: []Disk{{Name: "etcd-main", Size: "1M"}}},
	} {
		t.Run(name, func(t *testing.T) {
			cfg.Accel, cfg.MemoryMB = "tcg", 128
			qemuAccepts(t, cfg)
		})
	}
}
