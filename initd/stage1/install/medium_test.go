package install

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/kilnproject/kiln/initd/stage1/liveroot"
	"github.com/kilnproject/kiln/internal/nodeimage"
	"github.com/kilnproject/kiln/internal/testkit"
)

// TestPickTargetKeepsClearOfTheMedium: the disk holding the boot medium the image is read from
// (an ISO dd'ed to a USB stick, or attached as a virtio disk, shows as a disk holding data) is never the target: auto with
// wipe passes over it, and naming it is refused.
func TestPickTargetKeepsClearOfTheMedium(t *testing.T) {
	tests := []struct {
		name    string
		dev     string
		wipe    bool
		want    string
		wantErr string
	}{
		{name: "auto with wipe takes the other disk holding data", dev: auto, wipe: true, want: "vda"},
		{name: "auto without wipe finds no empty disk", dev: auto, wantErr: "no empty disk"},
		{name: "the medium named by path", dev: "DEV/vdb", wipe: true, wantErr: "holds the boot medium the image is read from"},
		{name: "the medium named by id", dev: "virtio-stick", wipe: true, wantErr: "holds the boot medium the image is read from"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := fakeHost(t, fakeDisk{name: "vda", serial: "old", size: 64 * mib, ext4: true}, fakeDisk{name: "vdb", serial: "stick", size: 64 * mib, ext4: true})
			p := params{dev: strings.ReplaceAll(tt.dev, "DEV/", h.devDir+"/"), wipe: tt.wipe}
			d, disks, err := pickTarget(h, p, nil, filepath.Join(h.devDir, "vdb"), 8*mib)
			if tt.wantErr != "" {
				if !errors.Is(err, errNoTarget) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("pickTarget = %v, want a refusal saying %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if d.path != filepath.Join(h.devDir, tt.want) {
				t.Errorf("chose %s, want %s", d.path, tt.want)
			}
			for _, s := range disks {
				if s.name == "vdb" && s.exclusion(0) != "the boot medium the image is read from" {
					t.Errorf("vdb's exclusion %q, want the boot medium", s.exclusion(0))
				}
			}
		})
	}
}

// TestInstallFromMedium: kiln.install.image_url=medium:/kiln/disk.raw.zst reads the image from
// the ISO 9660 volume labelled KILN_LIVE on a block device (a loop device over an ISO written by
// xorriso), without HTTP, checks its sha256, writes it to the one empty disk, keeps the image's
// boot entry as it is (no kiln.config.url=) and unmounts the medium; a wrong sha256 leaves the
// disk unbootable and the medium unmounted.
func TestInstallFromMedium(t *testing.T) {
	testkit.RequireRoot(t, "attaches the ISO to a loop device and mounts it")
	losetup := testkit.Tool(t, "losetup", "mount")
	testkit.Tool(t, "xorriso", "xorriso")
	if fss, _ := os.ReadFile("/proc/filesystems"); !strings.Contains(string(fss), "\tiso9660\n") {
		t.Skip("the kernel has no iso9660 filesystem (isofs) to mount the medium with")
	}
	img := makeImage(t)
	enc, err := zstd.NewWriter(nil)
	if err != nil {
		t.Fatal(err)
	}
	zst := enc.EncodeAll(img.raw, nil)
	tree := t.TempDir()
	if err := os.MkdirAll(filepath.Join(tree, "kiln"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tree, "kiln", "disk.raw.zst"), zst, 0o644); err != nil {
		t.Fatal(err)
	}
	iso := filepath.Join(t.TempDir(), "kiln.iso")
	testkit.Run(t, "xorriso", "-as", "mkisofs", "-quiet", "-R", "-V", nodeimage.ISOLabel, "-o", iso, tree)
	out, err := exec.Command(losetup, "--find", "--show", "--read-only", iso).CombinedOutput()
	if err != nil {
		t.Skipf("no loop device: %v: %s", err, out)
	}
	loop := strings.TrimSpace(string(out))
	t.Cleanup(func() { exec.Command(losetup, "-d", loop).Run() })

	for _, tt := range []struct {
		name    string
		sha256  string
		wantErr string
	}{
		{name: "installs", sha256: sha(zst)},
		{name: "wrong sha256", sha256: strings.Repeat("0", 64), wantErr: "sha256 mismatch: the image file (" + strconv.Itoa(len(zst)) + " bytes)"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			o := testOpts(t)
			// sr0 is the CD drive holding the medium, as QEMU's scsi-cd shows it.
			o.host = fakeHost(t, fakeDisk{name: "vda", serial: "os", size: 64 * mib}, fakeDisk{name: "sr0", size: 64 * mib})
			medium := filepath.Join(o.host.devDir, "sr0")
			if err := os.Remove(medium); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(loop, medium); err != nil {
				t.Fatal(err)
			}
			mnt := t.TempDir()
			o.Medium = liveroot.Medium{Label: nodeimage.ISOLabel, SysBlock: o.host.sysBlock, DevDir: o.host.devDir, MountDir: mnt, Wait: 2 * time.Second}
			p, err := parseParams(map[string]string{paramImageURL: "medium:/kiln/disk.raw.zst", paramImageHash: tt.sha256, paramDev: auto})
			if err != nil {
				t.Fatal(err)
			}
			log, logs := logBuffer()
			res, err := install(context.Background(), log, p, o)
			if mounted, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(mounted), " "+mnt+" ") {
				exec.Command("umount", mnt).Run()
				t.Errorf("the medium is still mounted on %s", mnt)
			}
			target := filepath.Join(o.host.devDir, "vda")
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !strings.Contains(err.Error(), "does not boot") {
					t.Fatalf("install = %v, want an error saying %q and that the disk does not boot", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("install: %v\n%s", err, logs)
			}
			if res.device != target || res.image != "disk.raw.zst" {
				t.Errorf("installed %s to %s, want disk.raw.zst to %s", res.image, res.device, target)
			}
			assertInstalled(t, target, img, testOptions)
			for _, w := range []string{`msg="boot medium found"`, `msg="install: no kiln.config.url= to hand over; the image's boot entry is kept as it is"`} {
				if !strings.Contains(logs.String(), w) {
					t.Errorf("the console does not say %s:\n%s", w, logs)
				}
			}
		})
	}
}
