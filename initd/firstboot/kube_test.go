package firstboot

import (
	"context"
	"encoding/json"
	"errors"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vincent-petithory/dataurl"

	"github.com/kilnproject/kiln/initd/config"
	"github.com/kilnproject/kiln/initd/firstboot/facts"
	"github.com/kilnproject/kiln/initd/firstboot/render"
	"github.com/kilnproject/kiln/initd/pki"
	"github.com/kilnproject/kiln/initd/source"
	"github.com/kilnproject/kiln/initd/task"
	"github.com/kilnproject/kiln/internal/kubeconfig"
)

// withKubernetesOverlay adds the base and kubernetes overlays' units to a node root, as the
// bake does.
func withKubernetesOverlay(t *testing.T, root string) { withOverlays(t, root, "base", "kubernetes") }

// withOverlays adds the named overlays' units to a node root.
func withOverlays(t *testing.T, root string, overlays ...string) {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	for _, o := range overlays {
		src := filepath.Join(filepath.Dir(file), "../../overlays", o, "usr/lib/systemd/system")
		out, err := exec.Command("cp", "-a", src+"/.", filepath.Join(root, "usr/lib/systemd/system")).CombinedOutput()
		if err != nil {
			t.Fatalf("copy overlay %s: %v: %s", o, err, out)
		}
	}
}

// ignFile is one Ignition storage file with inline contents.
func ignFile(path string, mode int, data []byte) string {
	b, _ := json.Marshal(map[string]any{"path": path, "mode": mode, "contents": map[string]string{"source": dataurl.EncodeBytes(data)}})
	return string(b)
}

// clusterSecrets are the files kiln cluster init puts in a control plane's Ignition config.
func clusterSecrets(t *testing.T) []string {
	t.Helper()
	var files []string
	for name, cn := range map[string]string{"ca": "kubernetes", "front-proxy-ca": "front-proxy-ca", "etcd/ca": "etcd-ca"} {
		kp, err := pki.NewCA(cn, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, ignFile("/etc/kubernetes/pki/"+name+".crt", 0o644, kp.CertPEM),
			ignFile("/etc/kubernetes/pki/"+name+".key", 0o600, kp.KeyPEM))
	}
	sa, err := pki.NewServiceAccountKey()
	if err != nil {
		t.Fatal(err)
	}
	return append(files, ignFile("/etc/kubernetes/pki/sa.pub", 0o644, sa.CertPEM),
		ignFile("/etc/kubernetes/pki/sa.key", 0o600, sa.KeyPEM),
		ignFile("/etc/kiln/bootstrap-token", 0o600, []byte("abcdef.0123456789abcdef\n")))
}

const cpNodeYAML = `cluster: {name: demo, dnsZone: example.com}
role: control-plane
hostname: cp-1
etcd: {member: a, members: [a]}
apiEndpoint: 192.0.2.10:6443
`

const workerNodeYAML = `cluster: {name: demo, dnsZone: example.com}
role: worker
hostname: worker-1
apiEndpoint: 192.0.2.10:6443
`

func kubeOpts(t *testing.T, root, cfg string) Options {
	return Options{
		Root: root, Providers: []source.Provider{fwcfg(t, cfg)},
		Systemctl: func(context.Context, ...string) error { return nil },
		// This sandbox is not a node: its cgroups, ports and tools are the host's.
		PreflightIgnore: []string{"all"},
		Notify:          func(string) error { return nil },
	}
}

func taskState(st *Status, name string) (task.State, string) {
	for _, tk := range st.Tasks {
		if tk.Name == name {
			return tk.State, tk.Error
		}
	}
	return "", "no such task"
}

func enabled(root, unit string) bool {
	target, err := os.Readlink(filepath.Join(root, "etc/systemd/system/multi-user.target.wants", unit))
	return err == nil && target == "/usr/lib/systemd/system/"+unit
}

