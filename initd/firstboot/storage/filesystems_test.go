package storage

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kilnproject/kiln/internal/testkit"
)

const fsUUID = "4c9e2b5a-8f3d-4e1b-9a6c-2d7f0e5b1c33"

// Ignition's reuse rules: a filesystem is kept only when type, label and UUID (those
// given) match; anything else is refused unless wipeFilesystem.
func TestFilesystems(t *testing.T) {
	needTools(t, "mkfs.xfs", "mkfs.vfat", "mkswap")
	tests := []struct {
		name     string
		existing []string // mkfs command laying out the device first, DEV for it
		fs       string   // the storage.filesystems entry
		wantErr  string
		// wantType, wantLabel: what the device holds afterwards; wantKept: the existing
		// filesystem's UUID is unchanged.
		wantType, wantLabel string
		wantKept            bool
		wantUnit            string
	}{
		{name: "blank: ext4 with label and uuid, mounted by a unit",
			fs:       `{"device":"DEV","format":"ext4","label":"data","uuid":"` + fsUUID + `","path":"/var/lib/containerd","mountOptions":["noatime"]}`,
			wantType: "ext4", wantLabel: "data", wantUnit: `var-lib-containerd.mount`},
		{name: "blank: xfs", fs: `{"device":"DEV","format":"xfs","label":"x"}`, wantType: "xfs", wantLabel: "x"},
		{name: "blank: vfat with a volume id", fs: `{"device":"DEV","format":"vfat","label":"FAT","uuid":"1234abcd","path":"/srv/fat"}`,
			wantType: "vfat", wantLabel: "FAT", wantUnit: "srv-fat.mount"},
		{name: "blank: swap", fs: `{"device":"DEV","format":"swap","label":"sw"}`, wantType: "swap", wantLabel: "sw"},
		{name: "same type and label: kept", existing: []string{"mkfs.ext4", "-q", "-L", "data", "DEV"},
			fs: `{"device":"DEV","format":"ext4","label":"data"}`, wantType: "ext4", wantLabel: "data", wantKept: true},
		{name: "same type, no label asked: kept", existing: []string{"mkfs.xfs", "-q", "-L", "old", "DEV"},
			fs: `{"device":"DEV","format":"xfs"}`, wantType: "xfs", wantLabel: "old", wantKept: true},
		{name: "same type and uuid: kept", existing: []string{"mkfs.ext4", "-q", "-U", fsUUID, "DEV"},
			fs: `{"device":"DEV","format":"ext4","uuid":"` + strings.ToUpper(fsUUID) + `"}`, wantType: "ext4", wantKept: true},
		{name: "other type: refused", existing: []string{"mkfs.xfs", "-q", "-L", "old", "DEV"},
			fs:      `{"device":"DEV","format":"ext4","label":"data"}`,
			wantErr: `storage.filesystems[0].device: DEV holds an xfs filesystem (label "old", UUID `, wantType: "xfs", wantLabel: "old", wantKept: true},
		{name: "other label: refused", existing: []string{"mkfs.ext4", "-q", "-L", "old", "DEV"},
			fs:      `{"device":"DEV","format":"ext4","label":"data"}`,
			wantErr: `not labelled "data"; refusing to format it (wipeFilesystem: true erases it)`, wantType: "ext4", wantLabel: "old", wantKept: true},
		{name: "other uuid: refused", existing: []string{"mkfs.ext4", "-q", "DEV"},
			fs:      `{"device":"DEV","format":"ext4","uuid":"` + fsUUID + `"}`,
			wantErr: "not UUID " + fsUUID, wantType: "ext4", wantKept: true},
		{name: "a partition table: refused", existing: []string{"sgdisk", "--new=1:0:+1M", "DEV"},
			fs:      `{"device":"DEV","format":"ext4"}`,
			wantErr: "DEV holds a partition table (gpt), not ext4", wantKept: true},
		{name: "other label, wipeFilesystem: formatted", existing: []string{"mkfs.ext4", "-q", "-L", "old", "DEV"},
			fs: `{"device":"DEV","format":"ext4","label":"data","wipeFilesystem":true}`, wantType: "ext4", wantLabel: "data"},
		{name: "other type, wipeFilesystem: formatted", existing: []string{"mkfs.ext4", "-q", "DEV"},
			fs: `{"device":"DEV","format":"xfs","wipeFilesystem":true}`, wantType: "xfs"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dev := loopDisk(t, 300)
			if tc.existing != nil {
				args := make([]string, len(tc.existing))
				for i, a := range tc.existing {
					args[i] = strings.ReplaceAll(a, "DEV", dev)
				}
				testkit.Run(t, args[0], args[1:]...)
			}
			before := probe(t, dev)
			o := testOptions(t)
			cfg := storageOf(t, `{"filesystems":[`+strings.ReplaceAll(tc.fs, "DEV", dev)+`]}`)
			wantErr := strings.ReplaceAll(tc.wantErr, "DEV", dev)
			changed := applyWant(t, cfg, o, wantErr)
			after := probe(t, dev)
			if tc.wantType != "" && (after.Type != tc.wantType || after.Label != tc.wantLabel) {
				t.Errorf("device holds %s, want %s labelled %q", after, tc.wantType, tc.wantLabel)
			}
			if tc.wantKept != (after.UUID == before.UUID && after.Type == before.Type && after.PTType == before.PTType && !before.Blank) {
				t.Errorf("UUID %s before, %s after; want kept = %v", before.UUID, after.UUID, tc.wantKept)
			}
			if wantErr != "" {
				if len(changed) > 0 {
					t.Errorf("a refused run changed %q", changed)
				}
				return
			}
			if tc.wantUnit != "" {
				unit, err := os.ReadFile(filepath.Join(o.Root, "etc/systemd/system", tc.wantUnit))
				if err != nil {
					t.Fatal(err)
				}
				if !strings.Contains(string(unit), "What=/dev/disk/by-uuid/"+after.UUID+"\n") {
					t.Errorf("unit %s does not mount by the UUID %s:\n%s", tc.wantUnit, after.UUID, unit)
				}
				if _, err := os.Lstat(filepath.Join(o.Root, "etc/systemd/system/local-fs.target.wants", tc.wantUnit)); err != nil {
					t.Errorf("unit not enabled: %v", err)
				}
			}
			if tc.wantType == "swap" {
				if _, err := os.Stat(filepath.Join(o.Root, "etc/systemd/system/swap.target.wants")); err != nil {
					t.Errorf("swap unit not enabled: %v", err)
				}
			}
			again, err := applyCfg(t, cfg, o)
			if err != nil || len(again) > 0 {
				t.Errorf("second Apply = %q, %v; want no change", again, err)
			}
			if u := probe(t, dev).UUID; u != after.UUID {
				t.Errorf("second Apply changed the UUID from %s to %s", after.UUID, u)
			}
		})
	}
}

