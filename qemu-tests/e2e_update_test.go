package qemutests

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kilnproject/kiln/builder/qemucluster"
)

// The rolling update (make e2e-update, KILN_E2E_UPDATE=1): the e2e's control-plane and worker
// images, brought up by `kiln cluster up --ssh-key` under TCG, offline; then a v2 of both
// (images/qemu.yaml with an overlay adding /etc/kiln-v2-marker) baked into another directory,
// and `kiln cluster update` rolls the control plane, then the worker: each writes its other
// slot, boots it on trial, is Ready again and blessed, and the control plane keeps its etcd
// member (kiln cluster update checks its ID). Afterwards both nodes run v2 from slot b under
// the same names, Ready, with the ConfigMap written before the update. Every kube-system
// container restarts once with its node (logged, not counted against the test).
func TestE2EUpdate(t *testing.T) {
	if os.Getenv("KILN_E2E_UPDATE") != "1" {
		t.Skip("the rolling update runs with make e2e-update (KILN_E2E_UPDATE=1)")
	}
	e := newRepoEnv(t)
	roles := []string{"control-plane", "worker"}
	out, bin := bakeE2ERoles(t, e, roles, false)

	def, err := os.ReadFile(filepath.Join(e.repo, "images", "qemu.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	writeTestFile(t, filepath.Join(e.repo, "images", "qemu-v2.yaml"), strings.Replace(string(def), "overlays: [base]", "overlays: [base, v2-marker]", 1))
	writeTestFile(t, filepath.Join(e.repo, "overlays", "v2-marker", "etc", "kiln-v2-marker"), "v2\n")
	overlay, out2 := filepath.Join(e.dir, "e2e-overlay.yaml"), filepath.Join(e.dir, "out-v2")
	e2eStep(t, "v2 of both images baked", func() {
		e.run(e.repo, e.kiln, "lock", "images/qemu-v2.yaml", "--profile-overlay", overlay)
		for _, role := range roles {
			e.run(e.repo, e.kiln, "bake", "images/qemu-v2.yaml", "--role", role, "--profile-overlay", overlay, "-o", out2)
		}
	})

	ssh := newSSHClient(t, e.dir)
	h := &haEnv{t: t, e: e, state: filepath.Join(e.dir, "cluster"), kubectlB: filepath.Join(bin, "kubectl")}
	t.Cleanup(func() {
		if t.Failed() {
			for _, n := range []string{"upd-cp-1", "upd-worker-1"} {
				b, _ := os.ReadFile(filepath.Join(h.state, "nodes", n, "console.log"))
				t.Logf("e2e-update: %s console (last 60 lines):\n%s", n, lastN(string(b), 60))
			}
			diagnose(t, h.kubectl, "upd-cp-1", "upd-worker-1")
		}
		exec.Command(e.kiln, "cluster", "down", "--state-dir", h.state).Run()
	})
	e2eStep(t, "kiln cluster up: control plane and worker Ready", func() {
		t.Logf("e2e-update: %s", e.run(e.dir, e.kiln, "cluster", "up", "--name", "upd", "--state-dir", h.state, "--image-dir", out,
			"--accel", "tcg", "--control-planes", "1", "--workers", "1", "--ssh-key", ssh.key+".pub", "--timeout", "60m"))
	})
	if out, err := h.kubectl("create", "configmap", "before-update", "--from-literal=written=before"); err != nil {
		t.Fatalf("create configmap: %v\n%s", err, out)
	}
	nodesBefore, _ := h.kubectl("get", "nodes", "-o", "jsonpath={.items[*].metadata.name}")

	took := e2eStep(t, "kiln cluster update: the control plane, then the worker, on v2", func() {
		t.Logf("e2e-update: kiln cluster update:\n%s", h.kiln("update", "--image-dir", out2, "--identity", ssh.key, "--timeout", "40m"))
	})
	t.Logf("e2e-update: rolling update of 2 nodes: %s", took.Round(time.Second))

	st, err := qemucluster.Load(h.state)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range st.Nodes {
		c := *ssh
		c.port = n.SSHPort
		got := c.runAs(t, "root", "no", time.Minute, "hostname; cat /etc/kiln-v2-marker; kiln-init update status")
		t.Logf("e2e-update: %s after the update:\n%s", n.Name, got)
		lines := strings.Split(got, "\n")
		if len(lines) < 2 || lines[0] != n.Name || lines[1] != "v2" {
			t.Errorf("%s: host name and marker %q, want %s and v2", n.Name, lines[:min(2, len(lines))], n.Name)
		}
		if !strings.Contains(got, "good, booted, boots next") || !strings.Contains(got, "\nb ") {
			t.Errorf("%s: update status does not show slot b booted and good:\n%s", n.Name, got)
		}
	}
	if after, _ := h.kubectl("get", "nodes", "-o", "jsonpath={.items[*].metadata.name}"); after != nodesBefore {
		t.Errorf("nodes after the update: %q, before: %q", after, nodesBefore)
	}
	if out, err := h.kubectl("get", "configmap", "before-update", "-o", "jsonpath={.data.written}"); err != nil || out != "before" {
		t.Errorf("the ConfigMap written before the update: %v %q", err, out)
	}
	reportRestarts(t, h.kubectl)
}
