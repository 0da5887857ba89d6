package qemutests

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The highly available cluster (make e2e-ha, KILN_E2E_HA=1): the e2e's images (baked as
// TestE2ECluster bakes them, or reused from KILN_E2E_HA_IMAGES), brought up by the kiln
// binary's `kiln cluster up` under TCG, offline, their names in every node's /etc/hosts (the
// hosts provider: see kiln cluster up --help). Two shapes (KILN_E2E_HA_SHAPE):
//
//   - external (default): three etcd nodes, each with its etcd disk, one control plane and
//     one worker — kubeadm's external etcd topology;
//   - stacked: three control planes, each with its etcd member and disk, 1 vCPU each, and a
//     worker.
//
// Either way it checks three started voting members (etcdctl from the host), every node
// Ready, a Deployment and a ConfigMap; a member powered off (the API still reads and writes;
// the failed writes are counted) and started again (it rejoins, its etcd disk not
// reformatted); a member replaced by a fresh VM with a blank etcd disk (it rejoins as the
// same member); a power cut of every VM (the cluster comes back with the ConfigMap). It logs
// power-on to every node Ready, each VM's steady CPU and memory, etcd's slow requests and
// every kube-system restart.

const haCluster = "ha"

// haShape is a cluster layout the test runs.
type haShape struct {
	name     string
	roles    []string // the images it boots
	upArgs   []string // kiln cluster up's topology and sizes
	members  []string // the nodes that run the etcd members a, b, c
	nodes    []string // every node
	lose     string   // the member powered off and started again
	replaced string   // the member replaced by a fresh VM
}

func haShapes() map[string]haShape {
	cp := func(i int) string { return fmt.Sprintf("%s-cp-%d", haCluster, i) }
	etcd := func(i int) string { return fmt.Sprintf("%s-etcd-%d", haCluster, i) }
	worker := haCluster + "-worker-1"
	return map[string]haShape{
		"external": {name: "external", roles: []string{"control-plane", "worker", "etcd"},
			upArgs:  []string{"--etcd-nodes", "3", "--control-planes", "1", "--workers", "1"},
			members: []string{etcd(1), etcd(2), etcd(3)}, nodes: []string{etcd(1), etcd(2), etcd(3), cp(1), worker},
			lose: etcd(3), replaced: etcd(2)},
		// Not cp-1, whose port admin.conf names, for the loss.
		"stacked": {name: "stacked", roles: []string{"control-plane", "worker"},
			upArgs: []string{"--control-planes", "3", "--workers", "1", "--cp-cpus", "1", "--cp-memory", "2560",
				"--worker-cpus", "1", "--worker-memory", "2048"},
			members: []string{cp(1), cp(2), cp(3)}, nodes: []string{cp(1), cp(2), cp(3), worker},
			lose: cp(3), replaced: cp(2)},
	}
}

// haEnv is the running HA cluster, driven through the kiln binary, kubectl and etcdctl.
type haEnv struct {
	t        *testing.T
	e        *env
	state    string
	kubectlB string
	etcdctlB string
}

func (h *haEnv) kiln(args ...string) string {
	h.t.Helper()
	return h.e.run(h.e.dir, h.e.kiln, append(append([]string{"cluster"}, args...), "--state-dir", h.state)...)
}

func (h *haEnv) kubectl(args ...string) (string, error) {
	pre := []string{"--kubeconfig", filepath.Join(h.state, "admin.conf"), "--request-timeout", "20s"}
	b, err := exec.Command(h.kubectlB, append(pre, args...)...).CombinedOutput()
	return strings.TrimSpace(string(b)), err
}

// haStatus is `kiln cluster status -o json`.
type haStatus struct {
	Nodes []struct {
		Name         string  `json:"name"`
		Role         string  `json:"role"`
		Running      bool    `json:"running"`
		Ready        string  `json:"ready"`
		Etcd         string  `json:"etcd"`
		EtcdEndpoint string  `json:"etcdEndpoint"`
		RSSMiB       int64   `json:"rssMiB"`
		CPUSeconds   float64 `json:"cpuSeconds"`
		Restarts     *struct {
			Count      int      `json:"count"`
			Containers []string `json:"containers"`
		} `json:"restarts"`
	} `json:"nodes"`
	Etcd *struct {
		Slow map[string]struct {
			SlowApplies     int `json:"slowApplies"`
			SlowReadIndexes int `json:"slowReadIndexes"`
			LeaderChanges   int `json:"leaderChanges"`
		} `json:"slow"`
	} `json:"etcd"`
}