// wipeFilesystem formats once: what kiln formatted for the entry is kept by later runs.
func TestWipeFilesystemOnce(t *testing.T) {
	needTools(t)
	dev := loopDisk(t, 64)
	testkit.Run(t, "mkfs.ext4", "-q", "-L", "someone-elses", dev)
	o := testOptions(t)
	cfg := storageOf(t, `{"filesystems":[{"device":"`+dev+`","format":"ext4","wipeFilesystem":true}]}`)
	if changed, err := applyCfg(t, cfg, o); err != nil || len(changed) == 0 {
		t.Fatalf("Apply = %q, %v; want the filesystem replaced", changed, err)
	}
	first := probe(t, dev)
	if first.Label != "" {
		t.Errorf("after wipeFilesystem the label is %q, want none", first.Label)
	}
	if changed, err := applyCfg(t, cfg, o); err != nil || len(changed) > 0 {
		t.Fatalf("second Apply = %q, %v; want no change", changed, err)
	}
	if got := probe(t, dev).UUID; got != first.UUID {
		t.Errorf("second Apply reformatted: UUID %s, then %s", first.UUID, got)
	}
}

// Nothing is written to the boot disk, or to a device in use, with or without wipe.
func TestRefusesBootDiskAndMounted(t *testing.T) {
	needTools(t)
	boot := loopDisk(t, 64)
	testkit.Run(t, "sgdisk", "--new=1:0:+16M", "--new=2:0:0", boot)
	testkit.Run(t, "partx", "-u", boot)
	testkit.Run(t, "mkfs.ext4", "-q", "-L", "root", partDev(boot, 1))
	root := t.TempDir()
	mountT(t, partDev(boot, 1), root)
	other := loopDisk(t, 64)
	testkit.Run(t, "mkfs.ext4", "-q", "-L", "busy", other)
	busy := t.TempDir()
	mountT(t, other, busy)
	etcd := loopDisk(t, 64)
	tests := []struct{ name, storage, wantErr string }{
		{"boot disk, partitioned", `{"disks":[{"device":"BOOT","wipeTable":true,"partitions":[{"number":3}]}]}`,
			"storage.disks[0].device: BOOT is on the boot disk " + filepath.Base(boot) + " (it holds " + root},
		{"boot disk's other partition, formatted", `{"filesystems":[{"device":"BOOT2","format":"ext4","wipeFilesystem":true}]}`,
			"storage.filesystems[0].device: BOOT2 is on the boot disk"},
		{"boot disk, LUKS", `{"luks":[{"name":"x","device":"BOOT2","wipeVolume":true}]}`,
			"storage.luks[0].device: BOOT2 is on the boot disk"},
		{"mounted device, wiped", `{"filesystems":[{"device":"OTHER","format":"xfs","wipeFilesystem":true}]}`,
			"storage.filesystems[0].device: OTHER is mounted at " + busy + "; refusing to change it"},
		{"the etcd volume's disk", `{"disks":[{"device":"ETCD","partitions":[{"number":1}]}]}`,
			"storage.disks[0].device: ETCD is on ETCD (disk " + filepath.Base(etcd) + "), which is the etcd volume; the config's storage may not touch it"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := strings.NewReplacer("BOOT2", partDev(boot, 2), "BOOT", boot, "OTHER", other, "ETCD", etcd)
			before := []string{probe(t, boot).PTType, probe(t, partDev(boot, 2)).Type, probe(t, other).UUID, probe(t, etcd).String()}
			o := testOptions(t)
			o.BootMounts = []string{root}
			o.Forbidden = map[string]string{etcd: "is the etcd volume"}
			changed, err := applyCfg(t, storageOf(t, r.Replace(tc.storage)), o)
			if want := r.Replace(tc.wantErr); err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("Apply = %v, want an error with %q", err, want)
			}
			if len(changed) > 0 {
				t.Errorf("refused, yet changed %q", changed)
			}
			after := []string{probe(t, boot).PTType, probe(t, partDev(boot, 2)).Type, probe(t, other).UUID, probe(t, etcd).String()}
			if strings.Join(before, " ") != strings.Join(after, " ") {
				t.Errorf("devices changed: %q, then %q", before, after)
			}
		})
	}
}

func mountT(t *testing.T, dev, dir string) {
	t.Helper()
	testkit.Run(t, "mount", dev, dir)
	t.Cleanup(func() { testkit.Run(t, "umount", dir) })
}

// The disk this machine's / is on is refused by the read-only check every device passes
// first (nothing in this test writes).
func TestRealBootDiskRefused(t *testing.T) {
	var st unix.Stat_t
	if err := unix.Stat("/", &st); err != nil {
		t.Fatal(err)
	}
	dir, err := filepath.EvalSymlinks(fmt.Sprintf("/sys/dev/block/%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev)))
	if err != nil {
		t.Skipf("/ is not on a block device (%v)", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "partition")); err == nil {
		dir = filepath.Dir(dir)
	}
	dev := "/dev/" + filepath.Base(dir)
	if _, err := os.Stat(dev); err != nil {
		t.Skipf("no device node for the root disk: %v", err)
	}
	a := &applier{o: Options{Settle: time.Second}}
	_, err = a.device(context.Background(), "storage.disks[0].device", dev)
	if want := "storage.disks[0].device: " + dev + " is on the boot disk " + filepath.Base(dir) + " (it holds /,"; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("device(%s) = %v, want %q", dev, err, want)
	}
}
