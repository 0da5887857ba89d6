package qemutests

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kilnproject/kiln/builder/bake"
	"github.com/kilnproject/kiln/builder/vm"
	"github.com/kilnproject/kiln/initd/config"
	"github.com/kilnproject/kiln/internal/nodeimage"
	"github.com/kilnproject/kiln/internal/testkit"
)

// The end-to-end cluster (make e2e, KILN_E2E=1): Kubernetes built from source through the
// Go module proxy, served to the bake as pinned artifacts and a local registry, one control
// plane (with its etcd disk) and one worker booted offline under TCG, checked from the host.

const (
	e2eCluster    = "e2e"
	e2eZone       = "kiln.test"
	cpAddr        = "192.168.100.10"
	workerAddr    = "192.168.100.20"
	e2eLinkPrefix = "kiln-e2e"
)

// e2eCacheDir is where build-components.sh keeps the components.
func e2eCacheDir() string { return testkit.E2ECache() }

// e2eStep runs one named step of the end-to-end test, logging its duration.
func e2eStep(t *testing.T, name string, f func()) time.Duration {
	t.Helper()
	start := time.Now()
	t.Logf("e2e: %s …", name)
	f()
	d := time.Since(start)
	t.Logf("e2e: %s done in %s", name, d.Round(100*time.Millisecond))
	return d
}

func TestE2ECluster(t *testing.T) {
	if os.Getenv("KILN_E2E") != "1" {
		t.Skip("the end-to-end cluster runs with make e2e (KILN_E2E=1)")
	}
	runE2ECluster(t, false)
}

// The same cluster baked --without-images (make e2e-pull): the nodes are not offline but
// pull every image from the local registry on the host (10.0.2.2:5000 from a guest) through
// a containerd registry mirror their Ignition configs carry. It measures what pre-pulling
// saves; make e2e stays the offline proof.
func TestE2EClusterWithoutImages(t *testing.T) {
	if os.Getenv("KILN_E2E_PULL") != "1" {
		t.Skip("the pulling end-to-end cluster runs with make e2e-pull (KILN_E2E_PULL=1)")
	}
	runE2ECluster(t, true)
}

// registryMirror is the containerd hosts.toml sending registry.k8s.io pulls to the e2e
// registry, as a guest on QEMU user networking reaches the host's 127.0.0.1:5000.
const registryMirror = `server = "https://registry.k8s.io"

[host."http://10.0.2.2:5000"]
  capabilities = ["pull", "resolve"]
`

