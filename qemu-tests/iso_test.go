package qemutests

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kilnproject/kiln/builder/disk"
	"github.com/kilnproject/kiln/builder/vm"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

// isoRootCopied is stage 1 saying it copied the root image from the ISO into RAM.
var isoRootCopied = regexp.MustCompile(`live root copied from the medium`)

// bakeISO bakes images/metal.yaml's worker (with tsc=reliable for TCG) as an iso only, with
// more appended to the definition, and returns the iso's and the raw disk's paths.
func bakeISO(t *testing.T, e *env, more string) (iso, raw string) {
	t.Helper()
	_, err := exec.LookPath("xorriso")
	require(t, err == nil, "xorriso not installed")
	def := filepath.Join(e.repo, "images", "metal.yaml")
	forTCGBoots(t, def)
	b, err := os.ReadFile(def)
	if err != nil {
		t.Fatal(err)
	}
	s := strings.Replace(string(b), "\nformats: [raw, pxe]\n", "\nformats: [iso]\n", 1)
	if !strings.Contains(s, "\nformats: [iso]\n") {
		t.Fatalf("%s: no formats line [raw, pxe] to replace with [iso]", def)
	}
	if err := os.WriteFile(def, []byte(s+more), 0o644); err != nil {
		t.Fatal(err)
	}
	raw = e.bake("metal", "worker")
	return strings.TrimSuffix(raw, ".raw") + nodeimage.ISOSuffix, raw
}

// TestISOLiveBoot bakes images/metal.yaml's worker as an iso only, adds a node config to a copy
// with `kiln iso add-config`, and boots that as a CD-ROM on a machine without a disk or network
// boot: OVMF loads the El Torito EFI image's systemd-boot (the copy's replayed boot setup),
// stage 1 finds the medium by its label, copies and checks the root image into RAM without the
// network, puts /var in RAM and first boot succeeds with the config it reads from the medium.
func TestISOLiveBoot(t *testing.T) {
	e := newEnv(t)
	iso, raw := bakeISO(t, e, "")
	if _, err := os.Stat(raw); err == nil {
		t.Errorf("%s remains though the definition lists only iso", raw)
	}
	cfg := filepath.Join(e.dir, "iso-node.bu")
	if err := os.WriteFile(cfg, []byte(isoNodeConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	withConfig := filepath.Join(e.dir, "metal-worker-config.iso")
	e.run(e.dir, e.kiln, "iso", "add-config", iso, cfg, "-o", withConfig)
	fi, err := os.Stat(withConfig)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: %d MiB", filepath.Base(withConfig), fi.Size()>>20)
	start := time.Now()
	m, line := e.bootWith(vm.Config{CDROM: withConfig, MemoryMB: 3072}, firstbootDone, 15*time.Minute)
	m.Stop()
	if !firstbootFromMedium.MatchString(line) {
		t.Fatalf("iso boot: %s, want first boot ok with the config on the medium\n%s", line, tail(m.Lines(), 40))
	}
	console := strings.Join(m.Lines(), "\n")
	if !isoRootCopied.MatchString(console) {
		t.Errorf("stage 1 did not say it copied the root from the medium:\n%s", tail(m.Lines(), 40))
	}
	t.Logf("iso live boot: firstboot ok after %s", time.Since(start).Round(time.Second))
}

// isoNodeConfig is the Butane config kiln iso add-config puts on the medium: one file, so first
// boot's line says files=1.
const isoNodeConfig = `variant: fcos
version: 1.6.0
storage:
  files:
    - path: /etc/kiln/iso.txt
      mode: 0644
      contents:
        inline: configured from the medium
`

// firstbootFromMedium is first boot's success with the config on the iso's own medium.
var firstbootFromMedium = regexp.MustCompile(regexp.QuoteMeta(nodeimage.StatusLinePrefix+nodeimage.OutcomeOK) + ` source=iso-medium files=1 `)

var (
	// mediumSkipped is the installer passing over the disk holding its medium, networkUp stage
	// 1 bringing the network up.
	mediumSkipped = regexp.MustCompile(`msg="install: skipped the boot medium" .*disk="/dev/sr0 `)
	networkUp     = regexp.MustCompile(`msg="network up"`)
)

// TestISOInstall bakes the metal worker as an installer iso (iso.install, dev auto), adds a
// node config to a copy with `kiln iso add-config`, and boots that as a CD-ROM on a machine
// with a blank disk (booted first, so the firmware falls through to the CD): the ISO's default
// entry installs the disk image it carries onto the blank disk from the medium, without a
// network, passing over the CD; the machine reboots into the disk, whose boot entry is the
// image's own, and first boot succeeds with the config on the ISO still in the drive.
func TestISOInstall(t *testing.T) {
	e := newEnv(t)
	iso, _ := bakeISO(t, e, "iso:\n  install: {dev: auto}\n")
	fi, err := os.Stat(iso)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s (installer): %d MiB", filepath.Base(iso), fi.Size()>>20)
	cfg := filepath.Join(e.dir, "iso-node.bu")
	if err := os.WriteFile(cfg, []byte(isoNodeConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	withConfig := filepath.Join(e.dir, "metal-worker-installer-config.iso")
	e.run(e.dir, e.kiln, "iso", "add-config", iso, cfg, "-o", withConfig)
	target := filepath.Join(e.dir, "iso-install-0.raw")
	sparseDisk(t, target, 6<<30)
	c := newStampedConsole()
	start := time.Now()
	m, line := e.bootWith(vm.Config{Image: target, Root: vm.Disk{Name: "install-0"}, CDROM: withConfig, MemoryMB: 3072,
		Serial: c}, pxeDone, 20*time.Minute)
	m.Stop()
	if !firstbootFromMedium.MatchString(line) {
		t.Fatalf("iso install: %q, want first boot ok with the config on the medium\n%s", line, tail(m.Lines(), 60))
	}
	if c.count(mediumSkipped) != 1 || c.count(networkUp) != 0 {
		t.Errorf("iso install: %d lines passing over the CD, %d network bring-ups; want the CD passed over and no network\n%s",
			c.count(mediumSkipped), c.count(networkUp), tail(m.Lines(), 60))
	}
	if c.count(installLine) != 1 || c.count(kernelStart) != 2 || c.count(isoRootCopied) != 0 {
		t.Errorf("iso install: %d install lines, %d kernel starts, %d live copies; want one install and a reboot into the disk\n%s",
			c.count(installLine), c.count(kernelStart), c.count(isoRootCopied), tail(m.Lines(), 60))
	}
	bf, err := vm.ExtractBoot(t.Context(), target, t.TempDir())
	if err != nil {
		t.Fatalf("installed disk: %v", err)
	}
	if !strings.Contains(bf.Cmdline, "root=PARTUUID=") || strings.Contains(bf.Cmdline, "kiln.install.") ||
		strings.Contains(bf.Cmdline, "kiln.live.") || strings.Contains(bf.Cmdline, "kiln.config.url=") {
		t.Errorf("installed disk's loader entry: %q; want the image's own (root=, no install, live or config URL parameter)", bf.Cmdline)
	}
	if _, _, err := disk.Read(target); err != nil {
		t.Errorf("installed disk: %v", err)
	}
	t.Logf("iso install (6 GiB blank disk, config on the ISO): installer kernel %s, install started %s, written %s, disk kernel %s, firstboot ok %s; %s in all",
		secs(c.at(kernelStart, 1)), secs(c.at(installStart, 1)), secs(c.at(installLine, 1)), secs(c.at(kernelStart, 2)),
		secs(c.at(firstbootDone, 1)), time.Since(start).Round(time.Second))
}
