package qemucluster

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kilnproject/kiln/initd/config"
	"github.com/kilnproject/kiln/internal/kubeconfig"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

var update = flag.Bool("update", false, "rewrite the golden files")

func testOptions(cps, workers int) Options { return testOptionsEtcd(cps, workers, 0) }

func testOptionsEtcd(cps, workers, etcd int) Options {
	o, err := Options{Name: "demo", ControlPlanes: cps, Workers: workers, EtcdNodes: etcd, StateDir: "/state"}.withDefaults()
	if err != nil {
		panic(err)
	}
	return o
}

func TestPlan(t *testing.T) {
	tests := []struct {
		name          string
		cps, workers  int
		etcd          int
		wantNames     []string
		wantAddresses []string
		wantMembers   []string
	}{
		{"one control plane, one worker", 1, 1, 0,
			[]string{"demo-cp-1", "demo-worker-1"}, []string{"192.168.100.11", "192.168.100.101"}, []string{"a", ""}},
		{"three control planes, two workers", 3, 2, 0,
			[]string{"demo-cp-1", "demo-cp-2", "demo-cp-3", "demo-worker-1", "demo-worker-2"},
			[]string{"192.168.100.11", "192.168.100.12", "192.168.100.13", "192.168.100.101", "192.168.100.102"},
			[]string{"a", "b", "c", "", ""}},
		{"control planes only", 3, 0, 0,
			[]string{"demo-cp-1", "demo-cp-2", "demo-cp-3"}, []string{"192.168.100.11", "192.168.100.12", "192.168.100.13"}, []string{"a", "b", "c"}},
		{"three etcd nodes, a control plane without a member, a worker", 1, 1, 3,
			[]string{"demo-etcd-1", "demo-etcd-2", "demo-etcd-3", "demo-cp-1", "demo-worker-1"},
			[]string{"192.168.100.21", "192.168.100.22", "192.168.100.23", "192.168.100.11", "192.168.100.101"},
			[]string{"a", "b", "c", "", ""}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			nodes := plan(testOptionsEtcd(tt.cps, tt.workers, tt.etcd), []int{16443, 16444, 16445}, nil)
			if len(nodes) != len(tt.wantNames) {
				t.Fatalf("%d nodes, want %d", len(nodes), len(tt.wantNames))
			}
			macs := map[string]bool{}
			for i, n := range nodes {
				if n.Name != tt.wantNames[i] || n.Address != tt.wantAddresses[i] || n.EtcdMember != tt.wantMembers[i] {
					t.Errorf("node %d = %s %s %q, want %s %s %q", i, n.Name, n.Address, n.EtcdMember, tt.wantNames[i], tt.wantAddresses[i], tt.wantMembers[i])
				}
				if macs[n.MAC] {
					t.Errorf("MAC %s given twice", n.MAC)
				}
				macs[n.MAC] = true
				if !strings.HasPrefix(n.MAC, "02:6b:") {
					t.Errorf("%s: MAC %s is not locally administered 02:6b:…", n.Name, n.MAC)
				}
				if (n.Role == RoleControlPlane) != (n.APIPort != 0) {
					t.Errorf("%s (%s): API port %d", n.Name, n.Role, n.APIPort)
				}
			}
		})
	}
	// Two clusters' MACs differ, one cluster's are the same on every plan.
	a, b := nodeMAC("one", "192.168.100.11"), nodeMAC("two", "192.168.100.11")
	if a == b || a != nodeMAC("one", "192.168.100.11") {
		t.Errorf("MACs: one %s, two %s", a, b)
	}
}