func runE2ECluster(t *testing.T, pull bool) {
	e := newRepoEnv(t)
	// KILN_E2E_IMPORT=1 (make e2e-import): the images baked as a layout only (--import-images),
	// imported at first boot, as before the bake laid containerd's store: what the store saves.
	imported := !pull && os.Getenv("KILN_E2E_IMPORT") == "1"
	var bakeArgs []string
	if imported {
		bakeArgs = []string{"--import-images"}
	}
	out, bin := bakeE2EImages(t, e, pull, bakeArgs...)

	p := kilnNodePair(t, e, out, bin, pull)
	cpName, workerName, kubectl := p.CPName, p.WorkerName, p.Kubectl
	// A cluster that does not come up says where its time went (run before the VMs stop).
	diagnosed := false
	p.OnCPUp = func() {
		t.Cleanup(func() {
			if t.Failed() && !diagnosed {
				diagnose(t, kubectl, cpName, workerName)
			}
		})
	}
	run := bootPair(t, e, p)
	start, cpVM, workerVM := run.Start, run.CPVM, run.WorkerVM

	// A pod runs on the worker, from a pre-pulled image (the guests have no route to a
	// registry) or, without images, from the one containerd pulled for its sandboxes.
	pod := fmt.Sprintf(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"e2e-pause","namespace":"default"},
"spec":{"nodeName":%q,"containers":[{"name":"pause","image":"registry.k8s.io/pause:3.10.2","imagePullPolicy":"Never"}]}}`, workerName)
	podFile := filepath.Join(e.dir, "pod.json")
	os.WriteFile(podFile, []byte(pod), 0o644)
	if out, err := kubectl("apply", "-f", podFile); err != nil {
		t.Fatalf("create pod: %v\n%s", err, out)
	}
	podStart := time.Now()
	waitFor(t, "the pod runs on the worker", 10*time.Minute, func() (bool, string) {
		out, err := kubectl("get", "pod", "e2e-pause", "-o", "jsonpath={.status.phase} {.spec.nodeName} {.status.podIP}")
		return err == nil && strings.HasPrefix(out, "Running "+workerName), out
	})
	t.Logf("e2e: pod running on %s after %s", workerName, time.Since(podStart).Round(time.Second))
	if out, err := kubectl("get", "node", workerName, "-o", "jsonpath={.status.nodeInfo.containerRuntimeVersion}"); err != nil || e2eDocker() != strings.HasPrefix(out, "docker://") {
		t.Errorf("the worker's container runtime is %q (%v); Docker wanted: %t", out, err, e2eDocker())
	} else {
		t.Logf("e2e: the worker's container runtime: %s", out)
	}
	if e2eDocker() {
		// Docker Engine runs the pod: docker ps on the worker lists its containers.
		line := waitForLine(t, workerVM, regexp.MustCompile(`kiln-e2e-docker: .*`), 5*time.Minute)
		if !strings.Contains(line, "k8s_pause_e2e-pause_default_") || !strings.Contains(line, "k8s_POD_e2e-pause_default_") {
			t.Errorf("docker ps on the worker does not show the pod's container and sandbox: %s", line)
		}
		t.Logf("e2e: %s", line[strings.Index(line, "kiln-e2e-docker: "):])
	}

	// The cluster's DNS serves: CoreDNS (an addon kiln-control-plane applied) has a ready
	// replica, offline too (no upstream name server: it answers the cluster's names only).
	dnsStart := time.Now()
	waitFor(t, "CoreDNS has a ready replica", 8*time.Minute, func() (bool, string) {
		out, err := kubectl("get", "deployment", "coredns", "-n", "kube-system", "-o", "jsonpath={.status.readyReplicas}/{.status.replicas}")
		return err == nil && out != "" && !strings.HasPrefix(out, "/") && !strings.HasPrefix(out, "0/"), out
	})
	t.Logf("e2e: CoreDNS ready %s after the control plane started (waited %s after the pod ran)", time.Since(start).Round(time.Second), time.Since(dnsStart).Round(time.Second))

	// Every node routes Services: kube-proxy (the other addon) is ready on both, its image
	// imported from the worker's pre-pulled set as well.
	waitFor(t, "kube-proxy is ready on every node", 10*time.Minute, func() (bool, string) {
		out, err := kubectl("get", "daemonset", "kube-proxy", "-n", "kube-system", "-o", "jsonpath={.status.numberReady}/{.status.desiredNumberScheduled}")
		return err == nil && out == "2/2", out
	})
	t.Logf("e2e: kube-proxy ready on both nodes %s after the control plane started", time.Since(start).Round(time.Second))
	if !pull {
		// The images were ready when containerd first started: laid in its store at bake,
		// nothing imported at boot (or, with --import-images, all of them imported).
		for name, m := range map[string]*vm.Machine{cpName: cpVM, workerName: workerVM} {
			requireImports(t, name, m.Lines(), imported)
		}
	}
	diagnosed = true
	diagnose(t, kubectl, cpName, workerName)
}

// imagesLine is kiln-images' (and kiln-images-rest's) summary on the console.
var imagesLine = regexp.MustCompile(`kiln-init: (images(?:-kubelet)?) ok .* (\d+) images, (\d+) imported`)

// requireImports fails unless the node's console shows both image stages done with nothing
// imported (containerd found every pre-pulled image in the store laid at bake) or, when
// imported, with images imported.
func requireImports(t *testing.T, node string, console []string, imported bool) {
	t.Helper()
	seen := map[string]bool{}
	for _, l := range console {
		m := imagesLine.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		seen[m[1]] = true
		t.Logf("e2e: %s: %s", node, l[strings.Index(l, "kiln-init: "):])
		switch {
		case !imported && m[3] != "0":
			t.Errorf("%s imported %s images at boot; want none (the bake laid them in containerd's store): %s", node, m[3], l)
		case imported && m[3] == "0":
			t.Errorf("%s imported no image at boot, baked --import-images: %s", node, l)
		}
	}
	if !seen["images-kubelet"] || !seen["images"] {
		t.Errorf("%s: the console shows no summary of images-kubelet and images (saw %v)", node, seen)
	}
}

// lastN keeps the last n lines of s.
func lastN(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// waitFor polls check every 5 s until it holds or timeout passes; the test fails naming what
// it waited for and the last thing check saw.
func waitFor(t *testing.T, what string, timeout time.Duration, check func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	last := ""
	for {
		ok, seen := check()
		if ok {
			return
		}
		if seen != last {
			t.Logf("e2e: waiting until %s: %s", what, seen)
			last = seen
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after %s; last seen: %s", what, timeout, seen)
		}
		time.Sleep(5 * time.Second)
	}
}

// nodeConfigWithAddress merges a node's Ignition config with the network the e2e gives it:
// a static address on the cluster link (the node's primary interface: it holds the default
// route, which leads nowhere), leaving the user-mode NIC for the host's forwarded ports and,
// with mirror, containerd's registry mirror on the host.
func nodeConfigWithAddress(t *testing.T, ign, addr, dir string, mirror bool) string {
	t.Helper()
	raw, err := os.ReadFile(ign)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, filepath.Base(ign))
	if err := os.WriteFile(p, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	return mergeButane(t, p, fmt.Sprintf(`variant: fcos
