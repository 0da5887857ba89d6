package storage

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kilnproject/kiln/initd/config"
	"github.com/kilnproject/kiln/internal/testkit"
)

const luksUUID = "2b0a6c8e-1bcb-4c4e-8e0b-7f5f2a4d3c11"

// The whole stage on a fresh disk: partitions, a filesystem on each, one mounted live
// (under the test's root); a second run changes nothing and reformats nothing.
func TestStageTwice(t *testing.T) {
	needTools(t, "mkfs.vfat")
	dev := loopDisk(t, 200)
	o := testOptions(t)
	o.Live = true
	cfg := storageOf(t, strings.ReplaceAll(`{
		"disks":[{"device":"DEV","wipeTable":true,"partitions":[{"number":1,"label":"containerd","sizeMiB":128},{"number":2,"label":"esp"}]}],
		"filesystems":[{"device":"DEVp1","format":"ext4","label":"containerd","path":"/var/lib/containerd","mountOptions":["noatime"]},
			{"device":"DEVp2","format":"ext4","label":"data","path":"/srv/data"}]}`, "DEV", dev))
	t.Cleanup(func() {
		for _, d := range []string{"var/lib/containerd", "srv/data"} {
			testkitUmount(t, filepath.Join(o.Root, d))
		}
	})
	changed, err := applyCfg(t, cfg, o)
	if err != nil {
		t.Fatalf("Apply: %v", err)
	}
	t.Logf("first run:\n%s", strings.Join(changed, "\n"))
	uuids := []string{probe(t, partDev(dev, 1)).UUID, probe(t, partDev(dev, 2)).UUID}
	for _, d := range []string{"var/lib/containerd", "srv/data"} {
		if !mounted(t, filepath.Join(o.Root, d)) {
			t.Errorf("%s is not mounted", d)
		}
	}
	// The files task writes onto the mounted filesystem.
	if err := os.WriteFile(filepath.Join(o.Root, "srv/data/hello"), []byte("hi"), 0o644); err != nil {
		t.Fatal(err)
	}
	again, err := applyCfg(t, cfg, o)
	if err != nil || len(again) > 0 {
		t.Errorf("second Apply = %q, %v; want no change", again, err)
	}
	if got := []string{probe(t, partDev(dev, 1)).UUID, probe(t, partDev(dev, 2)).UUID}; strings.Join(got, " ") != strings.Join(uuids, " ") {
		t.Errorf("UUIDs %q, then %q", uuids, got)
	}
	if b, err := os.ReadFile(filepath.Join(o.Root, "srv/data/hello")); err != nil || string(b) != "hi" {
		t.Errorf("file on the filesystem after the second run: %q, %v", b, err)
	}
}

func mounted(t *testing.T, dir string) bool {
	t.Helper()
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == dir {
			return true
		}
	}
	return false
}

func testkitUmount(t *testing.T, dir string) {
	if mounted(t, dir) {
		testkit.Run(t, "umount", dir)
	}
}

// A LUKS volume is formatted once; later runs check the stored key opens it and keep it
// (same UUID), with or without wipeVolume; a key that does not open it is an error.
func TestLuks(t *testing.T) {
	needTools(t, "cryptsetup")
	dev := loopDisk(t, 64)
	o := testOptions(t)
	cfg := storageOf(t, `{"luks":[{"name":"secret","device":"`+dev+`","label":"sec","uuid":"`+luksUUID+`","wipeVolume":true,"discard":true,
		"keyFile":{"source":"data:,correct%20horse","verification":{"hash":"sha256-2a4b4cc1bb1ba5e54e4b1dff7fc4e5ac4ae9c8c4e4d56ad6bf1b1f2bcf7f0a4d"}}}]}`)
	_, err := applyCfg(t, cfg, o)
	if err == nil || !strings.Contains(err.Error(), "storage.luks[0].keyFile.verification.hash") {
		t.Fatalf("Apply with a wrong hash = %v, want the hash refused", err)
	}
	if sig := probe(t, dev); !sig.Blank {
		t.Fatalf("after a refused key the device holds %s", sig)
	}
	cfg = storageOf(t, `{"luks":[{"name":"secret","device":"`+dev+`","label":"sec","uuid":"`+luksUUID+`","wipeVolume":true,"discard":true,
		"keyFile":{"source":"data:,correct%20horse"}}]}`)
	changed, err := applyCfg(t, cfg, o)
	if err != nil {
		t.Fatalf("Apply: %v", err)
	}
	t.Logf("first run:\n%s", strings.Join(changed, "\n"))
	sig := probe(t, dev)
	if sig.Type != "crypto_LUKS" || sig.UUID != luksUUID || sig.Label != "sec" {
		t.Fatalf("device holds %s, want LUKS sec %s", sig, luksUUID)
	}
	key := filepath.Join(o.Root, "etc/luks/secret")
	if fi, err := os.Stat(key); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("key file: %v, %v; want mode 0600", fi, err)
	}
	tab, _ := os.ReadFile(filepath.Join(o.Root, "etc/crypttab"))
	if want := "secret UUID=" + luksUUID + " /etc/luks/secret luks,discard\n"; string(tab) != want {
		t.Errorf("crypttab = %q, want %q", tab, want)
	}
	again, err := applyCfg(t, cfg, o)
	if err != nil || len(again) > 0 {
		t.Errorf("second Apply = %q, %v; want no change", again, err)
	}
	// The header's UUID is the same; a reformat would also re-key it.
	testkit.Run(t, "cryptsetup", "open", "--test-passphrase", "--key-file", key, dev)
	if got := probe(t, dev).UUID; got != luksUUID {
		t.Errorf("UUID %s after the second run", got)
	}
	other := storageOf(t, `{"luks":[{"name":"secret","device":"`+dev+`","keyFile":{"source":"data:,wrong"}}]}`)
	if _, err := applyCfg(t, other, o); err == nil || !strings.Contains(err.Error(), "storage.luks[0].keyFile: the key does not open the LUKS volume") {
		t.Errorf("Apply with another key = %v, want it refused", err)
	}
	if b, err := os.ReadFile(key); err != nil || string(b) != "correct horse" {
		t.Errorf("after a refused key the stored key is %q, %v; want the one that opens the volume", b, err)
	}
	foreign := storageOf(t, `{"luks":[{"name":"other","device":"`+dev+`","uuid":"11111111-2222-3333-4444-555555555555","keyFile":{"source":"data:,k"}}]}`)
	if _, err := applyCfg(t, foreign, o); err == nil || !strings.Contains(err.Error(), "not UUID 11111111-2222-3333-4444-555555555555; refusing to format it (wipeVolume: true erases it)") {
		t.Errorf("Apply with another UUID = %v, want it refused", err)
	}
}

