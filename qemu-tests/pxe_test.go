package qemutests

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	diskfs "github.com/diskfs/go-diskfs"

	"github.com/kilnproject/kiln/builder/vm"
	"github.com/kilnproject/kiln/internal/nodeimage"
	"github.com/kilnproject/kiln/internal/testkit"
)

// The machines of the PXE boots, told apart by kiln serve through their MACs.
const (
	macLive    = "02:00:00:00:0b:01"
	macInstall = "02:00:00:00:0b:02"
	macRefuse  = "02:00:00:00:0b:03"
	macCP      = "02:00:00:00:0b:04"
)

var (
	// firstbootFromServe is first boot's success with the config kiln serve rendered for the
	// machine, fetched from the kiln.config.url= of its network boot.
	firstbootFromServe = regexp.MustCompile(regexp.QuoteMeta(nodeimage.StatusLinePrefix+nodeimage.OutcomeOK) + ` source=cmdline-url files=1 `)
	// kernelStart is the kernel's first console line.
	kernelStart = regexp.MustCompile(`Linux version [0-9]`)
	// ipxeStart is iPXE's banner, printed when the NIC's option ROM runs.
	ipxeStart = regexp.MustCompile(`iPXE .*Open Source Network Boot Firmware`)
	// installStart is stage 1's install starting to write a disk, installLine its end.
	installStart = regexp.MustCompile(`msg="install: writing"`)
	installLine  = regexp.MustCompile(`kiln-init: installed .* sha256 ok\); rebooting`)
	// installRefused is stage 1 refusing to write the disk named by kiln.install.dev.
	installRefused = regexp.MustCompile(`kiln-init: stage 1 failed: .*kiln\.install\.dev=.* holds `)
	// pxeDone ends a network boot's wait: first boot's outcome, or stage 1 giving up.
	pxeDone = regexp.MustCompile(firstbootDone.String() + `|kiln-init: stage 1 failed`)
)

// machinesYAML is the served directory's machines.yaml: one group per PXE boot below. The
// live worker runs from RAM; the installs pick their disk (auto) or are told one that holds
// data; the control plane's auto must pass over its etcd disk, which its config names.
const machinesYAML = `groups:
  - name: live
    image: metal-worker
    mode: live
    config: worker.bu
    selector: {mac: "` + macLive + `"}
  - name: install
    image: metal-worker
    mode: install
    install: {dev: auto, image: metal-worker.raw.zst}
    config: worker.bu
    selector: {mac: "` + macInstall + `"}
  - name: refuse
    image: metal-worker
    mode: install
    install: {dev: virtio-olddata, image: metal-worker.raw.zst}
    config: worker.bu
    selector: {mac: "` + macRefuse + `"}
  - name: cp
    image: metal-control-plane
    mode: install
    install: {dev: auto, image: metal-control-plane.raw.zst}
    config: cp.bu
    machines:
      - {name: cp-a, hostname: cp-a, etcdMember: a, selector: {mac: "` + macCP + `"}}
`

// pxeWorkerConfig writes one file, so first boot's line shows files=1 from the server.
const pxeWorkerConfig = `variant: fcos
version: 1.6.0
storage:
  files:
    - path: /etc/kiln/pxe.txt
      mode: 0644
      contents:
        inline: booted from the network
`

// pxeControlPlaneConfig is the control plane's node.yaml: a one-member etcd on the disk with
// serial etcd-main, names in /etc/hosts (no DNS server needed).
const pxeControlPlaneConfig = `variant: fcos
version: 1.6.0
storage:
  files:
    - path: /etc/kiln/node.yaml
      mode: 0644
      contents:
        inline: |
          cluster: {name: demo, dnsZone: kiln.test}
          role: control-plane
          hostname: cp-a
          dns: {provider: hosts}
          etcd: {member: a, members: [a], volume: {serial: etcd-main}}
`