version: 1.6.0
storage:
  files:
    - path: /etc/systemd/network/10-kiln-e2e.network
      mode: 0644
      contents:
        inline: |
          [Match]
          MACAddress=%s
          [Network]
          Address=%s/24
          Gateway=192.168.100.1
%s`, linkMAC(addr), addr, mirrorFile(mirror)))
}

// mirrorFile is the Butane storage.files entry of the registry mirror (empty without).
func mirrorFile(mirror bool) string {
	if !mirror {
		return ""
	}
	var b strings.Builder
	b.WriteString("    - path: /etc/containerd/certs.d/registry.k8s.io/hosts.toml\n      mode: 0644\n      contents:\n        inline: |\n")
	for _, l := range strings.Split(strings.TrimSuffix(registryMirror, "\n"), "\n") {
		b.WriteString("          " + l + "\n")
	}
	return b.String()
}

// serveDir serves dir (created if missing) over HTTP on 127.0.0.1 for the test's lifetime
// and returns its URL.
func serveDir(t *testing.T, dir string) string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.FileServer(http.Dir(dir))}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return fmt.Sprintf("http://%s", l.Addr())
}

// logImageSize logs the raw image's allocated size and the qcow2's size.
func logImageSize(t *testing.T, stem string) {
	t.Helper()
	var raw, qcow int64
	if fi, err := os.Stat(stem + ".raw"); err == nil {
		raw = testkit.Allocated(fi)
	}
	if fi, err := os.Stat(stem + ".qcow2"); err == nil {
		qcow = fi.Size()
	}
	t.Logf("e2e: %s: raw %d MiB allocated, qcow2 %d MiB", filepath.Base(stem), raw>>20, qcow>>20)
}

// linkMAC is the MAC of a node's cluster-link NIC, derived from its address so the
// network file can match it: 52:54:00:e2:<third octet>:<fourth octet>.
func linkMAC(addr string) string {
	ip := net.ParseIP(addr).To4()
	return fmt.Sprintf("52:54:00:e2:%02x:%02x", ip[2], ip[3])
}

// scanImageForSecrets unpacks a baked image's root filesystem and fails the test if any
// private key or bootstrap token is in it: secrets reach a node only through its config.
func scanImageForSecrets(t *testing.T, raw string) {
	t.Helper()
	dir := t.TempDir()
	part, err := extractPartition(raw, nodeimage.RootAName, dir)
	if err != nil {
		t.Fatal(err)
	}
	tree := filepath.Join(dir, "tree")
	if out, err := exec.Command("unsquashfs", "-q", "-n", "-d", tree, part).CombinedOutput(); err != nil {
		t.Fatalf("unsquashfs %s: %v\n%s", raw, err, out)
	}
	findings, err := bake.ScanSecrets(os.DirFS(tree))
	if err != nil {
		t.Fatalf("scan %s: %v", raw, err)
	}
	for _, f := range findings {
		t.Errorf("%s holds a secret: %v", filepath.Base(raw), f)
	}
	t.Logf("e2e: %s: no private key or token in the root filesystem", filepath.Base(raw))
	os.RemoveAll(tree)
}

// bakeE2EImages builds the components from source (cached), serves them and bakes the
// control-plane and worker images into e.dir/out; it returns that directory and the
// directory of the built binaries (kubectl among them).
func bakeE2EImages(t *testing.T, e *env, pull bool, extra ...string) (out, bin string) {
	return bakeE2ERoles(t, e, []string{"control-plane", "worker"}, pull, extra...)
}

// bakeE2ERoles is bakeE2EImages for the roles named (images/qemu.yaml's profiles).
func bakeE2ERoles(t *testing.T, e *env, roles []string, pull bool, extra ...string) (out, bin string) {
	t.Helper()
	root := repoRoot(t)
	cache := e2eCacheDir()
	bin = filepath.Join(cache, "bin")
	e.environ = append(e.environ, "KILN_E2E_CACHE="+cache)
	docker := e2eDocker()
	e2eStep(t, "components built from source", func() {
		e.run(root, "bash", "qemu-tests/e2e/build-components.sh")
		if docker {
			e.run(root, "bash", "qemu-tests/e2e/build-components.sh", "docker")
		}
	})

	overlay := filepath.Join(e.dir, "e2e-overlay.yaml")
	dockerOverlay := filepath.Join(e.dir, "e2e-docker-overlay.yaml")
	e2eStep(t, "images pushed to the local registry, artifacts packed and served", func() {
		e.run(root, "bash", "qemu-tests/e2e/registry.sh", "start")
		dir := filepath.Join(e.dir, "artifacts")
		url := serveDir(t, dir)
		args := []string{"run", "./qemu-tests/e2e/images", "-bin", bin,
			"-iptables", filepath.Join(cache, "rootfs", "iptables"), "-registry", "127.0.0.1:5000",
			"-artifacts", dir, "-overlay", overlay, "-artifact-url", url}
		if docker {
			args = append(args, "-docker-overlay", dockerOverlay)
		}
		e.run(root, "go", args...)
	})

	out = filepath.Join(e.dir, "out")
	if pull {
		extra = append(extra, "--without-images")
	}
	bakeArgs := append([]string{"--profile-overlay", overlay, "-o", out}, extra...)
	e2eStep(t, strings.Join(roles, ", ")+" images baked", func() {
		e.run(e.repo, e.kiln, "lock", "images/qemu.yaml", "--profile-overlay", overlay)
		for _, role := range roles {
			start := time.Now()
			e.run(e.repo, e.kiln, append([]string{"bake", "images/qemu.yaml", "--role", role}, bakeArgs...)...)
			t.Logf("e2e: baked %s in %s", role, time.Since(start).Round(100*time.Millisecond))
		}
		if docker {
			// The worker on Docker Engine, from its own definition and overlay; it replaces
			// qemu-worker.raw, which the cluster boots.
			e.run(e.repo, e.kiln, "lock", "images/qemu-docker.yaml", "--profile-overlay", dockerOverlay)
			start := time.Now()
			args := append([]string{"bake", "images/qemu-docker.yaml", "--role", "worker", "--profile-overlay", dockerOverlay, "-o", out}, extra...)
			e.run(e.repo, e.kiln, args...)
			t.Logf("e2e: baked the Docker worker in %s", time.Since(start).Round(100*time.Millisecond))
			for _, suffix := range []string{".raw", ".qcow2", ".json"} {
				if err := os.Rename(filepath.Join(out, "qemu-docker-worker"+suffix), filepath.Join(out, "qemu-worker"+suffix)); err != nil {
					t.Fatal(err)
				}
			}
		}
	})
	for _, role := range roles {
		logImageSize(t, filepath.Join(out, "qemu-"+role))
		scanImageForSecrets(t, filepath.Join(out, "qemu-"+role+".raw"))
	}
	return out, bin
}

// e2eDocker reports whether the e2e's worker runs on Docker Engine (make e2e RUNTIME=docker).
func e2eDocker() bool { return os.Getenv("KILN_E2E_RUNTIME") == "docker" }

// dockerProbe is the Butane of a unit that shows, on a Docker worker's console, the Docker
// containers of the e2e's pod (docker ps, names k8s_<container>_<pod>_…) once its container
// runs: the sandbox (k8s_POD_…) comes first.
const dockerProbe = `variant: fcos
version: 1.6.0
systemd:
  units:
    - name: kiln-e2e-docker.service
      enabled: true
      contents: |
        [Unit]
        After=cri-docker.service
        [Service]
        Type=simple
        ExecStart=/bin/sh -c 'for i in $$(seq 1200); do if docker ps --format "{{.Names}}" | grep -q "^k8s_pause_e2e-pause_"; then echo "kiln-e2e-docker: $$(docker ps --filter name=_e2e-pause_ --format "{{.Names}} {{.Image}} {{.Status}}" | tr "\n" ";")"; exit 0; fi; sleep 2; done; echo "kiln-e2e-docker: no container of the pod"'
        StandardOutput=journal+console
        [Install]
        WantedBy=multi-user.target
