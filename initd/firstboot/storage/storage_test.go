package storage

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kilnproject/kiln/initd/blockdev"
	"github.com/kilnproject/kiln/initd/config"
	"github.com/kilnproject/kiln/internal/testkit"
)

// needTools skips (or fails, with KILN_REQUIRE_TOOLS) without root or the tools the
// storage stage runs.
func needTools(t *testing.T, extra ...string) {
	t.Helper()
	testkit.RequireRoot(t, "loop devices")
	testkit.Tool(t, "losetup", "mount")
	testkit.Tool(t, "sgdisk", "gdisk")
	testkit.Tool(t, "partx", "util-linux")
	testkit.Tool(t, "blkid", "util-linux")
	testkit.Tool(t, "wipefs", "util-linux")
	testkit.Tool(t, "mkfs.ext4", "e2fsprogs")
	pkgs := map[string]string{"mkfs.xfs": "xfsprogs", "mkfs.vfat": "dosfstools", "mkswap": "util-linux",
		"mdadm": "mdadm", "cryptsetup": "cryptsetup-bin"}
	for _, e := range extra {
		testkit.Tool(t, e, pkgs[e])
	}
}

// loopDisk is a sparse file of sizeMiB attached to a loop device with partition scanning.
func loopDisk(t *testing.T, sizeMiB int) string {
	t.Helper()
	img := filepath.Join(t.TempDir(), "disk.img")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, int64(sizeMiB)<<20); err != nil {
		t.Fatal(err)
	}
	dev := strings.TrimSpace(testkit.Run(t, "losetup", "--find", "--show", "--partscan", img))
	t.Cleanup(func() {
		if out, err := exec.Command("losetup", "-d", dev).CombinedOutput(); err != nil {
			t.Logf("losetup -d %s: %v: %s", dev, err, out)
		}
	})
	return dev
}

// storageOf parses and validates an Ignition config's storage section.
func storageOf(t *testing.T, storage string) *config.Config {
	t.Helper()
	cfg, err := config.Parse([]byte(`{"ignition":{"version":"3.5.0"},"storage":` + storage + `}`))
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("validate: %v", err)
	}
	return cfg
}

func testOptions(t *testing.T) Options {
	return Options{Root: t.TempDir(), Settle: 10 * time.Second, cheapKDF: true}
}

func applyCfg(t *testing.T, cfg *config.Config, o Options) ([]string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	return Apply(ctx, cfg.Ignition, o)
}

// applyWant applies cfg and fails the test unless it fails with an error containing wantErr
// ("" wants none). It returns what Apply changed.
func applyWant(t *testing.T, cfg *config.Config, o Options, wantErr string) []string {
	t.Helper()
	changed, err := applyCfg(t, cfg, o)
	switch {
	case wantErr == "" && err != nil:
		t.Fatalf("Apply: %v", err)
	case wantErr != "" && (err == nil || !strings.Contains(err.Error(), wantErr)):
		t.Fatalf("Apply = %v, want an error with %q", err, wantErr)
	}
	return changed
}

func probe(t *testing.T, dev string) blockdev.Signature {
	t.Helper()
	sig, err := blockdev.Probe(context.Background(), dev)
	if err != nil {
		t.Fatalf("probe %s: %v", dev, err)
	}
	return sig
}

func partitionsOf(t *testing.T, dev string) []blockdev.Partition {
	t.Helper()
	parts, err := blockdev.ReadGPT(dev, 512)
	if err != nil {
		t.Fatal(err)
	}
	return parts
}

// partDev is the node of partition n of loop device dev.
func partDev(dev string, n int) string { return dev + "p" + strconv.Itoa(n) }