func TestOptionsRefused(t *testing.T) {
	tests := []struct {
		name string
		o    Options
		want string
	}{
		{"no name", Options{ControlPlanes: 1}, "--name"},
		{"bad name", Options{Name: "Demo_1", ControlPlanes: 1}, "--name"},
		{"two control planes", Options{Name: "demo", ControlPlanes: 2}, "--control-planes 2"},
		{"two etcd nodes", Options{Name: "demo", ControlPlanes: 1, EtcdNodes: 2}, "--etcd-nodes 2"},
		{"small etcd node", Options{Name: "demo", ControlPlanes: 1, EtcdNodes: 3, Etcd: Size{MemoryMB: 512}}, "--etcd-memory 512"},
		{"too many workers", Options{Name: "demo", ControlPlanes: 1, Workers: MaxWorkers + 1}, "--workers"},
		{"small memory", Options{Name: "demo", ControlPlanes: 1, Worker: Size{MemoryMB: 512}}, "--worker-memory 512"},
		{"zero cpus stays default, negative refused", Options{Name: "demo", ControlPlanes: 1, ControlPlane: Size{CPUs: -1}}, "--cp-cpus -1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tt.o.withDefaults()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want one naming %q", err, tt.want)
			}
		})
	}
}

func TestHostsFile(t *testing.T) {
	o := testOptions(3, 1)
	s := &State{Name: o.Name, Zone: o.Zone, Nodes: plan(o, []int{1, 2, 3}, nil)}
	got := s.HostsFile()
	golden := filepath.Join("testdata", "hosts-3cp-1w.golden")
	if *update {
		os.WriteFile(golden, []byte(got), 0o644)
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Errorf("hosts file:\n%s\nwant (%s):\n%s", got, golden, want)
	}
	// The API name has one address per control plane, the etcd names one each.
	names := s.Names()
	if api := names["api.internal.demo.kiln.test"]; len(api) != 3 {
		t.Errorf("api name has %v, want three addresses", api)
	}
	if e := names["etcd-b.internal.demo.kiln.test"]; len(e) != 1 || e[0] != "192.168.100.12" {
		t.Errorf("etcd-b has %v, want 192.168.100.12", e)
	}
	// In the external topology the etcd names are the etcd nodes'; the API name the
	// control plane's only.
	o = testOptionsEtcd(1, 1, 3)
	names = (&State{Name: o.Name, Zone: o.Zone, Nodes: plan(o, []int{1}, nil)}).Names()
	if e := names["etcd-c.internal.demo.kiln.test"]; len(e) != 1 || e[0] != "192.168.100.23" {
		t.Errorf("etcd-c has %v, want the etcd node 192.168.100.23", e)
	}
	if api := names["api.internal.demo.kiln.test"]; len(api) != 1 || api[0] != "192.168.100.11" {
		t.Errorf("api name has %v, want the control plane 192.168.100.11 only", api)
	}
}

// fakeImages writes small qcow2 images (real qemu-img) as a bake's output would hold them.
func fakeImages(t *testing.T, roles ...string) string {
	t.Helper()
	if _, err := exec.LookPath("qemu-img"); err != nil {
		t.Skip("qemu-img not installed")
	}
	dir := t.TempDir()
	for _, r := range roles {
		if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", filepath.Join(dir, "qemu-"+r+".qcow2"), "64M").CombinedOutput(); err != nil {
			t.Fatalf("qemu-img: %v: %s", err, out)
		}
	}
	return dir
}