`

// waitForLine waits until a console line of m matches re and returns it; the test fails
// naming re and the console's end when none does within timeout.
func waitForLine(t *testing.T, m *vm.Machine, re *regexp.Regexp, timeout time.Duration) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	line, err := m.WaitFor(ctx, re)
	if err != nil {
		t.Fatalf("%v\nlast console lines:\n%s", err, tail(m.Lines(), 40))
	}
	return line
}

// mergeButane merges the Butane config bu into the Ignition config file ign, in place, and
// returns ign.
func mergeButane(t *testing.T, ign, bu string) string {
	t.Helper()
	raw, err := os.ReadFile(ign)
	if err != nil {
		t.Fatal(err)
	}
	node, err := config.Parse(raw)
	if err != nil {
		t.Fatalf("%s: %v", ign, err)
	}
	extra, err := config.Parse([]byte(bu))
	if err != nil {
		t.Fatal(err)
	}
	merged, err := config.Merge(node, extra).JSON()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(ign, merged, 0o600); err != nil {
		t.Fatal(err)
	}
	return ign
}

// kubectlAt runs kubectl with kubeconfig against an API server forwarded to 127.0.0.1:port
// (its certificate names kubernetes).
func kubectlAt(kubectl, kubeconfig string, port int) kubectlFunc {
	return func(args ...string) (string, error) {
		args = append([]string{"--kubeconfig", kubeconfig,
			"--server", fmt.Sprintf("https://127.0.0.1:%d", port), "--tls-server-name", "kubernetes",
			"--request-timeout", "20s"}, args...)
		b, err := exec.Command(kubectl, args...).CombinedOutput()
		return strings.TrimSpace(string(b)), err
	}
}

// nodePair is a two-node cluster to boot: a control plane, then a worker.
type nodePair struct {
	CPName, WorkerName string
	CP, Worker         vm.Config
	// Up is the console line that says a node booted (for kiln, its first boot's status).
	Up *regexp.Regexp
	// Fail, when set, is a console line that says a node gave up: the wait ends there.
	Fail    *regexp.Regexp
	Kubectl kubectlFunc
	// OnCPUp runs once the control plane's VM is up (e.g. to register a diagnosis that
	// must run before the VMs stop).
	OnCPUp func()
}

// pairRun is what bootPair saw: when each node started and how long it took to be Ready.
type pairRun struct {
	CPVM, WorkerVM     *vm.Machine
	Start, WorkerStart time.Time
	APIReady           time.Duration // from the control plane's start
	CPReady            time.Duration // from the control plane's start
	WorkerReady        time.Duration // from the worker's start
	CPUp, WorkerUp     time.Duration // each from its own start to its Up line
}

// BothReady is how long after the control plane's start both nodes were Ready.
func (r pairRun) BothReady() time.Duration { return r.WorkerStart.Sub(r.Start) + r.WorkerReady }

// bootPair boots p's control plane, waits until its API answers and the node is Ready, then
// boots the worker and waits until both nodes are Ready. It measures boot-to-Ready the way a
// user sees it: from a VM's start to the node's Ready condition, read from the host.
//
// A guest runs emulated (TCG) here, and two guests of two vCPUs share the host's two cores:
// a worker booting beside the control plane's start takes the CPU its API server needs to
// meet its own start-up deadlines. The worker starts once the control plane is Ready (its
// controller-manager allocated its pod CIDR), as a worker of a real cluster joins one that
// serves. It also runs at a lower host CPU priority (nice 10): the control plane alone keeps
// most of two emulated cores busy, and at equal priority the worker's boot halves what the
// API server gets, until leases and probes time out. The worker takes the idle cycles.
func bootPair(t *testing.T, e *env, p nodePair) pairRun {
	t.Helper()
	var r pairRun
	// failed ends a wait with the console line of a node that said it gave up.
	failed := func() {
		for _, m := range []*vm.Machine{r.CPVM, r.WorkerVM} {
			if m == nil || p.Fail == nil {
				continue
			}
			for _, l := range m.Lines() {
				if p.Fail.MatchString(l) {
					t.Fatalf("a node gave up: %s\nlast console lines:\n%s", strings.TrimSpace(l), tail(m.Lines(), 50))
				}
			}
		}
	}
	r.Start = time.Now()
	r.CPVM, _ = e.bootWith(p.CP, p.Up, 20*time.Minute)
	r.CPUp = time.Since(r.Start)
	t.Logf("e2e: %s up after %s", p.CPName, r.CPUp.Round(time.Second))
	if p.OnCPUp != nil {
		p.OnCPUp()
	}

	// From the host, through the forwarded port: the API answers ready.
	waitFor(t, "kubectl get --raw /readyz answers ok", 25*time.Minute, func() (bool, string) {
		failed()
		out, err := p.Kubectl("get", "--raw", "/readyz")
		return err == nil && out == "ok", out
	})
	r.APIReady = time.Since(r.Start)
	t.Logf("e2e: API ready %s after the control plane started", r.APIReady.Round(time.Second))

	ready := map[string]time.Duration{}
	waitFor(t, "the control plane is Ready", 25*time.Minute, func() (bool, string) {
		failed()
		out, err := p.Kubectl("get", "node", p.CPName, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`)
		if err == nil && out == "True" {
			ready[p.CPName] = time.Since(r.Start)
		}
		return ready[p.CPName] > 0, out
	})
	t.Logf("e2e: control plane Ready %s after it started", ready[p.CPName].Round(time.Second))
	logTimeline(t, p.Kubectl, p.CPName, r.Start)
	logNodeCPU(t, p.Kubectl, p.CPName)
	reportRestarts(t, p.Kubectl)
	r.WorkerStart = time.Now()
	w := p.Worker
	w.Nice = 10
	r.WorkerVM, _ = e.bootWith(w, p.Up, 20*time.Minute)
	r.WorkerUp = time.Since(r.WorkerStart)

	waitFor(t, "both nodes Ready", 25*time.Minute, func() (bool, string) {
		failed()
		out, err := p.Kubectl("get", "nodes", "-o", `jsonpath={range .items[*]}{.metadata.name}={.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}`)
		if err != nil {
			return false, out
		}
		for _, line := range strings.Split(out, "\n") {
			name, status, _ := strings.Cut(line, "=")
			if status == "True" && ready[name] == 0 {
				switch name {
				case p.CPName:
					ready[name] = time.Since(r.Start)
				case p.WorkerName:
					ready[name] = time.Since(r.WorkerStart)
				}
			}
		}
		return ready[p.CPName] > 0 && ready[p.WorkerName] > 0, out
	})
	r.CPReady, r.WorkerReady = ready[p.CPName], ready[p.WorkerName]
	t.Logf("e2e: boot-to-Ready control plane %s, worker %s (worker started %s after the control plane, once it was Ready; up %s after its start)",
		r.CPReady.Round(time.Second), r.WorkerReady.Round(time.Second), r.WorkerStart.Sub(r.Start).Round(time.Second), r.WorkerUp.Round(time.Second))
	return r
}