// PXE boots of images/metal.yaml from `kiln serve` on the host, through OVMF and the NIC's
// iPXE as on a rack, one bake and one server for all: a diskless worker runs live; a worker
// with one blank disk installs itself, reboots from the disk and is not installed again on
// its next boot; a disk holding a filesystem is refused and left byte for byte; a control
// plane installs beside its etcd disk without touching it. A disk boot of the same image
// gives the baseline the network boots are timed against.
func TestPXEBoots(t *testing.T) {
	top := newEnv(t)
	for _, tool := range []string{"mkfs.ext4", "debugfs", "blkid", "zstd", "sha256sum"} {
		_, err := exec.LookPath(tool)
		require(t, err == nil, "%s not installed", tool)
	}
	_, err := os.Stat("/usr/lib/ipxe/qemu/efi-virtio.rom")
	require(t, err == nil, "iPXE's efi-virtio.rom not installed (Debian package ipxe-qemu)")
	forTCGBoots(t, filepath.Join(top.repo, "images", "metal.yaml"))
	worker := top.bake("metal", "worker")
	cp := top.bake("metal", "control-plane")
	out := filepath.Dir(worker)
	compressForInstall(t, top, worker, cp)
	for name, text := range map[string]string{"machines.yaml": machinesYAML, "worker.bu": pxeWorkerConfig, "cp.bu": pxeControlPlaneConfig} {
		if err := os.WriteFile(filepath.Join(out, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	srv := startServe(t, top, out)
	figs := &pxeFigures{}
	sub := func(t *testing.T) *env { e := *top; e.t = t; return &e }

	t.Run("disk boot", func(t *testing.T) { testDiskBaseline(t, sub(t), worker, figs) })
	t.Run("live", func(t *testing.T) { testPXELive(t, sub(t), srv, figs) })
	t.Run("install", func(t *testing.T) { testPXEInstall(t, sub(t), srv, figs) })
	t.Run("refusal", func(t *testing.T) { testPXERefusal(t, sub(t), srv) })
	t.Run("control plane", func(t *testing.T) { testPXEControlPlane(t, sub(t), srv, figs) })
	figs.report(t, top)
}

// compressForInstall writes each raw image zstd-compressed beside it with its sha256 (the
// digest kiln serve hands out as kiln.install.image_sha256): the install streams some hundred
// MiB instead of the 4 GiB disk, most of it zeros, as one would serve a rack.
func compressForInstall(t *testing.T, e *env, raws ...string) {
	t.Helper()
	for _, raw := range raws {
		start := time.Now()
		e.run(filepath.Dir(raw), "zstd", "-q", "-f", "-3", "-T0", raw, "-o", raw+".zst")
		sum := e.run(filepath.Dir(raw), "sha256sum", filepath.Base(raw)+".zst")
		if err := os.WriteFile(raw+".zst.sha256", []byte(sum), 0o644); err != nil {
			t.Fatal(err)
		}
		fi, err := os.Stat(raw + ".zst")
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s.zst: %d MiB in %s", filepath.Base(raw), fi.Size()>>20, time.Since(start).Round(time.Millisecond))
	}
}

// forTCGBoots adds tsc=reliable to a definition's kernel arguments (see images/qemu.yaml): a
// bare-metal image boots under TCG with a clock read that does not trap.
func forTCGBoots(t *testing.T, def string) {
	t.Helper()
	b, err := os.ReadFile(def)
	if err != nil {
		t.Fatal(err)
	}
	s := strings.Replace(string(b), "\n  args:\n", "\n  args:\n    - tsc=reliable\n", 1)
	if !strings.Contains(s, "tsc=reliable") {
		t.Fatalf("%s: no kernel.args list to add tsc=reliable to", def)
	}
	if err := os.WriteFile(def, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

// pxeServer is `kiln serve` running on the host's loopback.
type pxeServer struct {
	// bootURL is the boot script's URL as a guest on QEMU's user network reaches it.
	bootURL string
	log     string
}

// startServe runs the kiln binary under test as `kiln serve dir` on a free port of 127.0.0.1
// and waits until it answers /healthz; it is stopped (SIGTERM) when the test ends.
func startServe(t *testing.T, e *env, dir string) *pxeServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	s := &pxeServer{bootURL: fmt.Sprintf("http://10.0.2.2:%d/boot.ipxe", port),
		log: filepath.Join(e.logDir(), fmt.Sprintf("kiln-serve-%d.log", time.Now().UnixNano()))}
	logf, err := os.Create(s.log)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(e.kiln, "serve", dir, "--listen", fmt.Sprintf("127.0.0.1:%d", port))
	cmd.Env, cmd.Stdout, cmd.Stderr = e.environ, logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait(); logf.Close() }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			cmd.Process.Kill()
			<-exited
			t.Errorf("kiln serve did not end within 15 s of SIGTERM")
		}
	})
	health := fmt.Sprintf("http://127.0.0.1:%d/healthz", port)
	for deadline := time.Now().Add(2 * time.Minute); ; {
		if resp, err := http.Get(health); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return s
			}
		}
		select {
		case err := <-exited:
			b, _ := os.ReadFile(s.log)
			t.Fatalf("kiln serve %s exited: %v\n%s", dir, err, b)
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(s.log)
			t.Fatalf("kiln serve did not answer %s within 2 minutes\n%s", health, b)
		}
	}
}

