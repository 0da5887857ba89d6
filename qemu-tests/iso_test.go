package qemutests

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kilnproject/kiln/builder/vm"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

// isoRootCopied is stage 1 saying it copied the root image from the ISO into RAM.
var isoRootCopied = regexp.MustCompile(`live root copied from the medium`)

// TestISOLiveBoot bakes images/metal.yaml's worker as an iso only and boots it as a CD-ROM on
// a machine without a disk or network boot: OVMF loads the El Torito EFI image's systemd-boot,
// stage 1 finds the medium by its label, copies and checks the root image into RAM without the
// network, puts /var in RAM and first boot succeeds (no config: platform metal reads none from
// fw_cfg).
func TestISOLiveBoot(t *testing.T) {
	e := newEnv(t)
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
	if err := os.WriteFile(def, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
	raw := e.bake("metal", "worker")
	iso := strings.TrimSuffix(raw, ".raw") + nodeimage.ISOSuffix
	fi, err := os.Stat(iso)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(raw); err == nil {
		t.Errorf("%s remains though the definition lists only iso", raw)
	}
	t.Logf("%s: %d MiB", filepath.Base(iso), fi.Size()>>20)
	start := time.Now()
	m, line := e.bootWith(vm.Config{CDROM: iso, MemoryMB: 3072}, firstbootDone, 15*time.Minute)
	m.Stop()
	if firstbootOutcome(line) != nodeimage.OutcomeOK {
		t.Fatalf("iso boot: %s\n%s", line, tail(m.Lines(), 40))
	}
	console := strings.Join(m.Lines(), "\n")
	if !isoRootCopied.MatchString(console) {
		t.Errorf("stage 1 did not say it copied the root from the medium:\n%s", tail(m.Lines(), 40))
	}
	t.Logf("iso live boot: firstboot ok after %s", time.Since(start).Round(time.Second))
}
