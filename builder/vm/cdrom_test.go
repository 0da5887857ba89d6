package vm

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// testISO is a file standing in for an ISO image (QEMU does not read it to build the machine).
func testISO(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "live.iso")
	if err := os.WriteFile(p, make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// A CD-ROM is a read-only scsi-cd on the virtio-scsi controller, booted first on a diskless
// machine and after the disk otherwise.
func TestCDROMArgs(t *testing.T) {
	img, iso := testImage(t), testISO(t)
	for _, tc := range []struct {
		name      string
		cfg       Config
		wantIndex string
	}{
		{"diskless", Config{CDROM: iso}, "bootindex=0"},
		{"after the disk", Config{Image: img, CDROM: iso}, "bootindex=1"},
		{"beside a SCSI data disk", Config{CDROM: iso, Disks: []Disk{{Name: "data", Size: "1M", Bus: BusSCSI}}}, "bootindex=0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.Accel = "tcg"
			args, err := Args(context.Background(), tc.cfg, t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			line := strings.Join(args, " ")
			if !strings.Contains(line, "if=none,id=cdrom,media=cdrom,readonly=on,format=raw,file="+iso) ||
				!strings.Contains(line, "scsi-cd,bus=scsi0.0,drive=cdrom,"+tc.wantIndex) {
				t.Errorf("args %q lack the CD-ROM with %s", line, tc.wantIndex)
			}
			if n := strings.Count(line, "virtio-scsi-pci,id=scsi0"); n != 1 {
				t.Errorf("%d virtio-scsi controllers, want 1: %q", n, line)
			}
			if tc.cfg.Image == "" && slices.Contains(args, "id=root") {
				t.Errorf("a diskless machine got a root disk: %q", line)
			}
		})
	}
	if _, err := Args(context.Background(), Config{Accel: "tcg", CDROM: filepath.Join(t.TempDir(), "nope.iso")}, t.TempDir()); err == nil || !strings.Contains(err.Error(), "cdrom: stat") {
		t.Errorf("a missing ISO: %v, want a cdrom error", err)
	}
}

// QEMU builds a diskless machine booting a CD-ROM, and one with a disk and a CD-ROM.
func TestQEMUAcceptsCDROMArgs(t *testing.T) {
	img, iso := testImage(t), testISO(t)
	for name, cfg := range map[string]Config{
		"diskless":  {CDROM: iso},
		"with disk": {Image: img, CDROM: iso, Disks: []Disk{{Name: "etcd-main", Size: "1M", Bus: BusSCSI}}},
	} {
		t.Run(name, func(t *testing.T) {
			cfg.Accel, cfg.MemoryMB = "tcg", 128
			qemuAccepts(t, cfg)
		})
	}
}