// stampedConsole records when each console line arrived, to time a boot's phases.
type stampedConsole struct {
	start   time.Time
	mu      sync.Mutex
	lines   []stamped
	partial string // a line not ended yet
}

type stamped struct {
	at   time.Duration
	line string
}

func newStampedConsole() *stampedConsole { return &stampedConsole{start: time.Now()} }

func (c *stampedConsole) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	lines := strings.Split(c.partial+string(p), "\n")
	c.partial = lines[len(lines)-1]
	for _, l := range lines[:len(lines)-1] {
		c.lines = append(c.lines, stamped{time.Since(c.start), strings.TrimRight(l, "\r")})
	}
	return len(p), nil
}

// last returns the last n lines.
func (c *stampedConsole) last(n int) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, l := range c.lines[max(0, len(c.lines)-n):] {
		out = append(out, l.line)
	}
	return strings.Join(out, "\n")
}

// at returns when the n-th (from 1) line matching re arrived, or -1.
func (c *stampedConsole) at(re *regexp.Regexp, n int) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, l := range c.lines {
		if re.MatchString(l.line) {
			if n--; n == 0 {
				return l.at
			}
		}
	}
	return -1
}

// count is the number of lines matching re.
func (c *stampedConsole) count(re *regexp.Regexp) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, l := range c.lines {
		if re.MatchString(l.line) {
			n++
		}
	}
	return n
}

// pxeFigures are the boots' times under TCG, from QEMU's start.
type pxeFigures struct {
	mu    sync.Mutex
	lines []string
}

func (f *pxeFigures) add(t *testing.T, format string, a ...any) {
	t.Helper()
	line := fmt.Sprintf(format, a...)
	t.Log(line)
	f.mu.Lock()
	f.lines = append(f.lines, line)
	f.mu.Unlock()
}

// report logs the figures together and, under KILN_TEST_LOGS, writes them to pxe-figures.txt.
func (f *pxeFigures) report(t *testing.T, e *env) {
	text := "PXE boots under TCG (from QEMU's start):\n  " + strings.Join(f.lines, "\n  ") + "\n"
	t.Log(text)
	if os.Getenv("KILN_TEST_LOGS") != "" {
		if err := os.WriteFile(filepath.Join(e.logDir(), "pxe-figures.txt"), []byte(text), 0o644); err != nil {
			t.Error(err)
		}
	}
}

func secs(d time.Duration) string {
	if d < 0 {
		return "-"
	}
	return fmt.Sprintf("%.1fs", d.Seconds())
}

// testDiskBaseline boots the worker's raw disk, without a config (platform metal reads none
// from fw_cfg): the disk boot the network boots are compared with.
func testDiskBaseline(t *testing.T, e *env, worker string, figs *pxeFigures) {
	disk := filepath.Join(e.dir, "disk-baseline.raw")
	copySparse(t, worker, disk)
	c := newStampedConsole()
	m, line := e.bootWith(vm.Config{Image: disk, Serial: c}, firstbootDone, 15*time.Minute)
	m.Stop()
	if firstbootOutcome(line) != nodeimage.OutcomeOK {
		t.Fatalf("disk boot: %s\n%s", line, tail(m.Lines(), 40))
	}
	figs.add(t, "disk boot (metal-worker.raw): kernel %s, firstboot ok %s",
		secs(c.at(kernelStart, 1)), secs(c.at(firstbootDone, 1)))
}