// A control plane's first boot makes its PKI and kubeconfigs, renders the static pods and
// addons, and hands over to kubelet, kiln-cni and kiln-control-plane; a forced re-run
// changes nothing.
func TestRunControlPlaneKubernetes(t *testing.T) {
	root := nodeRoot(t, "control-plane")
	withKubernetesOverlay(t, root)
	cfg := ignition(append(clusterSecrets(t), ignFile("/etc/kiln/node.yaml", 0o644, []byte(cpNodeYAML)))...)
	opts := kubeOpts(t, root, cfg)
	st, err := Run(context.Background(), opts)
	if err != nil {
		t.Fatalf("first boot: %v\n%+v", err, st.Tasks)
	}
	for _, name := range []string{"pki", "kubelet"} {
		if s, e := taskState(st, name); s != task.StateApplied {
			t.Errorf("task %s %s %s, want applied", name, s, e)
		}
	}

	crt, err := pki.ReadKeyPair(filepath.Join(root, "etc/kubernetes/pki"), "apiserver")
	if err != nil {
		t.Fatal(err)
	}
	c, _ := pki.ParseCertPEM(crt.CertPEM)
	for _, name := range []string{"cp-1", "api.internal.demo.example.com", "kubernetes.default.svc.cluster.local"} {
		if !slices.Contains(c.DNSNames, name) {
			t.Errorf("apiserver certificate names %v, want %s", c.DNSNames, name)
		}
	}
	if err := c.VerifyHostname("192.0.2.10"); err != nil {
		t.Errorf("apiserver certificate does not cover the API endpoint: %v", err)
	}
	etcdCrt, err := pki.ReadKeyPair(filepath.Join(root, "etc/kubernetes/pki"), "etcd/server")
	if err != nil {
		t.Fatal(err)
	}
	if ec, _ := pki.ParseCertPEM(etcdCrt.CertPEM); !slices.Contains(ec.DNSNames, "etcd-a.internal.demo.example.com") {
		t.Errorf("etcd server certificate names %v, want etcd-a.internal.demo.example.com", ec.DNSNames)
	}
	kc, err := os.ReadFile(filepath.Join(root, "etc/kubernetes/kubelet.conf"))
	if err != nil {
		t.Fatal(err)
	}
	k, err := kubeconfig.Parse(kc)
	if err != nil || !strings.HasSuffix(k.Server, ":6443") || !strings.Contains(k.Server, nodeIP(t, root)) {
		t.Errorf("kubelet.conf server %q, %v; want https://<node IP>:6443", k.Server, err)
	}
	if kcert, _ := pki.ParseCertPEM(k.CertPEM); kcert == nil || kcert.Subject.CommonName != "system:node:cp-1" {
		t.Errorf("kubelet.conf user %v", kcert)
	}
	for _, u := range []string{"kubelet.service", "kiln-cni.service", "kiln-control-plane.service"} {
		if !enabled(root, u) {
			t.Errorf("%s is not enabled", u)
		}
	}
	if b, err := os.ReadFile(filepath.Join(root, "etc/resolv.conf")); err != nil || !strings.Contains(string(b), "kiln-init") {
		t.Errorf("/etc/resolv.conf = %q, %v; kubelet needs one", b, err)
	}
	if b, err := os.ReadFile(filepath.Join(root, "etc/kubernetes/addons/kube-proxy.yaml")); err != nil || !strings.Contains(string(b), "server: https://192.0.2.10:6443") {
		t.Errorf("kube-proxy addon does not point at the API endpoint: %v", err)
	}

	checkRerun(t, root, opts, cfg)
}

// nodeIP is the node IP first boot found (the sandbox's own address), as the kubelet
// drop-in has it, or on an etcd node etcd's.
func nodeIP(t *testing.T, root string) string {
	t.Helper()
	drop, err := os.ReadFile(filepath.Join(root, "etc/systemd/system/kubelet.service.d/10-kiln.conf"))
	flag, end := "--node-ip=", " "
	if errors.Is(err, os.ErrNotExist) {
		drop, err = os.ReadFile(filepath.Join(root, "etc/systemd/system/etcd.service.d/10-kiln.conf"))
		flag, end = "--listen-peer-urls=https://", ":2380"
	}
	if err != nil {
		t.Fatal(err)
	}
	_, rest, _ := strings.Cut(string(drop), flag)
	ip, _, _ := strings.Cut(rest, end)
	if ip == "" {
		t.Fatalf("no %s in the drop-in", flag)
	}
	return ip
}