func TestCreateLayout(t *testing.T) {
	images := fakeImages(t, RoleControlPlane, RoleWorker)
	state := filepath.Join(t.TempDir(), "demo")
	o := Options{Name: "demo", ControlPlanes: 3, Workers: 1, ImageDir: images, StateDir: state, Accel: "tcg", APIPort: 20443}
	s, err := Create(context.Background(), o, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []struct {
		path string
		mode os.FileMode
	}{
		{".", 0o700 | os.ModeDir},
		{"cluster.json", 0o600},
		{"admin.conf", 0o600},
		{"init/pki/ca.key", 0o600},
		{"nodes/demo-cp-1/config.ign", 0o600},
		{"nodes/demo-cp-1/disk.qcow2", 0},
		{"nodes/demo-cp-1/etcd.qcow2", 0},
		{"nodes/demo-cp-3/etcd.qcow2", 0},
		{"nodes/demo-worker-1/config.ign", 0o600},
		{"nodes/demo-worker-1/disk.qcow2", 0},
	} {
		fi, err := os.Stat(filepath.Join(state, f.path))
		if err != nil {
			t.Errorf("%s: %v", f.path, err)
			continue
		}
		if f.mode != 0 && fi.Mode()&(os.ModeDir|os.ModePerm) != f.mode {
			t.Errorf("%s: mode %v, want %v", f.path, fi.Mode(), f.mode)
		}
	}
	if _, err := os.Stat(filepath.Join(state, "nodes/demo-worker-1/etcd.qcow2")); err == nil {
		t.Error("the worker has an etcd disk")
	}
	// The node's disk is an overlay on the baked image, not a copy.
	out, err := exec.Command("qemu-img", "info", "--output=json", filepath.Join(state, "nodes/demo-cp-2/disk.qcow2")).Output()
	if err != nil {
		t.Fatal(err)
	}
	var info struct {
		Backing string `json:"full-backing-filename"`
	}
	json.Unmarshal(out, &info)
	if want := filepath.Join(images, "qemu-control-plane.qcow2"); info.Backing != want {
		t.Errorf("cp-2's disk is backed by %q, want %s", info.Backing, want)
	}
	// The config carries the cluster's names, its address, and cluster init's node.yaml.
	raw, _ := os.ReadFile(filepath.Join(state, "nodes/demo-cp-2/config.ign"))
	c, err := config.Parse(raw)
	if err != nil {
		t.Fatalf("config.ign: %v", err)
	}
	files := map[string]string{}
	for _, f := range c.Ignition.Storage.Files {
		if f.Contents.Source != nil {
			files[f.Path] = *f.Contents.Source
		}
	}
	for _, p := range []string{"/etc/hosts", "/etc/systemd/network/10-kiln-cluster.network", "/etc/kiln/node.yaml"} {
		if _, ok := files[p]; !ok {
			t.Errorf("config.ign of cp-2 writes no %s (files: %v)", p, keys(files))
		}
	}
	// admin.conf points at cp-1's forwarded port.
	admin, _ := os.ReadFile(s.Kubeconfig())
	if !strings.Contains(string(admin), "https://127.0.0.1:20443") || !strings.Contains(string(admin), "tls-server-name: kubernetes") {
		t.Errorf("admin.conf:\n%s", admin)
	}
	// ... and has a context per control plane, for when cp-1 is down.
	kf, err := kubeconfig.Decode(admin)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range s.Nodes {
		if n.Role != RoleControlPlane {
			continue
		}
		kf.CurrentContext = n.Name
		kc, err := kf.Resolve(nil)
		if err != nil || kc.Server != fmt.Sprintf("https://127.0.0.1:%d", n.APIPort) || kc.TLSServerName != "kubernetes" || len(kc.CertPEM) == 0 {
			t.Errorf("admin.conf context %s: %+v, %v", n.Name, kc, err)
		}
	}
	// Load reads back what Create wrote.
	l, err := Load(state)
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Nodes) != 4 || l.Nodes[2].APIPort != 20445 || l.Link != "kiln-cluster-demo" {
		t.Errorf("loaded %+v", l)
	}
}