// RAID0 over two loop devices is created, then, stopped as after a reboot, assembled
// by the next run without being created again.
func TestRaid0(t *testing.T) {
	needTools(t, "mdadm")
	if _, err := os.Stat("/proc/mdstat"); err != nil {
		t.Skip("this kernel has no md driver (/proc/mdstat is missing): RAID cannot be tested here")
	}
	a, b := loopDisk(t, 64), loopDisk(t, 64)
	o := testOptions(t)
	cfg := storageOf(t, `{"raid":[{"name":"kilntest","level":"raid0","devices":["`+a+`","`+b+`"]}],
		"filesystems":[{"device":"/dev/md/kilntest","format":"ext4","label":"striped"}]}`)
	t.Cleanup(func() { _, _ = runQuiet("mdadm", "--stop", "/dev/md/kilntest") })
	if _, err := applyCfg(t, cfg, o); err != nil {
		t.Fatalf("Apply: %v", err)
	}
	fs := probe(t, "/dev/md/kilntest").UUID
	member := probe(t, a).UUID
	testkit.Run(t, "mdadm", "--stop", "/dev/md/kilntest")
	changed, err := applyCfg(t, cfg, o)
	if err != nil {
		t.Fatalf("second Apply: %v", err)
	}
	if len(changed) != 1 || !strings.Contains(changed[0], "assembled /dev/md/kilntest") {
		t.Errorf("second Apply changed %q, want the array assembled and nothing else", changed)
	}
	if got := probe(t, "/dev/md/kilntest").UUID; got != fs {
		t.Errorf("filesystem UUID %s, then %s", fs, got)
	}
	if got := probe(t, a).UUID; got != member {
		t.Errorf("array UUID %s, then %s: created again", member, got)
	}
}

// Butane's with_mount_unit writes the mount unit into the config's systemd.units: the
// storage stage mounts the filesystem and leaves the unit to the config (the units task
// writes it), so the two never write the same file in turn.
func TestButaneMountUnit(t *testing.T) {
	needTools(t)
	dev := loopDisk(t, 64)
	cfg, err := config.Parse([]byte("variant: fcos\nversion: 1.5.0\nstorage:\n  filesystems:\n    - device: " + dev +
		"\n      format: ext4\n      label: data\n      path: /srv/data\n      with_mount_unit: true\n"))
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if units := cfg.Ignition.Systemd.Units; len(units) != 1 || units[0].Name != "srv-data.mount" {
		t.Fatalf("Butane made units %+v, want srv-data.mount", units)
	}
	o := testOptions(t)
	o.Live = true
	t.Cleanup(func() { testkitUmount(t, filepath.Join(o.Root, "srv/data")) })
	if _, err := applyCfg(t, cfg, o); err != nil {
		t.Fatalf("Apply: %v", err)
	}
	if !mounted(t, filepath.Join(o.Root, "srv/data")) {
		t.Error("/srv/data is not mounted")
	}
	if _, err := os.Stat(filepath.Join(o.Root, "etc/systemd/system/srv-data.mount")); err == nil {
		t.Error("the storage stage wrote srv-data.mount, which the config writes")
	}
	if again, err := applyCfg(t, cfg, o); err != nil || len(again) > 0 {
		t.Errorf("second Apply = %q, %v; want no change", again, err)
	}
}