// testPXELive: a diskless worker boots from the network, as `kiln run --netboot` boots it,
// and runs from RAM to first boot's success with the config kiln serve rendered for it.
func testPXELive(t *testing.T, e *env, srv *pxeServer, figs *pxeFigures) {
	logf, err := os.Create(filepath.Join(e.logDir(), fmt.Sprintf("serial-live-%d.log", time.Now().UnixNano())))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	c := newStampedConsole()
	cmd := exec.Command(e.kiln, "run", "--netboot", srv.bootURL, "--mac", macLive, "--memory", "3072",
		"--accel", "tcg", "--until-firstboot", "--timeout", "15m")
	var stderr strings.Builder
	cmd.Env, cmd.Stdout, cmd.Stderr = e.environ, io.MultiWriter(logf, c), &stderr
	if err := cmd.Run(); err != nil || c.count(firstbootFromServe) != 1 {
		t.Fatalf("kiln run --netboot: %v, want exit 0 after first boot ok with the served config\n%s\n%s", err, stderr.String(), c.last(40))
	}
	if c.count(installLine) > 0 {
		t.Errorf("a live boot wrote a disk:\n%s", c.last(40))
	}
	figs.add(t, "PXE live (diskless, kiln run --netboot): iPXE %s, kernel %s, firstboot ok %s",
		secs(c.at(ipxeStart, 1)), secs(c.at(kernelStart, 1)), secs(c.at(firstbootDone, 1)))
}

// testPXEInstall: a machine with one blank disk installs the image onto it, reboots from the
// disk and reaches first boot's success with the served config; booted again with the network
// still offered, the disk boots itself and nothing is installed or configured again.
func testPXEInstall(t *testing.T, e *env, srv *pxeServer, figs *pxeFigures) {
	disk := filepath.Join(e.dir, "install-0.raw")
	sparseDisk(t, disk, 8<<30)
	cfg := vm.Config{Image: disk, Root: vm.Disk{Name: "install-0"}, NetBoot: &vm.NetBoot{BootFile: srv.bootURL, MAC: macInstall}}
	c := newStampedConsole()
	cfg.Serial = c
	m, line := e.bootWith(cfg, pxeDone, 20*time.Minute)
	m.Stop()
	if !firstbootFromServe.MatchString(line) {
		t.Fatalf("install: %q, want first boot ok with the served config\n%s", line, tail(m.Lines(), 60))
	}
	if c.count(installLine) != 1 || c.count(kernelStart) != 2 {
		t.Errorf("install: %d install lines and %d kernel starts, want one install and a reboot into the disk\n%s",
			c.count(installLine), c.count(kernelStart), tail(m.Lines(), 60))
	}
	figs.add(t, "PXE install (8 GiB blank disk, image zstd): iPXE %s, installer kernel %s, install started %s, written %s, disk kernel %s, firstboot ok %s",
		secs(c.at(ipxeStart, 1)), secs(c.at(kernelStart, 1)), secs(c.at(installStart, 1)), secs(c.at(installLine, 1)), secs(c.at(kernelStart, 2)), secs(c.at(firstbootDone, 1)))
	checkInstalledEntry(t, disk)

	c2 := newStampedConsole()
	cfg.Serial = c2
	m, line = e.bootWith(cfg, firstbootDone, 15*time.Minute)
	m.Stop()
	if firstbootOutcome(line) != nodeimage.OutcomeDone || c2.count(installStart) > 0 || c2.count(kernelStart) != 1 {
		t.Errorf("second boot of the installed disk: %q, %d installs, %d kernel starts; want the disk to boot itself once, first boot done already\n%s",
			line, c2.count(installStart), c2.count(kernelStart), tail(m.Lines(), 40))
	}
	figs.add(t, "installed disk, second boot (network offered): kernel %s, firstboot done %s",
		secs(c2.at(kernelStart, 1)), secs(c2.at(firstbootDone, 1)))
}

// checkInstalledEntry reads the installed disk's boot entry, as a disk boot's firmware would:
// it carries the served config's URL and no install or live parameter.
func checkInstalledEntry(t *testing.T, disk string) {
	t.Helper()
	bf, err := vm.ExtractBoot(t.Context(), disk, t.TempDir())
	if err != nil {
		t.Fatalf("installed disk: %v", err)
	}
	if !strings.Contains(bf.Cmdline, "kiln.config.url=http://10.0.2.2:") || !strings.Contains(bf.Cmdline, "root=PARTUUID=") ||
		strings.Contains(bf.Cmdline, "kiln.install.") || strings.Contains(bf.Cmdline, "kiln.live.") {
		t.Errorf("installed disk's loader entry: %q; want root=, the served kiln.config.url= and no install or live parameter", bf.Cmdline)
	}
}

