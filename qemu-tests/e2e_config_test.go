package qemutests

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kilnproject/kiln/builder/cluster"
	"github.com/kilnproject/kiln/initd/config"
)

// The config an e2e node boots with: its cluster config, the static address on the link and,
// for the pulling run only, containerd's registry mirror.
func TestNodeConfigWithAddress(t *testing.T) {
	dir := t.TempDir()
	if _, err := cluster.Init(dir, cluster.Spec{Name: e2eCluster, DNSZone: e2eZone, ControlPlanes: 1, Workers: 1,
		APIEndpoint: cpAddr + ":6443"}, true, time.Now()); err != nil {
		t.Fatal(err)
	}
	for _, mirror := range []bool{false, true} {
		p := nodeConfigWithAddress(t, filepath.Join(dir, "e2e-worker-1.ign"), workerAddr, t.TempDir(), mirror)
		raw, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		c, err := config.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		files, err := c.Files()
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		for _, f := range files {
			got[f.Path] = string(f.Contents)
		}
		if _, ok := got["/etc/kubernetes/bootstrap-kubelet.conf"]; !ok {
			t.Errorf("mirror=%t: the cluster's files are lost: %v", mirror, keys(got))
		}
		if n := got["/etc/systemd/network/10-kiln-e2e.network"]; n == "" {
			t.Errorf("mirror=%t: no link address", mirror)
		}
		hosts, ok := got["/etc/containerd/certs.d/registry.k8s.io/hosts.toml"]
		if ok != mirror || (mirror && hosts != registryMirror) {
			t.Errorf("mirror=%t: hosts.toml present %t:\n%s", mirror, ok, hosts)
		}
	}
}

func keys(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
