package qemutests

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// genericDef is an image of the base with Debian's generic kernel (make base-generic), with an
// erofs root: mounting it needs erofs.ko, libcrc32c.ko and the crc32c algorithm.
const genericDef = `# The default image on the base with Debian's generic kernel (qemu-tests/kernel_test.go).
name: generic
platform: qemu
base:
  layout: ${KILN_CACHE}/base
  tag: bookworm-generic
disk:
  size: 4GiB
  rootfs: erofs
  compression: lz4hc
formats: [raw]
kernel:
  args: ["console=ttyS0,115200"]
overlays: [base]
`

var modulesSummary = regexp.MustCompile(`msg="modules loaded" .*\bcount=(\d+) of=(\d+) unused=(\d+) failed=(\d+)`)

// Debian's generic kernel has as modules what the cloud kernel builds in, with soft dependencies
// between them (libcrc32c, which erofs needs, wants the crc32c algorithm loaded first). An image
// baked from it carries crc32c_generic before libcrc32c in its initramfs; stage 1 loads every
// module (a CPU-specific one may find no CPU feature under TCG: unused, not failed) with no
// "module not loaded" line, mounts the erofs root and the node reaches kiln-init's first-boot
// line. One boot.
func TestGenericKernelBoots(t *testing.T) {
	e := newEnv(t)
	cache := os.Getenv("KILN_CACHE")
	if cache == "" {
		home, _ := os.UserHomeDir()
		cache = filepath.Join(home, ".cache", "kiln")
	}
	index, _ := os.ReadFile(filepath.Join(cache, "base", "index.json"))
	require(t, strings.Contains(string(index), `"bookworm-generic"`), "no bookworm-generic base in %s/base (make base-generic)", cache)
	if err := os.WriteFile(filepath.Join(e.repo, "images", "generic.yaml"), []byte(genericDef), 0o644); err != nil {
		t.Fatal(err)
	}
	baked := e.bake("generic", "worker")

	raw, err := os.ReadFile(filepath.Join(e.dir, "out", "generic-worker.json"))
	if err != nil {
		t.Fatal(err)
	}
	var md struct {
		Kernel    struct{ Version string }
		Initramfs struct{ Modules []string }
	}
	if err := json.Unmarshal(raw, &md); err != nil {
		t.Fatalf("generic-worker.json: %v", err)
	}
	if !strings.HasSuffix(md.Kernel.Version, "-amd64") || strings.Contains(md.Kernel.Version, "cloud") {
		t.Fatalf("kernel %q, want Debian's generic amd64 kernel", md.Kernel.Version)
	}
	pos := map[string]int{}
	for i, m := range md.Initramfs.Modules {
		pos[strings.TrimSuffix(filepath.Base(m), ".ko")] = i
	}
	for _, order := range [][2]string{{"crc32c_generic", "libcrc32c"}, {"libcrc32c", "erofs"}, {"crc32c_generic", "ext4"}} {
		a, okA := pos[order[0]]
		b, okB := pos[order[1]]
		if !okA || !okB || a > b {
			t.Errorf("initramfs modules %q: want %s before %s", md.Initramfs.Modules, order[0], order[1])
		}
	}

	disk := filepath.Join(e.dir, "node.raw")
	copySparse(t, baked, disk)
	cfg := filepath.Join(e.dir, "node.ign")
	if err := os.WriteFile(cfg, []byte(`{"ignition":{"version":"3.4.0"},"storage":{"files":[
		{"path":"/etc/kiln/hello.txt","mode":384,"contents":{"source":"data:,generic%20kernel%0A"}}]}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	m, _ := e.boot(disk, cfg, firstbootOK, 15*time.Minute)
	m.Stop()

	var summary []string
	for _, l := range m.Lines() {
		if strings.Contains(l, "module not loaded") || strings.Contains(l, "modules failed to load") {
			t.Errorf("stage 1: %s", strings.TrimSpace(l))
		}
		if strings.Contains(l, "module not used") && !strings.Contains(l, "/kernel/arch/x86/crypto/") {
			t.Errorf("stage 1 left a module unused that is not a CPU-specific one: %s", strings.TrimSpace(l))
		}
		if s := modulesSummary.FindStringSubmatch(l); s != nil {
			summary = s
		}
	}
	if i := slices.IndexFunc(m.Lines(), rootMounted.MatchString); i < 0 || !strings.Contains(m.Lines()[i], " fstype=erofs") {
		t.Errorf("stage 1 did not mount an erofs root:\n%s", tail(m.Lines(), 30))
	}
	if summary == nil {
		t.Fatalf("no stage 1 \"modules loaded\" line on the console:\n%s", tail(m.Lines(), 60))
	}
	n := func(i int) int { v, _ := strconv.Atoi(summary[i]); return v }
	loaded, listed, unused, failed := n(1), n(2), n(3), n(4)
	if listed != len(md.Initramfs.Modules) || failed != 0 || loaded+unused != listed {
		t.Errorf("stage 1: %q; want all %d modules of the initramfs loaded (or unused), none failed", summary[0], len(md.Initramfs.Modules))
	}
	t.Logf("kernel %s: %d initramfs modules, stage 1 %q", md.Kernel.Version, len(md.Initramfs.Modules), summary[0])
}