func TestRunWorkerKubernetes(t *testing.T) {
	bootstrap := ignFile("/etc/kubernetes/bootstrap-kubelet.conf", 0o600, []byte("apiVersion: v1\nkind: Config\n"))
	for _, tc := range []struct {
		name    string
		runtime string // the image's kubernetes.runtime; "" records none
		files   []string
		wantErr string
		socket  string // kubelet's containerRuntimeEndpoint
	}{
		{name: "bootstrap kubeconfig delivered", files: []string{bootstrap}, socket: "unix:///run/containerd/containerd.sock"},
		{name: "docker image", runtime: "docker", files: []string{bootstrap}, socket: "unix:///run/cri-dockerd.sock"},
		{name: "no kubelet credentials", wantErr: "kubelet has no credentials: neither /etc/kubernetes/bootstrap-kubelet.conf"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := nodeRoot(t, "worker")
			withKubernetesOverlay(t, root)
			if tc.runtime != "" {
				mustWrite(t, filepath.Join(root, "etc/kiln/image.json"),
					`{"name":"qemu","role":"worker","platform":"qemu","kubernetes":{"version":"v1.37.2","runtime":"`+tc.runtime+`","images":[]}}`)
			}
			cfg := ignition(append(tc.files, ignFile("/etc/kiln/node.yaml", 0o644, []byte(workerNodeYAML)))...)
			st, err := Run(context.Background(), kubeOpts(t, root, cfg))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Run = %v, want %q", err, tc.wantErr)
				}
				if enabled(root, "kubelet.service") {
					t.Error("kubelet enabled without credentials")
				}
				return
			}
			if err != nil {
				t.Fatalf("first boot: %v", err)
			}
			if s, _ := taskState(st, "pki"); s != task.StateUnchanged {
				t.Errorf("a worker's pki task %s, want unchanged (nothing to make)", s)
			}
			for u, want := range map[string]bool{"kubelet.service": true, "kiln-cni.service": true, "kiln-control-plane.service": false} {
				if enabled(root, u) != want {
					t.Errorf("%s enabled = %t, want %t", u, !want, want)
				}
			}
			if _, err := os.Stat(filepath.Join(root, "etc/kubernetes/pki/apiserver.crt")); err == nil {
				t.Error("a worker got control-plane certificates")
			}
			kc, err := os.ReadFile(filepath.Join(root, "etc/kubernetes/kubelet-config.yaml"))
			if want := "containerRuntimeEndpoint: " + tc.socket + "\n"; err != nil || !strings.Contains(string(kc), want) {
				t.Errorf("kubelet-config.yaml (%v) does not say %q:\n%s", err, want, kc)
			}
		})
	}
}

// A control plane whose config lacks the cluster CA fails at the pki task, saying why.
func TestRunControlPlaneWithoutCA(t *testing.T) {
	root := nodeRoot(t, "control-plane")
	withKubernetesOverlay(t, root)
	st, err := Run(context.Background(), kubeOpts(t, root, ignition(ignFile("/etc/kiln/node.yaml", 0o644, []byte(cpNodeYAML)))))
	if err == nil || !strings.Contains(err.Error(), "no cluster CA at /etc/kubernetes/pki/ca.crt") {
		t.Fatalf("Run = %v", err)
	}
	if s, _ := taskState(st, "kubelet"); s != task.StateBlocked {
		t.Errorf("kubelet task %s, want blocked", s)
	}
	if line := st.Line(); !strings.Contains(line, "task pki failed") {
		t.Errorf("Line = %q", line)
	}
}

// An image without the kubernetes overlay (the etcd/DNS smoke images) is a control plane
// that runs no Kubernetes: first boot neither asks for CAs nor writes certificates.
func TestRunControlPlaneWithoutKubernetes(t *testing.T) {
	root := nodeRoot(t, "control-plane")
	st, err := Run(context.Background(), kubeOpts(t, root, ignition(ignFile("/etc/kiln/node.yaml", 0o644, []byte(cpNodeYAML)))))
	if err != nil {
		t.Fatalf("first boot of a Kubernetes-free control plane: %v", err)
	}
	for _, name := range []string{"pki", "kubelet"} {
		if s, _ := taskState(st, name); s != task.StateUnchanged {
			t.Errorf("%s task %s, want unchanged", name, s)
		}
	}
	if _, err := os.Stat(filepath.Join(root, "etc/kubernetes/pki/apiserver.crt")); err == nil {
		t.Error("certificates written on an image without Kubernetes")
	}
}

