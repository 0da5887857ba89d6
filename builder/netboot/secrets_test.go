package netboot

import (
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kilnproject/kiln/builder/cluster"
)

// clusterMachines serves the configs kiln cluster init wrote: a control plane's (CA keys,
// service-account key, bootstrap token) and a worker's (bootstrap kubeconfig), the latter to
// two groups, and one config without secrets.
const clusterMachines = `groups:
  - name: control-planes
    image: metal-control-plane
    mode: install
    config: demo/demo-cp-1.ign
    machines:
      - name: cp-1
        selector: {mac: 52:54:00:00:01:01}
  - name: workers
    image: metal-worker
    mode: live
    config: demo/demo-worker-1.ign
    selector: {mac: 52:54:00:00:00:01}
  - name: more-workers
    image: metal-worker
    mode: live
    config: demo/demo-worker-1.ign
    machines:
      - {name: w-2, selector: {mac: 52:54:00:00:00:12}}
      - {name: w-3, selector: {mac: 52:54:00:00:00:13}}
      - {name: w-4, selector: {mac: 52:54:00:00:00:14}}
      - {name: w-5, selector: {mac: 52:54:00:00:00:15}}
      - {name: w-6, selector: {mac: 52:54:00:00:00:16}}
  - name: plain
    image: metal-worker
    mode: live
    config: worker.ign
    selector: {mac: 52:54:00:00:00:02}
`

// A config holding a private key or a token is refused at startup, naming the machines it
// would go to, the file and what it holds; with AllowSecrets it is served, and the log warns
// once per config file however many groups and machines get it.
func TestSecretsRefused(t *testing.T) {
	dir := fixture(t)
	if _, err := cluster.Init(filepath.Join(dir, "demo"), cluster.Spec{Name: "demo", DNSZone: "k8s.example.com", ControlPlanes: 1, Workers: 1}, false, time.Now()); err != nil {
		t.Fatal(err)
	}
	machines := filepath.Join(dir, "cluster-machines.yaml")
	writeFile(t, machines, clusterMachines)
	cpConfig, workerConfig := filepath.Join(dir, "demo", "demo-cp-1.ign"), filepath.Join(dir, "demo", "demo-worker-1.ign")
	cpKeys := []string{"/etc/kubernetes/pki/ca.key:1: private key", "/etc/kubernetes/pki/etcd/ca.key:1: private key",
		"/etc/kubernetes/pki/sa.key:1: private key", "/etc/kiln/bootstrap-token:1: Kubernetes bootstrap token"}
	workerToken := "/etc/kubernetes/bootstrap-kubelet.conf:"
	workers := "machines workers, w-2, w-3, w-4, w-5 and 1 more (/config/<machine>)"
	for _, tc := range []struct {
		name  string
		allow bool
		want  []string // in the error, or in the log when allowed
	}{
		{"refused", false, append([]string{
			"cluster-machines.yaml:5: groups[0].config: " + cpConfig + " holds secrets, and kiln serve would hand it to machine cp-1 (/config/cp-1):\n    /etc/",
			"cluster-machines.yaml:12: groups[1].config: " + workerConfig + " holds secrets, and kiln serve would hand it to " + workers + ":\n    " + workerToken,
			"\nanyone on the boot network can fetch a config kiln serve holds", "CIDATA", "--allow-secrets"}, cpKeys...)},
		{"allowed", true, append([]string{
			`level=WARN msg="serving secrets to anyone on the boot network (--allow-secrets)" config=` + cpConfig + ` machines="machine cp-1 (/config/cp-1)" secrets="/etc/`,
			`level=WARN msg="serving secrets to anyone on the boot network (--allow-secrets)" config=` + workerConfig + ` machines="` + workers + `" secrets="` + workerToken,
		}, cpKeys...)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logs := &syncBuffer{}
			s, err := Load(Options{Dir: dir, Machines: machines, AllowSecrets: tc.allow, Log: slog.New(slog.NewTextHandler(logs, nil))})
			if !tc.allow {
				if err == nil {
					t.Fatal("Load served configs holding keys and tokens")
				}
				contains(t, "error", err.Error(), tc.want...)
				if n := strings.Count(err.Error(), "holds secrets"); n != 2 || strings.Contains(err.Error(), "worker.ign") {
					t.Errorf("want the two configs holding secrets reported once each, not worker.ign:\n%v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			contains(t, "log", logs.String(), tc.want...)
			if n := strings.Count(logs.String(), "serving secrets"); n != 2 {
				t.Errorf("%d warnings, want one per config file holding secrets (2):\n%s", n, logs.String())
			}
			for _, id := range []string{"cp-1", "workers", "w-6", "plain"} {
				if s.byID[id] == nil || s.byID[id].config == nil {
					t.Errorf("machine %s has no config", id)
				}
			}
		})
	}
}

// Every place a config can carry a file is scanned: a file, a unit, a drop-in, gzip'd.
func TestConfigSecretsPlaces(t *testing.T) {
	const token = "abcdef.0123456789abcdef"
	for _, tc := range []struct {
		name, butane, want string
	}{
		{"inline file", "storage:\n  files:\n    - path: /etc/kubernetes/token\n      contents: {inline: " + token + "}\n",
			"/etc/kubernetes/token:1: Kubernetes bootstrap token"},
		{"gzip'd file", "storage:\n  files:\n    - path: /opt/join.sh\n      contents: {compression: gzip, source: \"data:;base64,H4sIAAAAAAACAwvx93b1s01MSk5JTdMzMDQyNjE1M7ewhAhwAQB10DIDHgAAAA==\"}\n",
			"/opt/join.sh:1: Kubernetes bootstrap token"},
		{"unit", "systemd:\n  units:\n    - name: join.service\n      contents: \"[Service]\\nEnvironment=TOKEN=" + token + "\\n\"\n",
			"/etc/systemd/system/join.service:2: Kubernetes bootstrap token"},
		{"drop-in", "systemd:\n  units:\n    - name: kubelet.service\n      dropins:\n        - name: token.conf\n          contents: \"[Service]\\nEnvironment=TOKEN=" + token + "\\n\"\n",
			"/etc/systemd/system/kubelet.service.d/token.conf:2: Kubernetes bootstrap token"},
		{"no secret", "storage:\n  files:\n    - path: /etc/motd\n      contents: {inline: hello}\n", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "c.bu")
			writeFile(t, p, "variant: fcos\nversion: 1.6.0\n"+tc.butane)
			gc, err := loadGroupConfig(p)
			if err != nil {
				t.Fatal(err)
			}
			found, err := configSecrets(gc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, f := range found {
				got = append(got, f.String())
			}
			if strings.Join(got, "\n") != tc.want {
				t.Errorf("found %q, want %q", got, tc.want)
			}
		})
	}
}