// kilnNodePair writes the e2e cluster's config (kiln cluster init) into e.dir/cluster and
// returns the pair of kiln nodes to boot from the images in out, each with its address on
// the cluster link, the control plane's API forwarded to the host.
// With pull the nodes reach the host's registry; without, they are offline.
func kilnNodePair(t *testing.T, e *env, out, bin string, pull bool) nodePair {
	t.Helper()
	clusterDir := filepath.Join(e.dir, "cluster")
	e2eStep(t, "cluster config written", func() {
		e.run(e.repo, e.kiln, "cluster", "init", "--name", e2eCluster, "--dns-zone", e2eZone,
			"--control-planes", "1", "--workers", "1", "--api-endpoint", cpAddr+":6443", "--slow-control-plane", "-o", clusterDir)
	})
	cpName, workerName := e2eCluster+"-cp-1", e2eCluster+"-worker-1"
	cpConfig := nodeConfigWithAddress(t, filepath.Join(clusterDir, cpName+".ign"), cpAddr, e.dir, pull)
	workerConfig := nodeConfigWithAddress(t, filepath.Join(clusterDir, workerName+".ign"), workerAddr, e.dir, pull)
	if e2eDocker() {
		workerConfig = mergeButane(t, workerConfig, dockerProbe)
	}
	// One link per run: two e2e runs on one host must not share a segment.
	link := fmt.Sprintf("%s-%d", e2eLinkPrefix, os.Getpid())
	apiPort := testkit.FreePort(t)
	return nodePair{
		CPName: cpName, WorkerName: workerName,
		Kubectl: kubectlAt(filepath.Join(bin, "kubectl"), filepath.Join(clusterDir, "admin.conf"), apiPort),
		CP: vm.Config{
			Image: filepath.Join(out, "qemu-control-plane.raw"), Snapshot: true, Config: cpConfig,
			Disks: []vm.Disk{{Name: "etcd-main", Size: "2G"}}, MemoryMB: 3072, CPUs: 2,
			Links:   []vm.Link{{Name: link, MAC: linkMAC(cpAddr)}},
			Offline: !pull, Forward: map[string]int{fmt.Sprintf("127.0.0.1:%d", apiPort): 6443},
		},
		Worker: vm.Config{
			Image: filepath.Join(out, "qemu-worker.raw"), Snapshot: true, Config: workerConfig,
			MemoryMB: 2048, CPUs: 2, Links: []vm.Link{{Name: link, MAC: linkMAC(workerAddr)}}, Offline: !pull,
		},
		Up: firstbootDone,
	}
}