// fakeMachine is a /proc and /sys with one NIC, eth0, and no default route: its address is
// whatever addrs returns (nothing until DHCP "answers").
func fakeMachine(t *testing.T, addrs func() []netip.Prefix) FactsOptions {
	t.Helper()
	dir := t.TempDir()
	for p, s := range map[string]string{
		"proc/meminfo":                     "MemTotal:        2048000 kB\n",
		"proc/sys/kernel/osrelease":        "6.1.0-40-cloud-amd64\n",
		"proc/sys/kernel/hostname":         "(none)\n",
		"proc/cmdline":                     "root=PARTUUID=x ro kiln.platform=qemu\n",
		"proc/net/route":                   "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n",
		"sys/devices/system/cpu/online":    "0-1\n",
		"sys/fs/cgroup/cgroup.controllers": "cpu io memory pids\n",
		"sys/devices/pci0000:00/0000:00:03.0/virtio0/net/eth0/address": "52:54:00:12:34:56\n",
		"sys/devices/pci0000:00/0000:00:03.0/virtio0/net/eth0/type":    "1\n",
	} {
		os.MkdirAll(filepath.Dir(filepath.Join(dir, p)), 0o755)
		if err := os.WriteFile(filepath.Join(dir, p), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	os.MkdirAll(filepath.Join(dir, "sys/class/net"), 0o755)
	if err := os.Symlink("../../devices/pci0000:00/0000:00:03.0/virtio0/net/eth0", filepath.Join(dir, "sys/class/net/eth0")); err != nil {
		t.Fatal(err)
	}
	return FactsOptions{ProcRoot: filepath.Join(dir, "proc"), SysRoot: filepath.Join(dir, "sys"),
		Addrs: func(string) ([]netip.Prefix, error) { return addrs(), nil }}
}

// A node whose DHCP lease comes after first boot started waits for it, whatever its role:
// `kiln-init status` says what it waits for while it waits, and once the address is there
// the templates and a control plane's certificates carry it. Without any address first boot
// fails after AddressWait, naming the missing address.
// lateLease is the address DHCP hands out once first boot waits for it.
const lateLease = "10.0.2.15"

// addressWaitCase is a node that boots before its address is known.
type addressWaitCase struct {
	name     string
	role     string
	nodeYAML string
	kube     bool // the kubernetes overlay and the cluster's CAs: the pki task makes certificates
	dhcp     bool // DHCP answers, once the status shows the wait
	wantErr  string
}

var addressWaitCases = []addressWaitCase{
	{name: "worker, late lease", role: "worker", nodeYAML: workerNodeYAML, dhcp: true},
	{name: "control plane, late lease", role: "control-plane", nodeYAML: cpNodeYAML, kube: true, dhcp: true},
	{name: "etcd, late lease", role: "etcd", nodeYAML: "cluster: {name: demo, dnsZone: example.com}\nrole: etcd\nhostname: etcd-1\netcd: {member: a, members: [a]}\n", dhcp: true},
	{name: "worker, no lease", role: "worker", nodeYAML: workerNodeYAML,
		wantErr: "task facts failed: apply: a worker node needs its IP address (not known yet: an IPv4/IPv6 address on a link (DHCP)); gave up waiting for it after 300ms"},
}

func TestFirstBootWaitsForItsAddress(t *testing.T) {
	for _, tc := range addressWaitCases {
		t.Run(tc.name, func(t *testing.T) {
			root := nodeRoot(t, tc.role)
			files := []string{ignFile("/etc/kiln/node.yaml", 0o644, []byte(tc.nodeYAML))}
			if tc.kube {
				withKubernetesOverlay(t, root)
				files = append(files, clusterSecrets(t)...)
			}
			var mu sync.Mutex
			shown := "" // `kiln-init status` while first boot waited
			fo := fakeMachine(t, func() []netip.Prefix {
				mu.Lock()
				defer mu.Unlock()
				if shown == "" {
					st, err := ReadStatus(root)
					if err != nil || st.State != StateRunning || st.Waiting == nil {
						return nil
					}
					var b strings.Builder
					if err := PrintStatus(&b, st, "table"); err != nil {
						t.Error(err)
					}
					shown = b.String()
				}
				if !tc.dhcp {
					return nil
				}
				return []netip.Prefix{netip.MustParsePrefix(lateLease + "/24")}
			})
			fo.AddressWait = 300 * time.Millisecond
			if tc.dhcp {
				fo.AddressWait = time.Minute
			}
			o := kubeOpts(t, root, ignition(files...))
			o.Facts = fo
			st, err := Run(context.Background(), o)

			mu.Lock()
			defer mu.Unlock()
			for _, want := range []string{"running", "waiting for an IPv4/IPv6 address on a link (DHCP) (needed by facts), "} {
				if !strings.Contains(shown, want) {
					t.Errorf("kiln-init status while first boot waited lacks %q:\n%s", want, shown)
				}
			}
			if tc.wantErr != "" {
				checkGaveUpWaiting(t, tc, root, st, err)
				return
			}
			checkLateLease(t, tc, root, st, err)
		})
	}
}

// checkGaveUpWaiting checks a first boot that never got its address failed naming it, left render
// blocked and saved the failed status with the one wait still unknown.
func checkGaveUpWaiting(t *testing.T, tc addressWaitCase, root string, st *Status, err error) {
	t.Helper()
	if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(st.Line(), tc.wantErr) {
		t.Fatalf("Run = %v, want %q", err, tc.wantErr)
	}
	if s, _ := taskState(st, "render"); s != task.StateBlocked {
		t.Errorf("render %s, want blocked", s)
	}
	if saved, err := ReadStatus(root); err != nil || saved.State != StateFailed || saved.Waiting != nil ||
		len(saved.Waits) != 1 || saved.Waits[0].Known {
		t.Errorf("status.json after the run = %+v, %v", saved, err)
	}
}

// checkLateLease checks a first boot that got its address late used it for the kubelet and, with
// kubernetes, the apiserver certificate, and saved an ok status with the one wait known.
func checkLateLease(t *testing.T, tc addressWaitCase, root string, st *Status, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("first boot: %v", err)
	}
	if got := nodeIP(t, root); got != lateLease {
		t.Errorf("node IP %s, want the late lease %s", got, lateLease)
	}
	if s, e := taskState(st, "render"); s != task.StateApplied {
		t.Errorf("render %s %s, want applied", s, e)
	}
	saved, err := ReadStatus(root)
	if err != nil || saved.State != StateOK || saved.Waiting != nil || len(saved.Waits) != 1 || !saved.Waits[0].Known {
		t.Errorf("status.json after the run = %+v, %v; want ok with one wait, known", saved, err)
	}
	if tc.kube {
		crt, err := pki.ReadKeyPair(filepath.Join(root, "etc/kubernetes/pki"), "apiserver")
		if err != nil {
			t.Fatal(err)
		}
		if c, _ := pki.ParseCertPEM(crt.CertPEM); c == nil || c.VerifyHostname(lateLease) != nil {
			t.Errorf("the apiserver certificate does not cover the late lease %s", lateLease)
		}
	}
}

// The tasks that need the node's address and find none say so with task.Unknown, so the
// runner waits for the address and runs them again instead of failing first boot.
func TestNoAddressIsUnknown(t *testing.T) {
	for _, tc := range []struct {
		name string
		role string
		run  func(p *plan, ctx context.Context) (bool, error)
		want string
	}{
		{"pki", "control-plane", (*plan).writePKI, "the node has no IP address for the API server"},
		{"render", "worker", (*plan).render, `<required "the node has no IP address" .NodeIP>`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := nodeRoot(t, tc.role)
			withKubernetesOverlay(t, root)
			mustWrite(t, filepath.Join(root, "etc/kubernetes/pki/ca.crt"), "a CA")
			n := &config.Node{Role: config.Role(tc.role)}
			p := &plan{opts: withDefaults(Options{Root: root}), node: n, facts: &facts.Facts{Hostname: "node-1"}}
			_, err := tc.run(p, context.Background())
			var u *task.UnknownError
			if !errors.As(err, &u) || u.Fact != factAddress || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("%s without an address: %v, want task.Unknown(%q) saying %q", tc.name, err, factAddress, tc.want)
			}
		})
	}
}

