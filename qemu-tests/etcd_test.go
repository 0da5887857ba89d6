package qemutests

import (
	"fmt"
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

// controlPlaneConfig is a control-plane node's Butane config: node.yaml naming its etcd member
// and disk, and the TSIG key (0600) for the BIND the test runs on the host.
func controlPlaneConfig(member, server, secret string) string {
	return fmt.Sprintf(`variant: fcos
version: 1.6.0
storage:
  files:
    - path: /etc/kiln/node.yaml
      contents:
        inline: |
          cluster: {name: demo, dnsZone: kiln.test}
          role: control-plane
          hostname: cp-%[1]s
          dns: {provider: rfc2136, server: "%[2]s", zone: kiln.test, tsigKeyName: %[4]s, tsigSecretFile: /etc/kiln/dns.key}
          etcd: {member: %[1]s, members: [a, b, c], volume: {serial: etcd-main}}
    - path: /etc/kiln/dns.key
      mode: 0600
      contents:
        inline: %[3]s
`, member, server, secret, bindKey)
}

var (
	dnsDone      = regexp.MustCompile(`kiln-init: dns registered|` + firstbootFailed)
	volumeFound  = regexp.MustCompile(`etcd volume found|` + firstbootFailed)
	ext4UUID     = regexp.MustCompile(`UUID="([0-9a-f-]+)"`)
	manifestLink = "/lib/kiln/etc/upper/kubernetes/manifests/etcd.manifest"
)

// Three control-plane nodes, each with a 2 GiB etcd disk (sparse; the default
// etcd.volume.minSize) with serial etcd-main, and BIND on the host: each disk is formatted once
// and mounted, the etcd manifest lives on it and is linked from the manifests directory, and
// the three etcd-<member> names are in BIND. A reboot keeps
// the disk's filesystem and a file on it; a node killed right after it found its disk (mkfs
// under way) converges on the next boot.
func TestControlPlanesEtcdDisksAndDNS(t *testing.T) {
	top := newEnv(t)
	_, err := exec.LookPath("blkid")
	require(t, err == nil, "blkid not installed")
	b := startBIND(t, "kiln.test")
	baked := top.bake("qemu", "control-plane")

	type node struct{ member, disk, etcd, cfg, ip string }
	nodes := map[string]*node{}
	boot := func(t *testing.T, n *node, i int, want *regexp.Regexp) *vm.Machine {
		e := *top
		e.t = t
		m, line := e.bootWith(vm.Config{Image: n.disk, Config: n.cfg, Net: fmt.Sprintf("10.0.%d.0/24", 3+i),
			Disks: []vm.Disk{{Name: "etcd-main", Path: n.etcd}}}, want, 15*time.Minute)
		if firstbootOutcome(line) == nodeimage.OutcomeFailed {
			m.Stop()
			t.Fatalf("node %s: %s\n%s", n.member, line, tail(m.Lines(), 30))
		}
		return m
	}
	newNode := func(t *testing.T, member string, i int) *node {
		n := &node{member: member, disk: filepath.Join(top.dir, "cp-"+member+".raw"),
			etcd: filepath.Join(top.dir, "etcd-"+member+".img"), cfg: filepath.Join(top.dir, "cp-"+member+".bu"),
			ip: fmt.Sprintf("10.0.%d.15", 3+i)}
		copySparse(t, baked, n.disk)
		if err := os.WriteFile(n.etcd, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(n.etcd, 2<<30); err != nil {
			t.Fatal(err)
		}
		cfg := controlPlaneConfig(member, fmt.Sprintf("10.0.%d.2:%d", 3+i, b.port), b.secret)
		if err := os.WriteFile(n.cfg, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
		return n
	}
	uuid := func(t *testing.T, img string) string {
		out, _ := exec.Command("blkid", "-p", img).CombinedOutput()
		if !strings.Contains(string(out), `TYPE="ext4"`) || !strings.Contains(string(out), `LABEL="etcd"`) {
			t.Fatalf("etcd disk %s: blkid says %s", img, out)
		}
		return ext4UUID.FindStringSubmatch(string(out))[1]
	}

	for i, member := range []string{"a", "b", "c"} {
		t.Run("first boot "+member, func(t *testing.T) {
			n := newNode(t, member, i)
			nodes[member] = n
			m := boot(t, n, i, dnsDone)
			m.Stop()
			logTimings(t, m.Lines())
			uuid(t, n.etcd)
			if out, err := exec.Command("debugfs", "-R", "stat /manifests/etcd.manifest", n.etcd).CombinedOutput(); err != nil || strings.Contains(string(out), "not found") {
				t.Errorf("no etcd manifest on the etcd disk: %v %s", err, out)
			}
			part, err := extractData(n.disk, t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			out, _ := exec.Command("debugfs", "-R", "stat "+manifestLink, part).CombinedOutput()
			if !strings.Contains(string(out), "Type: symlink") || !strings.Contains(string(out), "/var/lib/etcd/demo/manifests/etcd.manifest") {
				t.Errorf("%s is not a link onto the etcd volume:\n%s", manifestLink, out)
			}
			if got, _ := b.dig("etcd-" + member + ".internal.demo.kiln.test"); got != n.ip {
				t.Errorf("BIND has etcd-%s = %q, want %s", member, got, n.ip)
			}
		})
	}
	if t.Failed() {
		return
	}
	if got, _ := b.dig("api.internal.demo.kiln.test"); len(strings.Fields(got)) != 3 {
		t.Errorf("api.internal.demo.kiln.test = %q, want the three control planes", got)
	}

	t.Run("reboot keeps the disk", func(t *testing.T) {
		n := nodes["a"]
		before := uuid(t, n.etcd)
		marker := filepath.Join(t.TempDir(), "marker")
		os.WriteFile(marker, []byte("etcd data\n"), 0o644)
		// The VM was stopped with the disk mounted: replay its journal first, or the guest's
		// replay at the next mount would undo debugfs's write.
		if out, err := exec.Command("e2fsck", "-fy", n.etcd).CombinedOutput(); err != nil && !strings.Contains(err.Error(), "exit status 1") {
			t.Fatalf("e2fsck -fy: %v %s", err, out)
		}
		if out, err := exec.Command("debugfs", "-w", "-R", "write "+marker+" /marker", n.etcd).CombinedOutput(); err != nil {
			t.Fatalf("debugfs write: %v %s", err, out)
		}
		m := boot(t, n, 0, dnsDone)
		m.Stop()
		for _, l := range m.Lines() {
			if strings.Contains(l, "etcd volume formatted") {
				t.Errorf("second boot formatted the etcd disk: %s", l)
			}
		}
		if after := uuid(t, n.etcd); after != before {
			t.Errorf("etcd filesystem changed across a reboot: %s -> %s", before, after)
		}
		if out, _ := exec.Command("debugfs", "-R", "cat /marker", n.etcd).Output(); !strings.Contains(string(out), "etcd data") {
			t.Errorf("file on the etcd disk after reboot = %q", out)
		}
	})

	t.Run("power cut during mkfs", func(t *testing.T) {
		n := newNode(t, "c", 2)
		m := boot(t, n, 2, volumeFound)
		m.Stop() // QEMU ends at once: the guest's mkfs is cut off
		boot(t, n, 2, dnsDone).Stop()
		uuid(t, n.etcd)
		if out, _ := exec.Command("debugfs", "-R", "stat /manifests/etcd.manifest", n.etcd).CombinedOutput(); strings.Contains(string(out), "not found") {
			t.Errorf("no etcd manifest on the etcd disk after convergence: %s", out)
		}
	})
}

var consoleTime = regexp.MustCompile(`^\[ *([0-9.]+)\]`)

// logTimings prints, from the console's kernel timestamps, how long after kiln-firstboot
// started the etcd volume was mounted and the DNS names registered (the measure).
func logTimings(t *testing.T, lines []string) {
	at := func(sub string) float64 {
		for _, l := range lines {
			if strings.Contains(l, sub) {
				if m := consoleTime.FindStringSubmatch(l); m != nil {
					var f float64
					fmt.Sscan(m[1], &f)
					return f
				}
			}
		}
		return -1
	}
	start := at("kiln-init[")
	t.Logf("from first-boot start (%.1fs after kernel start): etcd volume mounted +%.1fs, DNS registered +%.1fs",
		start, at("etcd volume mounted")-start, at("kiln-init: dns registered")-start)
}
