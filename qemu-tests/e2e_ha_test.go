package qemutests

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// The highly available cluster (make e2e-ha, KILN_E2E_HA=1): the e2e's images (baked as
// TestE2ECluster bakes them, or reused from KILN_E2E_HA_IMAGES), brought up by the kiln
// binary's `kiln cluster up` as three control planes, each with its etcd disk, and one
// worker, 1 vCPU each under TCG, offline, their names in every node's /etc/hosts (the hosts
// provider: see kiln cluster up --help). It checks etcd's three members, a Deployment, a
// control plane stopped and started (its etcd disk not reformatted), one replaced by a
// fresh VM with a blank etcd disk (rejoining as the same member), and a reboot of every node.

const haCluster = "ha"

// haEnv is the running HA cluster, driven through the kiln binary and kubectl.
type haEnv struct {
	t        *testing.T
	e        *env
	state    string
	kubectlB string
}

func (h *haEnv) kiln(args ...string) string {
	h.t.Helper()
	return h.e.run(h.e.dir, h.e.kiln, append(append([]string{"cluster"}, args...), "--state-dir", h.state)...)
}

// kubectl runs kubectl with admin.conf, against the control plane forwarded on port (0:
// admin.conf's, the first control plane's).
func (h *haEnv) kubectlOn(port int, args ...string) (string, error) {
	pre := []string{"--kubeconfig", filepath.Join(h.state, "admin.conf"), "--request-timeout", "20s"}
	if port != 0 {
		pre = append(pre, "--server", fmt.Sprintf("https://127.0.0.1:%d", port))
	}
	b, err := exec.Command(h.kubectlB, append(pre, args...)...).CombinedOutput()
	return strings.TrimSpace(string(b)), err
}

func (h *haEnv) kubectl(args ...string) (string, error) { return h.kubectlOn(0, args...) }