// The leader-election timings of node.yaml reach the control plane's templates as written;
// unset ones stay empty (the components' defaults).
func TestRenderDataLeaderElection(t *testing.T) {
	for _, tc := range []struct {
		yaml string
		want render.LeaderElection
	}{
		{"", render.LeaderElection{}},
		{"kubernetes: {leaderElection: {leaseDuration: 60s, renewDeadline: 40s, retryPeriod: 5s}}\n",
			render.LeaderElection{LeaseDuration: "60s", RenewDeadline: "40s", RetryPeriod: "5s"}},
		{"kubernetes: {leaderElection: {renewDeadline: 12s}}\n", render.LeaderElection{RenewDeadline: "12s"}},
	} {
		n, err := config.ParseNode([]byte("cluster: {name: demo, dnsZone: kiln.test}\nrole: control-plane\netcd: {member: a, members: [a]}\n"+tc.yaml), "node.yaml")
		if err != nil {
			t.Fatal(err)
		}
		if got := renderData(n, &facts.Facts{IPv4: "10.0.0.1"}).Node.Kubernetes.LeaderElection; got != tc.want {
			t.Errorf("%q: leader election %+v, want %+v", tc.yaml, got, tc.want)
		}
	}
}

// Several etcd members find each other by their DNS names: every member's manifest gets the
// same --initial-cluster of etcd-<member>.internal.<cluster>.<zone> peer URLs, in the order
// node.yaml lists them, and its own peer URL among them. One member gets neither here (its
// peer URL is its address, added once the address is known).
func TestRenderDataEtcdMembers(t *testing.T) {
	const three = "a=https://etcd-a.internal.demo.kiln.test:2380,b=https://etcd-b.internal.demo.kiln.test:2380," +
		"c=https://etcd-c.internal.demo.kiln.test:2380"
	for _, tc := range []struct {
		name, etcd      string
		initialCluster  string
		peerURL, member string
	}{
		{"first of three", "{member: a, members: [a, b, c]}", three, "https://etcd-a.internal.demo.kiln.test:2380", "a"},
		{"last of three", "{member: c, members: [a, b, c]}", three, "https://etcd-c.internal.demo.kiln.test:2380", "c"},
		{"one member", "{member: a, members: [a]}", "", "", "a"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, err := config.ParseNode([]byte("cluster: {name: demo, dnsZone: kiln.test}\nrole: control-plane\netcd: "+tc.etcd+"\n"), "node.yaml")
			if err != nil {
				t.Fatal(err)
			}
			e := renderData(n, &facts.Facts{IPv4: "10.0.0.1"}).Node.Etcd
			if got := e.InitialCluster(); got != tc.initialCluster {
				t.Errorf("--initial-cluster=%s\nwant %s", got, tc.initialCluster)
			}
			if e.PeerURL != tc.peerURL || e.Name != tc.member {
				t.Errorf("member %q peer URL %q, want %q %q", e.Name, e.PeerURL, tc.member, tc.peerURL)
			}
		})
	}
}