// The external topology: each etcd node has a disk on the etcd image and an etcd disk, the
// control plane no etcd disk, and its node.yaml names the etcd nodes' members.
func TestCreateExternalEtcd(t *testing.T) {
	images := fakeImages(t, RoleControlPlane, RoleWorker, RoleEtcd)
	state := filepath.Join(t.TempDir(), "demo")
	key := "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl test@kiln"
	o := Options{Name: "demo", ControlPlanes: 1, Workers: 1, EtcdNodes: 3, ImageDir: images, StateDir: state, Accel: "tcg",
		SSHKeys: []string{key}}
	s, err := Create(context.Background(), o, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"nodes/demo-etcd-1/etcd.qcow2", "nodes/demo-etcd-3/etcd.qcow2", "nodes/demo-cp-1/disk.qcow2"} {
		if _, err := os.Stat(filepath.Join(state, p)); err != nil {
			t.Error(err)
		}
	}
	if _, err := os.Stat(filepath.Join(state, "nodes/demo-cp-1/etcd.qcow2")); err == nil {
		t.Error("the control plane of the external topology has an etcd disk")
	}
	cp, _ := s.Node("demo-cp-1")
	if admin, _ := os.ReadFile(s.Kubeconfig()); !strings.Contains(string(admin), fmt.Sprintf("server: https://127.0.0.1:%d", cp.APIPort)) {
		t.Errorf("admin.conf does not name the control plane's port %d:\n%s", cp.APIPort, admin)
	}
	out, err := exec.Command("qemu-img", "info", "--output=json", filepath.Join(state, "nodes/demo-etcd-2/disk.qcow2")).Output()
	if err != nil {
		t.Fatal(err)
	}
	var info struct {
		Backing string `json:"full-backing-filename"`
	}
	json.Unmarshal(out, &info)
	if want := filepath.Join(images, "qemu-etcd.qcow2"); info.Backing != want {
		t.Errorf("etcd-2's disk is backed by %q, want %s", info.Backing, want)
	}
	// --ssh-key: every node lets root in with the key, runs its ssh server, has a port.
	for _, n := range s.Nodes {
		raw, _ := os.ReadFile(filepath.Join(state, "nodes", n.Name, "config.ign"))
		c, err := config.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		if users := c.SSHUsers(); len(users) != 1 || users[0] != "root" || !strings.Contains(string(raw), key) {
			t.Errorf("%s: ssh users %v", n.Name, users)
		}
		if n.SSHPort == 0 || !strings.Contains(string(raw), `"name":"ssh.service"`) {
			t.Errorf("%s: ssh port %d, ssh.service not enabled", n.Name, n.SSHPort)
		}
	}
	raw, _ := os.ReadFile(filepath.Join(state, "init/demo-cp-1.ign"))
	c, err := config.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	files, err := c.Files()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if f.Path == nodeimage.NodeConfigPath && !strings.Contains(string(f.Contents), "external: true") {
			t.Errorf("the control plane's node.yaml:\n%s", f.Contents)
		}
	}
}

func keys(m map[string]string) []string {
	var k []string
	for p := range m {
		k = append(k, p)
	}
	return k
}

func TestCreateRefuses(t *testing.T) {
	images := fakeImages(t, RoleControlPlane)
	existing := filepath.Join(t.TempDir(), "demo")
	if _, err := Create(context.Background(), Options{Name: "demo", ControlPlanes: 1, ImageDir: images, StateDir: existing, Accel: "tcg"}, time.Now()); err != nil {
		t.Fatal(err)
	}
	other := t.TempDir()
	os.WriteFile(filepath.Join(other, "notes"), []byte("mine"), 0o644)
	tests := []struct {
		name string
		o    Options
		want []string
	}{
		{"a second up of the same cluster", Options{Name: "demo", ControlPlanes: 1, ImageDir: images, StateDir: existing},
			[]string{"already exists", "kiln cluster down --state-dir " + existing}},
		{"a directory holding something else", Options{Name: "demo", ControlPlanes: 1, ImageDir: images, StateDir: other},
			[]string{"not empty"}},
		{"no worker image", Options{Name: "demo", ControlPlanes: 1, Workers: 1, ImageDir: images, StateDir: filepath.Join(t.TempDir(), "x")},
			[]string{"no worker image", "qemu-worker.qcow2", "kiln bake"}},
		{"no etcd image", Options{Name: "demo", ControlPlanes: 1, EtcdNodes: 3, ImageDir: images, StateDir: filepath.Join(t.TempDir(), "x")},
			[]string{"no etcd image", "qemu-etcd.qcow2", "--role etcd"}},
		{"no image directory", Options{Name: "demo", ControlPlanes: 1, ImageDir: "/nonexistent", StateDir: filepath.Join(t.TempDir(), "x")},
			[]string{"no control-plane image", "--image-dir"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Create(context.Background(), tt.o, time.Now())
			for _, w := range tt.want {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Errorf("error %v, want it to say %q", err, w)
				}
			}
		})
	}
	// The refused directory is untouched.
	if b, _ := os.ReadFile(filepath.Join(other, "notes")); string(b) != "mine" {
		t.Error("a refused state directory was changed")
	}
	if _, err := os.Stat(filepath.Join(existing, "cluster.json")); err != nil {
		t.Errorf("the existing cluster lost its state: %v", err)
	}
}

