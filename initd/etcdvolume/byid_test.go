package etcdvolume

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kilnproject/kiln/initd/etcdvolume/etcdvolumetest"
)

// byIDCase is a /dev/disk/by-id tree and a selector, and the device or error the selector finds.
type byIDCase struct {
	name    string
	links   map[string]string // by-id name -> device
	finder  ByID
	want    string // device; "" with wantErr
	wantErr string
}

var byIDCases = []byIDCase{
	{
		name:   "virtio serial",
		links:  map[string]string{"virtio-etcd-main": "vdb", "virtio-etcd-main-part1": "vdb1", "virtio-root": "vda"},
		finder: ByID{Serial: "etcd-main"},
		want:   "vdb",
	},
	{
		name:   "virtio-scsi serial",
		links:  map[string]string{"scsi-0QEMU_QEMU_HARDDISK_etcd-main": "sdb", "scsi-SQEMU_QEMU_HARDDISK_etcd-main": "sdb"},
		finder: ByID{Serial: "etcd-main"},
		want:   "sdb",
	},
	{
		name:   "nvme serial",
		links:  map[string]string{"nvme-QEMU_NVMe_Ctrl_etcd-main": "nvme1n1", "nvme-QEMU_NVMe_Ctrl_etcd-main-part1": "nvme1n1p1", "nvme-eui.0011": "nvme1n1"},
		finder: ByID{Serial: "etcd-main"},
		want:   "nvme1n1",
	},
	{
		name:    "only a partition carries the serial",
		links:   map[string]string{"virtio-etcd-main-part1": "vdb1"},
		finder:  ByID{Serial: "etcd-main", Timeout: 300 * time.Millisecond, Poll: 50 * time.Millisecond},
		wantErr: "waiting 300ms for a disk with serial etcd-main",
	},
	{
		name:    "a serial is not a prefix match",
		links:   map[string]string{"virtio-etcd-main": "vdb"},
		finder:  ByID{Serial: "etcd", Timeout: 200 * time.Millisecond, Poll: 50 * time.Millisecond},
		wantErr: "for a disk with serial etcd in",
	},
	{
		name:    "the same serial on two disks",
		links:   map[string]string{"virtio-etcd-main": "vdb", "scsi-0QEMU_QEMU_HARDDISK_etcd-main": "sda"},
		finder:  ByID{Serial: "etcd-main"},
		wantErr: "serial etcd-main matches 2 disks",
	},
	{
		name:   "by-id name",
		links:  map[string]string{"wwn-0x5000c500a1b2c3d4": "sdc"},
		finder: ByID{ID: "wwn-0x5000c500a1b2c3d4"},
		want:   "sdc",
	},
	{
		name:   "by-id path",
		links:  map[string]string{"wwn-0x5000c500a1b2c3d4": "sdc"},
		finder: ByID{ID: "/dev/disk/by-id/wwn-0x5000c500a1b2c3d4"},
		want:   "sdc",
	},
	{name: "neither", finder: ByID{}, wantErr: "set exactly one of serial and id"},
	{name: "both", finder: ByID{Serial: "a", ID: "b"}, wantErr: "set exactly one of serial and id"},
	{name: "glob in serial", finder: ByID{Serial: "etcd*"}, wantErr: "glob character"},
	{name: "id with a slash", finder: ByID{ID: "/dev/vdb"}, wantErr: `"/dev/vdb" is not a name in /dev/disk/by-id`},
}

func TestByID(t *testing.T) {
	for _, tt := range byIDCases {
		t.Run(tt.name, func(t *testing.T) {
			f := etcdvolumetest.NewDev(t)
			for name, dev := range tt.links {
				f.Link(name, dev)
			}
			tt.finder.DevDir = f.ByID
			got, err := tt.finder.Find(context.Background())
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Find = %q, %v; want an error with %q", got, err, tt.wantErr)
				}
				return
			}
			if err != nil || got != filepath.Join(f.Devs, tt.want) {
				t.Fatalf("Find = %q, %v; want %s", got, err, filepath.Join(f.Devs, tt.want))
			}
		})
	}
}

// TestByIDWaitsForUdev: the link appears while Find waits.
func TestByIDWaitsForUdev(t *testing.T) {
	f := etcdvolumetest.NewDev(t)
	go func() {
		time.Sleep(300 * time.Millisecond)
		f.Link("virtio-etcd-main", "vdb")
	}()
	start := time.Now()
	got, err := ByID{Serial: "etcd-main", DevDir: f.ByID, Poll: 20 * time.Millisecond}.Find(context.Background())
	if err != nil || got != filepath.Join(f.Devs, "vdb") {
		t.Fatalf("Find = %q, %v", got, err)
	}
	if d := time.Since(start); d < 250*time.Millisecond {
		t.Errorf("found after %s, before the link existed", d)
	}

	// A cancelled context ends the wait.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = ByID{Serial: "other", DevDir: f.ByID}.Find(ctx)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Find with a cancelled context: %v", err)
	}
}