func (h *haEnv) status() haStatus {
	h.t.Helper()
	var st haStatus
	out := h.kiln("status", "-o", "json")
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		h.t.Fatalf("kiln cluster status -o json: %v\n%s", err, out)
	}
	return st
}

// logUsage logs each VM's QEMU resident memory and CPU time, and etcd's trouble counters.
func (h *haEnv) logUsage(when string) {
	h.t.Helper()
	st := h.status()
	for _, n := range st.Nodes {
		restarts := "-"
		if n.Restarts != nil {
			restarts = fmt.Sprintf("%d %v", n.Restarts.Count, n.Restarts.Containers)
		}
		h.t.Logf("e2e-ha: %s: %s %s: running %v, QEMU RSS %d MiB, CPU time %.0f s, Ready %q, etcd %q, kube-system restarts %s",
			when, n.Name, n.Role, n.Running, n.RSSMiB, n.CPUSeconds, n.Ready, n.Etcd, restarts)
	}
	if st.Etcd != nil {
		for n, s := range st.Etcd.Slow {
			h.t.Logf("e2e-ha: %s: etcd on %s: %d slow applies, %d slow read indexes, %d leader changes since it started",
				when, n, s.SlowApplies, s.SlowReadIndexes, s.LeaderChanges)
		}
	}
}

// steadyCPU logs each VM's host CPU over window: what the idle cluster costs this host.
func (h *haEnv) steadyCPU(window time.Duration) {
	h.t.Helper()
	a := h.status()
	time.Sleep(window)
	b := h.status()
	total := 0.0
	for i, n := range b.Nodes {
		cores := (n.CPUSeconds - a.Nodes[i].CPUSeconds) / window.Seconds()
		total += cores
		h.t.Logf("e2e-ha: steady: %s %s: %.2f host cores, QEMU RSS %d MiB", n.Name, n.Role, cores, n.RSSMiB)
	}
	h.t.Logf("e2e-ha: steady: every VM: %.2f host cores over %s", total, window)
}

// members is `etcdctl member list` run on the host against every member's forwarded client
// port, with the state directory's client certificate: name → "started"/"unstarted" and
// whether a learner.
func (h *haEnv) members() (map[string]string, string, error) {
	var eps []string
	for _, n := range h.status().Nodes {
		if n.EtcdEndpoint != "" && n.Running {
			eps = append(eps, n.EtcdEndpoint)
		}
	}
	args := []string{"--endpoints", strings.Join(eps, ","), "--command-timeout", "15s",
		"--cacert", filepath.Join(h.state, "init/pki/etcd/ca.crt"),
		"--cert", filepath.Join(h.state, "etcd-client.crt"), "--key", filepath.Join(h.state, "etcd-client.key"),
		"member", "list", "-w", "simple"}
	b, err := exec.Command(h.etcdctlB, args...).CombinedOutput()
	out := strings.TrimSpace(string(b))
	if err != nil {
		return nil, out, err
	}
	m := map[string]string{}
	for _, l := range strings.Split(out, "\n") {
		// id, status, name, peer URLs, client URLs, is learner
		f := strings.Split(l, ", ")
		if len(f) >= 6 {
			state := f[1]
			if f[5] == "true" {
				state += " learner"
			}
			m[f[2]] = state
		}
	}
	return m, out, nil
}

// threeVoting waits until etcd lists a, b and c as started voting members and nothing else.
func (h *haEnv) threeVoting(within time.Duration) {
	h.t.Helper()
	waitFor(h.t, "etcdctl member list: a, b, c started and voting, no learner", within, func() (bool, string) {
		m, out, err := h.members()
		if err != nil || len(m) != 3 {
			return false, out
		}
		for _, name := range []string{"a", "b", "c"} {
			if m[name] != "started" {
				return false, out
			}
		}
		return true, out
	})
}

// etcdUUID is the ext4 UUID of node's etcd disk, read from the host while the node is off.
func (h *haEnv) etcdUUID(node string) string {
	h.t.Helper()
	raw := filepath.Join(h.e.dir, node+"-etcd.raw")
	defer os.Remove(raw)
	h.e.run(h.e.dir, "qemu-img", "convert", "-O", "raw", filepath.Join(h.state, "nodes", node, "etcd.qcow2"), raw)
	out, _ := exec.Command("blkid", "-p", raw).CombinedOutput()
	m := ext4UUID.FindStringSubmatch(string(out))
	if !strings.Contains(string(out), `TYPE="ext4"`) || m == nil {
		h.t.Fatalf("etcd disk of %s: blkid says %s", node, out)
	}
	return m[1]
}