// haStatus is `kiln cluster status -o json`.
type haStatus struct {
	Nodes []struct {
		Name       string  `json:"name"`
		Role       string  `json:"role"`
		Running    bool    `json:"running"`
		PID        int     `json:"pid"`
		APIPort    int     `json:"apiPort"`
		Ready      string  `json:"ready"`
		RSSMiB     int64   `json:"rssMiB"`
		CPUSeconds float64 `json:"cpuSeconds"`
		FirstBoot  string  `json:"firstBoot"`
	} `json:"nodes"`
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

// logUsage logs each VM's QEMU resident memory and CPU time (from /proc, through status).
func (h *haEnv) logUsage(when string) {
	h.t.Helper()
	for _, n := range h.status().Nodes {
		h.t.Logf("e2e-ha: %s: %s %s: running %v, QEMU RSS %d MiB, CPU time %.0f s, Ready %q", when, n.Name, n.Role, n.Running, n.RSSMiB, n.CPUSeconds, n.Ready)
	}
}

// etcdMembers is `etcdctl member list` run in a member's etcd pod: name → started.
func (h *haEnv) etcdMembers(port int, node string) (map[string]bool, string, error) {
	out, err := h.kubectlOn(port, "exec", "-n", "kube-system", "etcd-"+node, "-c", "etcd", "--",
		"etcdctl", "--endpoints", "https://127.0.0.1:2379", "--cacert", "/etc/kubernetes/pki/etcd/ca.crt",
		"--cert", "/etc/kubernetes/pki/etcd/healthcheck-client.crt", "--key", "/etc/kubernetes/pki/etcd/healthcheck-client.key",
		"member", "list", "-w", "simple")
	if err != nil {
		return nil, out, err
	}
	members := map[string]bool{}
	for _, l := range strings.Split(out, "\n") {
		// id, status, name, peer URLs, client URLs, is learner
		f := strings.Split(l, ", ")
		if len(f) >= 3 {
			members[f[2]] = f[1] == "started"
		}
	}
	return members, out, nil
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

func TestE2EHA(t *testing.T) {
	if os.Getenv("KILN_E2E_HA") != "1" {
		t.Skip("the highly available cluster runs with make e2e-ha (KILN_E2E_HA=1)")
	}
	_, err := exec.LookPath("blkid")
	require(t, err == nil, "blkid not installed")
	e := newRepoEnv(t)
	out, bin := os.Getenv("KILN_E2E_HA_IMAGES"), filepath.Join(e2eCacheDir(), "bin")
	if out == "" {
		out, bin = bakeE2EImages(t, e, false)
	} else {
		t.Logf("e2e-ha: reusing the images in %s", out)
	}
	h := &haEnv{t: t, e: e, state: filepath.Join(e.dir, "cluster"), kubectlB: filepath.Join(bin, "kubectl")}
	cps := []string{haCluster + "-cp-1", haCluster + "-cp-2", haCluster + "-cp-3"}
	worker := haCluster + "-worker-1"
	t.Cleanup(func() {
		if t.Failed() {
			for _, n := range append(cps, worker) {
				b, _ := os.ReadFile(filepath.Join(h.state, "nodes", n, "console.log"))
				t.Logf("e2e-ha: %s console (last 40 lines):\n%s", n, lastN(string(b), 40))
			}
			diagnose(t, h.kubectl, append(cps, worker)...)
		}
		exec.Command(e.kiln, "cluster", "down", "--state-dir", h.state).Run()
	})

	// Power-on to all Ready: kiln cluster up starts the control planes, then the worker once
	// they are Ready, and returns when every node is Ready.
	var upTook time.Duration
	e2eStep(t, "kiln cluster up: 3 control planes and a worker Ready", func() {
		start := time.Now()
		cmd := exec.Command(e.kiln, "cluster", "up", "--name", haCluster, "--state-dir", h.state, "--image-dir", out,
			"--control-planes", "3", "--workers", "1", "--cp-cpus", "1", "--cp-memory", "2560",
			"--worker-cpus", "1", "--worker-memory", "2048", "--slow-control-plane", "--accel", "tcg", "--timeout", "100m")
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

	// The member names are recorded once; every later check wants the same three started
	// (a member that rejoins keeps its name).
	var memberNames []string
	threeStarted := func() (bool, string) {
		m, out, err := h.etcdMembers(0, cps[0])
		if err != nil || len(m) != 3 {
			return false, out
		}
		for name, started := range m {
			if !started || (memberNames != nil && !slices.Contains(memberNames, name)) {
				return false, out
			}
		}
		if memberNames == nil {
			for name := range m {
				memberNames = append(memberNames, name)
			}
			slices.Sort(memberNames)
			t.Logf("e2e-ha: etcd members %v, all started", memberNames)
		}
		return true, out
	}
	waitFor(t, "etcd lists three started members", 10*time.Minute, threeStarted)

	// A Deployment of three replicas runs (on whatever nodes take pods).
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

	// Stop a control plane (not cp-1, whose port admin.conf names): the API keeps reading and
	// writing. Writes are tried every 2 s; the time they fail is what losing a member costs.
	down := cps[2]
	uuidBefore := ""
	e2eStep(t, "one control plane stopped: kubectl still reads and writes", func() {
		h.kiln("stop", down)
		uuidBefore = h.etcdUUID(down)
		var failing time.Duration
		deadline := time.Now().Add(5 * time.Minute)
		ok := 0
		for i := 0; ok < 5 && time.Now().Before(deadline); i++ {
			t0 := time.Now()
			_, err := h.kubectl("create", "configmap", fmt.Sprintf("ha-write-%d", i), "--from-literal=n=1")
			if err != nil {
				failing += time.Since(t0) + 2*time.Second
			} else {
				ok++
			}
			time.Sleep(2 * time.Second)
		}
		if ok < 5 {
			t.Fatalf("with %s stopped, writes kept failing for 5 min", down)
		}
		t.Logf("e2e-ha: with %s stopped, writes failed for about %s", down, failing.Round(time.Second))
		if out, err := h.kubectl("get", "configmap", "ha-before", "-o", "jsonpath={.data.written}"); err != nil || out != "before" {
			t.Fatalf("read with %s stopped: %v %s", down, err, out)
		}
		// The worker's kubelet reaches the API through api.internal.<cluster>.<zone>, whose
		// stopped address it must skip: a new pod still starts on it.
		if out, err := h.kubectl("scale", "deployment", "ha-pause", "--replicas", "4"); err != nil {
			t.Fatalf("scale: %v\n%s", err, out)
		}
		waitFor(t, "4 ready replicas with a control plane down", 10*time.Minute, func() (bool, string) {
			out, err := h.kubectl("get", "deployment", "ha-pause", "-o", "jsonpath={.status.readyReplicas}")
			return err == nil && out == "4", out
		})
	})

	e2eStep(t, "the stopped control plane started again: it rejoins, its etcd disk not reformatted", func() {
		h.kiln("start", down, "--wait", "--timeout", "40m")
		waitFor(t, "etcd lists three started members", 15*time.Minute, threeStarted)
		h.kiln("stop", down)
		if after := h.etcdUUID(down); after != uuidBefore {
			t.Errorf("%s's etcd disk was reformatted: ext4 UUID %s, was %s", down, after, uuidBefore)
		}
		h.kiln("start", down, "--wait", "--timeout", "40m")
	})

	e2eStep(t, "a control plane replaced by a fresh VM with a blank etcd disk rejoins as the same member", func() {
		replaced := cps[1]
		h.kiln("replace", replaced)
		h.kiln("start", replaced, "--wait", "--timeout", "40m")
		waitFor(t, "etcd lists three started members (the same names)", 20*time.Minute, threeStarted)
	})

	e2eStep(t, "every node rebooted: the cluster comes back with what it held", func() {
		h.kiln("down", "--keep")
		start := time.Now()
		h.kiln("start", "--wait", "--timeout", "60m")
		t.Logf("e2e-ha: every node Ready %s after the reboot", time.Since(start).Round(time.Second))
		waitFor(t, "the ConfigMap written before is there", 10*time.Minute, func() (bool, string) {
			out, err := h.kubectl("get", "configmap", "ha-before", "-o", "jsonpath={.data.written}")
			return err == nil && out == "before", out
		})
		waitFor(t, "etcd lists three started members", 15*time.Minute, threeStarted)
	})
	h.logUsage("at the end")
	reportRestarts(t, h.kubectl)
}