// testPXERefusal: the install is told a disk that holds an ext4 filesystem with a file on it;
// it refuses, says why on the console, and the disk is unchanged.
func testPXERefusal(t *testing.T, e *env, srv *pxeServer) {
	disk := filepath.Join(e.dir, "olddata.raw")
	sparseDisk(t, disk, 6<<30) // larger than the image, so only its data can make the install refuse
	e.run(e.dir, "mkfs.ext4", "-q", "-F", "-L", "olddata", disk)
	precious := filepath.Join(e.dir, "precious.txt")
	if err := os.WriteFile(precious, []byte("a year of measurements\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	e.run(e.dir, "debugfs", "-w", "-R", "write "+precious+" /precious.txt", disk)
	before := testkit.FileSHA256(t, disk)
	m, line := e.bootWith(vm.Config{Image: disk, Root: vm.Disk{Name: "olddata"}, NetBoot: &vm.NetBoot{BootFile: srv.bootURL, MAC: macRefuse}},
		regexp.MustCompile(pxeDone.String()+"|"+installLine.String()), 15*time.Minute)
	m.Stop()
	if !installRefused.MatchString(line) || !strings.Contains(line, "ext4") {
		t.Errorf("install onto a disk holding ext4: %q, want a refusal that names the filesystem\n%s", line, tail(m.Lines(), 40))
	}
	if after := testkit.FileSHA256(t, disk); after != before {
		t.Errorf("the refused disk changed: sha256 %s -> %s", before, after)
	}
	if out, _ := exec.Command("debugfs", "-R", "cat /precious.txt", disk).Output(); string(out) != "a year of measurements\n" {
		t.Errorf("the file on the refused disk: %q", out)
	}
}

// testPXEControlPlane: a control plane installs by PXE with a blank install disk and a blank
// etcd disk (serial etcd-main, which its config names): install dev auto takes the install
// disk, first boot formats the etcd disk and puts etcd's manifest on it.
func testPXEControlPlane(t *testing.T, e *env, srv *pxeServer, figs *pxeFigures) {
	disk := filepath.Join(e.dir, "cp-install-0.raw")
	etcd := filepath.Join(e.dir, "cp-etcd-main.img")
	sparseDisk(t, disk, 8<<30)
	sparseDisk(t, etcd, 2<<30)
	c := newStampedConsole()
	m, line := e.bootWith(vm.Config{Image: disk, Root: vm.Disk{Name: "install-0"}, Disks: []vm.Disk{{Name: "etcd-main", Path: etcd}},
		NetBoot: &vm.NetBoot{BootFile: srv.bootURL, MAC: macCP}, Serial: c}, pxeDone, 25*time.Minute)
	m.Stop()
	if !firstbootFromServe.MatchString(line) {
		t.Fatalf("control plane install: %q, want first boot ok with the served config\n%s", line, tail(m.Lines(), 60))
	}
	figs.add(t, "PXE control plane install (+ blank etcd-main): written %s, disk kernel %s, firstboot ok %s",
		secs(c.at(installLine, 1)), secs(c.at(kernelStart, 2)), secs(c.at(firstbootDone, 1)))
	if d, err := diskfs.Open(disk, diskfs.WithOpenMode(diskfs.ReadOnly)); err != nil {
		t.Errorf("install disk: %v", err)
	} else {
		if _, err := d.GetPartitionTable(); err != nil {
			t.Errorf("install disk has no partition table: %v", err)
		}
		d.Close()
	}
	out, _ := exec.Command("blkid", "-p", etcd).CombinedOutput()
	if !strings.Contains(string(out), `TYPE="ext4"`) || !strings.Contains(string(out), `LABEL="etcd"`) || strings.Contains(string(out), "PTTYPE") {
		t.Errorf("etcd disk: blkid says %s; want etcd's ext4 on the whole disk, no image written to it", out)
	}
	if out, err := exec.Command("debugfs", "-R", "stat /manifests/etcd.manifest", etcd).CombinedOutput(); err != nil || strings.Contains(string(out), "not found") {
		t.Errorf("no etcd manifest on the etcd disk: %v %s", err, out)
	}
}