// A real process stands in for QEMU. The pid file records it (pid, start time, argv): a
// process whose command line merely names the node's directory (a `tail -f` of its console,
// worker-10's QEMU for worker-1) or that took over the pid is not the node's.
func TestPidHandling(t *testing.T) {
	dir := t.TempDir()
	s := &State{Name: "demo", Dir: dir, Nodes: []Node{{Name: "demo-cp-1", Role: RoleControlPlane}}}
	node := "demo-cp-1"
	os.MkdirAll(s.nodeDir(node), 0o700)
	if pid := s.Running(node); pid != 0 {
		t.Fatalf("no pid file: Running = %d", pid)
	}
	argv := []string{"/bin/sh", "-c", "sleep 60; true", s.nodeDir(node)}
	pid, err := startDetached(argv, s.nodeFile(node, qemuLogFile), 0)
	if err != nil {
		t.Fatal(err)
	}
	rec, err := recordProcess(pid, argv)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopProcess(rec, time.Second) })
	if err := writeProcRecord(s.pidFile(node), rec); err != nil {
		t.Fatal(err)
	}
	if got := s.Running(node); got != pid {
		t.Fatalf("Running = %d, want %d", got, pid)
	}
	// Another process whose command line contains the node's directory, recorded with the
	// argv kiln would have used: not the node's.
	other := []string{"/bin/sh", "-c", "sleep 60; true", s.nodeDir(node) + "0"}
	opid, err := startDetached(other, s.nodeFile(node, qemuLogFile), 0)
	if err != nil {
		t.Fatal(err)
	}
	orec, _ := recordProcess(opid, other)
	t.Cleanup(func() { stopProcess(orec, time.Second) })
	for _, tc := range []struct {
		name string
		rec  procRecord
	}{
		{"a process naming the node's directory among other words", procRecord{PID: opid, Start: orec.Start, Argv: argv}},
		{"the same command line, another start time (a reused pid)", procRecord{PID: pid, Start: rec.Start + 1, Argv: argv}},
		{"this test's own pid", procRecord{PID: os.Getpid(), Start: rec.Start, Argv: argv}},
	} {
		if tc.rec.alive() {
			t.Errorf("%s: taken for the node's QEMU", tc.name)
		}
	}
	if err := s.StopNode(node, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if got := s.Running(node); got != 0 {
		t.Errorf("after stop: Running = %d", got)
	}
	if _, err := os.Stat(s.pidFile(node)); err == nil {
		t.Error("stop left the pid file")
	}
	if !orec.alive() {
		t.Error("stopping the node ended another process")
	}
	// A record of an ended process; an unreadable pid file.
	writeProcRecord(s.pidFile(node), rec)
	if got := s.Running(node); got != 0 {
		t.Errorf("pid of an ended process: Running = %d", got)
	}
	os.WriteFile(s.pidFile(node), []byte(strconv.Itoa(opid)+"\n"), 0o644)
	if got := s.Running(node); got != 0 {
		t.Errorf("a bare pid (no record): Running = %d", got)
	}
	// Stopping a stopped node, or one that does not exist.
	if err := s.StopNode(node, time.Second); err != nil {
		t.Errorf("stop a stopped node: %v", err)
	}
	if err := s.StopNode("demo-cp-9", time.Second); err == nil || !strings.Contains(err.Error(), "demo-cp-1") {
		t.Errorf("stop an unknown node: %v, want the list of nodes", err)
	}
}

func TestSerialArgs(t *testing.T) {
	got, err := serialArgs([]string{"-m", "2048", "-chardev", "stdio,id=serial0,signal=off", "-serial", "chardev:serial0"}, "/s/a,b/console.log")
	if err != nil {
		t.Fatal(err)
	}
	if got[3] != "file,id=serial0,append=on,path=/s/a,,b/console.log" {
		t.Errorf("chardev %q", got[3])
	}
	if _, err := serialArgs([]string{"-m", "1"}, "x"); err == nil {
		t.Error("no serial console: no error")
	}
}