// etcdNodeSecrets are the files kiln cluster init puts in an etcd node's Ignition config: the
// etcd CA only.
func etcdNodeSecrets(t *testing.T) []string {
	t.Helper()
	kp, err := pki.NewCA("etcd-ca", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return []string{ignFile("/etc/kubernetes/pki/etcd/ca.crt", 0o644, kp.CertPEM), ignFile("/etc/kubernetes/pki/etcd/ca.key", 0o600, kp.KeyPEM)}
}

// An etcd node's first boot makes its member certificates from the etcd CA, renders etcd's
// drop-in (its flags; no etcd without its disk) and hands over to etcd.service and, as a
// member of several, to kiln-etcd-member, with no kubelet; a control plane of the external
// topology gets no member certificate, no etcd manifest and an API server that uses the etcd
// nodes' members.
func TestRunEtcdNodeAndExternalControlPlane(t *testing.T) {
	t.Run("etcd node", func(t *testing.T) {
		root := nodeRoot(t, "etcd")
		withOverlays(t, root, "base", "etcd")
		node := "cluster: {name: demo, dnsZone: example.com}\nrole: etcd\nhostname: demo-etcd-1\netcd: {member: a, members: [a, b, c]}\n"
		cfg := ignition(append(etcdNodeSecrets(t), ignFile("/etc/kiln/node.yaml", 0o644, []byte(node)))...)
		st, err := Run(context.Background(), kubeOpts(t, root, cfg))
		if err != nil {
			t.Fatalf("first boot: %v\n%+v", err, st.Tasks)
		}
		dir := filepath.Join(root, "etc/kubernetes/pki")
		kp, err := pki.ReadKeyPair(dir, "etcd/peer")
		if err != nil {
			t.Fatal(err)
		}
		if c, _ := pki.ParseCertPEM(kp.CertPEM); !slices.Contains(c.DNSNames, "etcd-a.internal.demo.example.com") {
			t.Errorf("etcd peer certificate names %v, want etcd-a.internal.demo.example.com", c.DNSNames)
		}
		if _, err := os.Stat(filepath.Join(dir, "etcd/healthcheck-client.crt")); err != nil {
			t.Errorf("no health-check client certificate (kiln-init asks the members with it): %v", err)
		}
		m, err := os.ReadFile(filepath.Join(root, "etc/systemd/system/etcd.service.d/10-kiln.conf"))
		for _, want := range []string{"--initial-advertise-peer-urls=https://etcd-a.internal.demo.example.com:2380",
			"RequiresMountsFor=/var/lib/etcd\n", "--data-dir=/var/lib/etcd "} {
			if err != nil || !strings.Contains(string(m), want) {
				t.Errorf("etcd's drop-in lacks %s (%v):\n%s", want, err, m)
			}
		}
		for _, u := range []string{"etcd.service", "kiln-etcd-member.service"} {
			if !enabled(root, u) {
				t.Errorf("%s is not enabled", u)
			}
		}
		if enabled(root, "kubelet.service") {
			t.Error("kubelet is enabled on an etcd node")
		}
	})
	t.Run("control plane of the external topology", func(t *testing.T) {
		root := nodeRoot(t, "control-plane")
		withKubernetesOverlay(t, root)
		node := "cluster: {name: demo, dnsZone: example.com}\nrole: control-plane\nhostname: cp-1\netcd: {external: true, members: [a, b, c]}\napiEndpoint: 192.0.2.10:6443\n"
		cfg := ignition(append(clusterSecrets(t), ignFile("/etc/kiln/node.yaml", 0o644, []byte(node)))...)
		st, err := Run(context.Background(), kubeOpts(t, root, cfg))
		if err != nil {
			t.Fatalf("first boot: %v\n%+v", err, st.Tasks)
		}
		for _, p := range []string{"etc/kubernetes/pki/etcd/server.crt", "etc/kubernetes/etcd/etcd.manifest", "etc/kubernetes/manifests/etcd.manifest"} {
			if _, err := os.Lstat(filepath.Join(root, p)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("/%s exists on a control plane without an etcd member (%v)", p, err)
			}
		}
		if _, err := os.Stat(filepath.Join(root, "etc/kubernetes/pki/apiserver-etcd-client.crt")); err != nil {
			t.Errorf("the API server has no etcd client certificate: %v", err)
		}
		a, err := os.ReadFile(filepath.Join(root, "etc/kubernetes/manifests/kube-apiserver.yaml"))
		want := "--etcd-servers=https://etcd-a.internal.demo.example.com:2379,https://etcd-b.internal.demo.example.com:2379,https://etcd-c.internal.demo.example.com:2379"
		if err != nil || !strings.Contains(string(a), want) || strings.Contains(string(a), "wait-voter") {
			t.Errorf("kube-apiserver manifest (%v) lacks %s or waits for a member of its own:\n%s", err, want, a)
		}
		if enabled(root, "kiln-etcd-member.service") {
			t.Error("kiln-etcd-member.service is enabled on a control plane without an etcd member")
		}
	})
}