func TestDisks(t *testing.T) {
	needTools(t)
	tests := []struct {
		name string
		// prepare lays out the disk before the run (sgdisk arguments, or a filesystem).
		prepare []string
		mkfs    bool
		disk    string // the storage.disks entry, with DEV for the device
		wantErr string
		// want is what the partitions must be afterwards: "number:label:sectors".
		want []string
	}{
		{name: "create on a blank disk",
			disk: `{"device":"DEV","partitions":[{"number":1,"label":"a","sizeMiB":16},{"label":"b","sizeMiB":0}]}`,
			want: []string{"1:a:32768", "2:b:"}},
		{name: "keep a matching partition", prepare: []string{"--new=1:2048:+32768", "--change-name=1:a"},
			disk: `{"device":"DEV","partitions":[{"number":1,"label":"a","sizeMiB":16,"startMiB":1}]}`,
			want: []string{"1:a:32768"}},
		{name: "refuse a partition that does not match", prepare: []string{"--new=1:2048:+32768", "--change-name=1:old"},
			disk:    `{"device":"DEV","partitions":[{"number":1,"label":"a","sizeMiB":16}]}`,
			wantErr: `storage.disks[0].partitions[0]: partition 1 of DEV is labelled "old", not "a"; refusing to change it (wipePartitionEntry: true replaces it)`,
			want:    []string{"1:old:32768"}},
		{name: "wipePartitionEntry replaces it", prepare: []string{"--new=1:2048:+32768", "--change-name=1:old"},
			disk: `{"device":"DEV","partitions":[{"number":1,"label":"a","sizeMiB":8,"wipePartitionEntry":true}]}`,
			want: []string{"1:a:16384"}},
		{name: "shouldExist false without wipePartitionEntry", prepare: []string{"--new=1:2048:+32768", "--new=2:0:+8M"},
			disk:    `{"device":"DEV","partitions":[{"number":2,"shouldExist":false}]}`,
			wantErr: "storage.disks[0].partitions[0]: partition 2 of DEV exists and shouldExist is false; refusing to delete it",
			want:    []string{"1::32768", "2::16384"}},
		{name: "shouldExist false deletes", prepare: []string{"--new=1:2048:+32768", "--new=2:0:+8M"},
			disk: `{"device":"DEV","partitions":[{"number":2,"shouldExist":false,"wipePartitionEntry":true}]}`,
			want: []string{"1::32768"}},
		{name: "a filesystem on the disk is refused", mkfs: true,
			disk:    `{"device":"DEV","partitions":[{"number":1,"label":"a"}]}`,
			wantErr: "storage.disks[0].device: DEV holds an ext4 filesystem",
			want:    nil},
		{name: "wipeTable erases it", mkfs: true,
			disk: `{"device":"DEV","wipeTable":true,"partitions":[{"number":1,"label":"a","sizeMiB":4}]}`,
			want: []string{"1:a:8192"}},
		{name: "wipeTable erases other partitions", prepare: []string{"--new=1:2048:+32768", "--new=2:0:+8M"},
			disk: `{"device":"DEV","wipeTable":true,"partitions":[{"number":1,"label":"a","sizeMiB":4}]}`,
			want: []string{"1:a:8192"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dev := loopDisk(t, 64)
			if tc.prepare != nil {
				testkit.Run(t, "sgdisk", append(tc.prepare, dev)...)
				testkit.Run(t, "partx", "-u", dev)
			}
			if tc.mkfs {
				testkit.Run(t, "mkfs.ext4", "-q", dev)
			}
			cfg := storageOf(t, `{"disks":[`+strings.ReplaceAll(tc.disk, "DEV", dev)+`]}`)
			o := testOptions(t)
			wantErr := strings.ReplaceAll(tc.wantErr, "DEV", dev)
			changed := applyWant(t, cfg, o, wantErr)
			if wantErr != "" && len(changed) > 0 {
				t.Errorf("a refused run changed %q", changed)
			}
			if tc.want == nil {
				if sig := probe(t, dev); sig.Type != "ext4" {
					t.Errorf("disk holds %s after the refusal, want the ext4 filesystem untouched", sig)
				}
				return
			}
			var got []string
			for _, p := range partitionsOf(t, dev) {
				got = append(got, fmtPart(p, tc.want))
			}
			if strings.Join(got, " ") != strings.Join(tc.want, " ") {
				t.Errorf("partitions = %q, want %q", got, tc.want)
			}
			if wantErr != "" {
				return
			}
			for _, p := range partitionsOf(t, dev) {
				if _, err := os.Stat(partDev(dev, p.Index)); err != nil {
					t.Errorf("partition %d not in /dev after Apply: %v", p.Index, err)
				}
			}
			again, err := applyCfg(t, cfg, o)
			if err != nil || len(again) > 0 {
				t.Errorf("second Apply = %q, %v; want no change", again, err)
			}
		})
	}
}

// fmtPart renders p as "number:label:sectors", leaving the size out where the wanted
// entry does (a partition that fills the disk).
func fmtPart(p blockdev.Partition, want []string) string {
	s := strings.Join([]string{strconv.Itoa(p.Index), p.Name, strconv.Itoa(int(p.End - p.Start + 1))}, ":")
	for _, w := range want {
		if strings.HasSuffix(w, ":") && strings.HasPrefix(s, w) {
			return w
		}
	}
	return s
}

func runQuiet(name string, args ...string) ([]byte, error) {
	return exec.Command(name, args...).CombinedOutput()
}