// retried runs kubectl with args every 2 s until it succeeds (for at most 3 min), logging each
// failure, and returns its output and how long it failed (0 when the first try succeeded).
func (h *haEnv) retried(args ...string) (string, time.Duration) {
	h.t.Helper()
	start := time.Now()
	for try := 0; ; try++ {
		t0 := time.Now()
		out, err := h.kubectl(args...)
		if err == nil {
			if try == 0 {
				return out, 0
			}
			return out, t0.Sub(start)
		}
		h.t.Logf("e2e-ha: kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
		if time.Since(start) > 3*time.Minute {
			h.t.Fatalf("kubectl %s kept failing for 3 min", strings.Join(args, " "))
		}
		time.Sleep(2 * time.Second)
	}
}

// writes writes ConfigMaps every 2 s until five succeeded (or 5 min passed) and returns how
// long writes failed in between.
func (h *haEnv) writes(prefix string) time.Duration {
	h.t.Helper()
	var failing time.Duration
	deadline := time.Now().Add(5 * time.Minute)
	ok := 0
	for i := 0; ok < 5 && time.Now().Before(deadline); i++ {
		t0 := time.Now()
		_, err := h.kubectl("create", "configmap", fmt.Sprintf("%s-%d", prefix, i), "--from-literal=n=1")
		if err != nil {
			failing += time.Since(t0) + 2*time.Second
		} else {
			ok++
		}
		time.Sleep(2 * time.Second)
	}
	if ok < 5 {
		h.t.Fatalf("writes (%s) kept failing for 5 min", prefix)
	}
	return failing
}

func TestE2EHA(t *testing.T) {
	if os.Getenv("KILN_E2E_HA") != "1" {
		t.Skip("the highly available cluster runs with make e2e-ha (KILN_E2E_HA=1)")
	}
	shapeName := os.Getenv("KILN_E2E_HA_SHAPE")
	if shapeName == "" {
		shapeName = "external"
	}
	shape, ok := haShapes()[shapeName]
	require(t, ok, "KILN_E2E_HA_SHAPE=%s: want external or stacked", shapeName)
	_, err := exec.LookPath("blkid")
	require(t, err == nil, "blkid not installed")
	e := newRepoEnv(t)
	out, bin := os.Getenv("KILN_E2E_HA_IMAGES"), filepath.Join(e2eCacheDir(), "bin")
	if out == "" {
		out, bin = bakeE2ERoles(t, e, shape.roles, false)
	} else {
		t.Logf("e2e-ha: reusing the images in %s", out)
	}
	h := &haEnv{t: t, e: e, state: filepath.Join(e.dir, "cluster"), kubectlB: filepath.Join(bin, "kubectl"),
		etcdctlB: filepath.Join(bin, "etcdctl")}
	t.Cleanup(func() {
		if t.Failed() {
			for _, n := range shape.nodes {
				b, _ := os.ReadFile(filepath.Join(h.state, "nodes", n, "console.log"))
				t.Logf("e2e-ha: %s console (last 40 lines):\n%s", n, lastN(string(b), 40))
			}
			diagnose(t, h.kubectl, shape.nodes...)
		}
		exec.Command(e.kiln, "cluster", "down", "--state-dir", h.state).Run()
	})

	// Power-on to all Ready: kiln cluster up starts the etcd members, then the control planes,
	// then the worker, and returns when every node is Ready (an etcd node: its member votes).
	t.Logf("e2e-ha: shape %s", shape.name)
	var upTook time.Duration
	e2eStep(t, "kiln cluster up: every node Ready", func() {
		start := time.Now()
		args := append([]string{"cluster", "up", "--name", haCluster, "--state-dir", h.state, "--image-dir", out,
			"--accel", "tcg", "--timeout", "100m"}, shape.upArgs...)
		cmd := exec.Command(e.kiln, args...)
		cmd.Env = e.environ
		b, err := cmd.CombinedOutput()
		upTook = time.Since(start)
		t.Logf("e2e-ha: kiln cluster up:\n%s", b)
		if err != nil {
			t.Fatalf("kiln cluster up: %v", err)
		}
	})
	t.Logf("e2e-ha: power-on to every node Ready: %s", upTook.Round(time.Second))
	h.logUsage("after up")
	reportRestarts(t, h.kubectl)
	h.threeVoting(10 * time.Minute)
	if _, out, err := h.members(); err == nil {
		t.Logf("e2e-ha: etcdctl member list:\n%s", out)
	}

	// A Deployment of three replicas runs (on whatever nodes take pods), a ConfigMap is written.
	deploy := `{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"ha-pause","namespace":"default"},
"spec":{"replicas":3,"selector":{"matchLabels":{"app":"ha-pause"}},"template":{"metadata":{"labels":{"app":"ha-pause"}},
"spec":{"tolerations":[{"operator":"Exists"}],"containers":[{"name":"pause","image":"registry.k8s.io/pause:3.10.2","imagePullPolicy":"Never"}]}}}}`
	deployFile := filepath.Join(e.dir, "deploy.json")
	os.WriteFile(deployFile, []byte(deploy), 0o644)
	if out, err := h.kubectl("apply", "-f", deployFile); err != nil {
		t.Fatalf("create deployment: %v\n%s", err, out)
	}
	waitFor(t, "the Deployment has 3 ready replicas", 15*time.Minute, func() (bool, string) {
		out, err := h.kubectl("get", "deployment", "ha-pause", "-o", "jsonpath={.status.readyReplicas}")
		return err == nil && out == "3", out
	})
	if out, err := h.kubectl("create", "configmap", "ha-before", "--from-literal=written=before"); err != nil {
		t.Fatalf("create configmap: %v\n%s", err, out)
	}
	h.steadyCPU(2 * time.Minute)

	// A member powered off: the API keeps reading and writing. Writes are tried every 2 s;
	// the time they fail is what losing a member costs.
	uuidBefore := ""
	e2eStep(t, "a member powered off: kubectl still reads and writes", func() {
		h.kiln("stop", shape.lose)
		uuidBefore = h.etcdUUID(shape.lose)
		failing := h.writes("ha-write")
		t.Logf("e2e-ha: with %s stopped, writes failed for about %s", shape.lose, failing.Round(time.Second))
		// A request the API server sent to the lost member before its etcd client gave up on
		// the connection (gRPC keepalive: 30 s without an answer, then 10 s) fails with
		// Unavailable; kubectl is retried as a client would, and the failures are logged.
		if out, failed := h.retried("get", "configmap", "ha-before", "-o", "jsonpath={.data.written}"); out != "before" {
			t.Fatalf("read with %s stopped: %q", shape.lose, out)
		} else if failed > 0 {
			t.Logf("e2e-ha: with %s stopped, the read failed for about %s", shape.lose, failed.Round(time.Second))
		}
		if _, failed := h.retried("scale", "deployment", "ha-pause", "--replicas", "4"); failed > 0 {
			t.Logf("e2e-ha: with %s stopped, the scale failed for about %s", shape.lose, failed.Round(time.Second))
		}
		waitFor(t, "4 ready replicas with a member down", 10*time.Minute, func() (bool, string) {
			out, err := h.kubectl("get", "deployment", "ha-pause", "-o", "jsonpath={.status.readyReplicas}")
			return err == nil && out == "4", out
		})
	})

	e2eStep(t, "the member started again: it rejoins, its etcd disk not reformatted", func() {
		h.kiln("start", shape.lose, "--wait", "--timeout", "40m")
		h.threeVoting(15 * time.Minute)
		h.kiln("stop", shape.lose)
		if after := h.etcdUUID(shape.lose); after != uuidBefore {
			t.Errorf("%s's etcd disk was reformatted: ext4 UUID %s, was %s", shape.lose, after, uuidBefore)
		}
		h.kiln("start", shape.lose, "--wait", "--timeout", "40m")
	})

	e2eStep(t, "a member replaced by a fresh VM with a blank etcd disk rejoins as the same member", func() {
		h.kiln("replace", shape.replaced)
		h.kiln("start", shape.replaced, "--wait", "--timeout", "40m")
		h.threeVoting(20 * time.Minute)
		if out, err := h.kubectl("get", "configmap", "ha-before", "-o", "jsonpath={.data.written}"); err != nil || out != "before" {
			t.Fatalf("read after the replacement: %v %s", err, out)
		}
	})

	e2eStep(t, "a power cut of every VM: the cluster comes back with what it held", func() {
		h.kiln("down", "--keep")
		start := time.Now()
		h.kiln("start", "--wait", "--timeout", "60m")
		t.Logf("e2e-ha: every node Ready %s after the power cut", time.Since(start).Round(time.Second))
		waitFor(t, "the ConfigMap written before is there", 10*time.Minute, func() (bool, string) {
			out, err := h.kubectl("get", "configmap", "ha-before", "-o", "jsonpath={.data.written}")
			return err == nil && out == "before", out
		})
		h.threeVoting(15 * time.Minute)
	})
	h.logUsage("at the end")
	reportRestarts(t, h.kubectl)
}