func TestConsoleAndUsage(t *testing.T) {
	dir := t.TempDir()
	s := &State{Name: "demo", Dir: dir, Nodes: []Node{{Name: "n"}}}
	os.MkdirAll(s.nodeDir("n"), 0o700)
	if got := s.console("n"); got != (bootConsole{}) {
		t.Errorf("no console: %+v", got)
	}
	os.WriteFile(s.ConsoleLog("n"), []byte("[ 1.0] booting\n[ 30.1] kiln-init: firstboot ok source=fw_cfg files=2 duration=1s\n"+
		"[ 80.2] kiln-init: etcd member b failed: context deadline exceeded\n[ 2.0] rebooted\n"+
		"[ 9.5] kiln-init: firstboot done already (2026-12-04T12:00:00Z)\n"), 0o644)
	if got := s.console("n"); got.FirstBoot != "done already 2026-12-04T12:00:00Z" || got.Etcd != "failed: context deadline exceeded" {
		t.Errorf("console = %+v", got)
	}
	appendLine(s.ConsoleLog("n"), "[ 60.0] kiln-init: etcd member b is a voting member after 41s (promoted from learner)")
	if got := s.console("n"); got.Etcd != etcdVoting {
		t.Errorf("etcd after the voting line = %q", got.Etcd)
	}
	// A new boot has printed nothing yet: an earlier boot's lines are not its.
	appendLine(s.ConsoleLog("n"), "[ 3.0] kiln-init: firstboot failed: etcd disk not found")
	appendLine(s.ConsoleLog("n"), bootMarker+"2026-12-04T13:00:00Z")
	if got := s.console("n"); got != (bootConsole{}) {
		t.Errorf("console after a new boot's marker = %+v", got)
	}
	rss, cpu := procUsage(os.Getpid())
	if rss <= 0 || cpu < 0 {
		t.Errorf("own usage: %d MiB, %.2f s", rss, cpu)
	}
}

// A node restarted after being Ready keeps its old Ready condition until its kubelet reports
// again: the wait must not take that for the new boot's.
func TestReadySince(t *testing.T) {
	started := time.Date(2026, 12, 4, 13, 10, 45, 0, time.UTC)
	tests := []struct {
		name string
		cond readyCondition
		want bool
	}{
		{"reported Ready after the start", readyCondition{"True", started.Add(90 * time.Second)}, true},
		{"reported Ready the second it started", readyCondition{"True", started}, true},
		{"Ready from before the restart", readyCondition{"True", started.Add(-4 * time.Minute)}, false},
		{"NotReady after the start", readyCondition{"False", started.Add(time.Minute)}, false},
		{"Unknown", readyCondition{Status: "Unknown"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.cond.readySince(started); got != tt.want {
				t.Errorf("readySince = %v, want %v", got, tt.want)
			}
		})
	}
}

// A niced node's process has its niceness from its first instruction: so do the processes
// and threads it starts at once (QEMU's vCPU threads), and kiln's own threads keep theirs.
func TestStartDetachedNice(t *testing.T) {
	dir := t.TempDir()
	own, err := syscall.Getpriority(syscall.PRIO_PROCESS, 0)
	if err != nil {
		t.Fatal(err)
	}
	argv := []string{"/bin/sh", "-c", "sleep 60 & wait"}
	pid, err := startDetached(argv, filepath.Join(dir, "log"), 7)
	if err != nil {
		t.Fatal(err)
	}
	rec, err := recordProcess(pid, argv)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(-pid, syscall.SIGKILL); stopProcess(rec, time.Second) })
	var child int
	for deadline := time.Now().Add(5 * time.Second); child == 0 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		c, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
		fmt.Sscan(string(c), &child)
	}
	if child == 0 {
		t.Fatal("the shell started no child")
	}
	want := max(7, niceOf(t, os.Getpid()))
	for _, p := range []int{pid, child} {
		if got := niceOf(t, p); got != want {
			t.Errorf("process %d runs at nice %d, want %d", p, got, want)
		}
	}
	if got, _ := syscall.Getpriority(syscall.PRIO_PROCESS, 0); got != own {
		t.Errorf("this process's priority changed from %d to %d", own, got)
	}
}

// niceOf reads a process's niceness from /proc/PID/stat (field 19).
func niceOf(t *testing.T, pid int) int {
	t.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	s := string(raw)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	n, err := strconv.Atoi(fields[16])
	if err != nil {
		t.Fatal(err)
	}
	return n
}
