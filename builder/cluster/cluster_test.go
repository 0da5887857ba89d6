package cluster

import (
	"bytes"
	"crypto/x509"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kilnproject/kiln/initd/config"
	"github.com/kilnproject/kiln/initd/pki"
	"github.com/kilnproject/kiln/internal/atomicfile"
	"github.com/kilnproject/kiln/internal/kubeconfig"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

var now = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// nodeFiles parses an Ignition config the way kiln-init does and returns its files by path.
func nodeFiles(t *testing.T, ign []byte) map[string]config.File {
	t.Helper()
	cfg, err := config.Parse(ign)
	if err != nil {
		t.Fatalf("config.Parse: %v", err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("config.Validate: %v", err)
	}
	if len(cfg.Warnings) > 0 {
		t.Errorf("warnings: %v", cfg.Warnings)
	}
	files, err := cfg.Files()
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]config.File{}
	for _, f := range files {
		if !f.Overwrite || !f.ModeSet {
			t.Errorf("%s: overwrite %t, mode set %t", f.Path, f.Overwrite, f.ModeSet)
		}
		m[f.Path] = f
	}
	return m
}

// initCase is a cluster spec and what Init makes of it.
type initCase struct {
	name      string
	spec      Spec
	nodes     []string
	members   []string
	endpoint  string
	volume    string
	adminHost string
}

var initCases = []initCase{
	{"defaults", Spec{Name: "demo", DNSZone: "k8s.example.com.", ControlPlanes: 1, Workers: 1, EtcdDiskSerial: "etcd-main"},
		[]string{"demo-cp-1", "demo-worker-1"}, []string{"a"}, "api.internal.demo.k8s.example.com:6443", "etcd-main", "https://api.internal.demo.k8s.example.com:6443"},
	{"three control planes", Spec{Name: "prod", DNSZone: "example.org", ControlPlanes: 3, Workers: 2, APIEndpoint: "10.0.0.10:443", SlowControlPlane: true,
		ControlPlanePreflightIgnore: []string{"cpus"}},
		[]string{"prod-cp-1", "prod-cp-2", "prod-cp-3", "prod-worker-1", "prod-worker-2"}, []string{"a", "b", "c"}, "10.0.0.10:443", "", "https://10.0.0.10:443"},
	{"three etcd nodes, one control plane", Spec{Name: "ext", DNSZone: "example.org", ControlPlanes: 1, Workers: 1, EtcdNodes: 3, EtcdDiskSerial: "etcd-main", SlowControlPlane: true},
		[]string{"ext-etcd-1", "ext-etcd-2", "ext-etcd-3", "ext-cp-1", "ext-worker-1"}, []string{"a", "b", "c"}, "api.internal.ext.example.org:6443", "etcd-main", "https://api.internal.ext.example.org:6443"},
	{"no workers, forwarded admin port", Spec{Name: "e2e", DNSZone: "test", ControlPlanes: 1, APIEndpoint: "192.168.100.11:6443", AdminServer: "https://127.0.0.1:16443", AdminTLSServerName: "kubernetes"},
		[]string{"e2e-cp-1"}, []string{"a"}, "192.168.100.11:6443", "", "https://127.0.0.1:16443"},
}

func TestInit(t *testing.T) {
	for _, tc := range initCases {
		t.Run(tc.name, func(t *testing.T) { checkInit(t, tc) })
	}
}

// checkInit runs Init for one case and checks the output directory, admin.conf,
// cluster.yaml and each node's Ignition config.
func checkInit(t *testing.T, tc initCase) {
	dir := filepath.Join(t.TempDir(), "out")
	c, err := Init(dir, tc.spec, false, now)
	if err != nil {
		t.Fatal(err)
	}
	checkInitModes(t, dir, tc.nodes)
	ca, err := pki.LoadCA(filepath.Join(dir, "pki"), "ca")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"front-proxy-ca", "etcd/ca"} {
		if _, err := pki.LoadCA(filepath.Join(dir, "pki"), name); err != nil {
			t.Error(err)
		}
	}
	tokData, _ := os.ReadFile(filepath.Join(dir, "bootstrap-token"))
	tok, err := pki.ParseToken(string(tokData))
	if err != nil {
		t.Fatal(err)
	}
	checkAdminConf(t, dir, ca, tc)

	// cluster.yaml lists the nodes.
	spec, _ := os.ReadFile(filepath.Join(dir, "cluster.yaml"))
	for _, n := range tc.nodes {
		if !bytes.Contains(spec, []byte("name: "+n)) {
			t.Errorf("cluster.yaml lacks node %s", n)
		}
	}
	if bytes.Contains(spec, []byte(tok.Secret)) {
		t.Error("cluster.yaml holds the token secret")
	}
	if len(c.Nodes) != len(tc.nodes) {
		t.Errorf("nodes %v", c.Nodes)
	}
	for _, n := range c.Nodes {
		t.Run(n.Name, func(t *testing.T) { checkNodeIgnition(t, dir, n, tc, ca, tok) })
	}
}

// checkInitModes checks what is in the output directory, with modes, and that nothing is
// left beside it.
func checkInitModes(t *testing.T, dir string, nodes []string) {
	t.Helper()
	want := map[string]os.FileMode{
		"pki/ca.crt": 0o644, "pki/ca.key": 0o600, "pki/front-proxy-ca.crt": 0o644, "pki/front-proxy-ca.key": 0o600,
		"pki/etcd/ca.crt": 0o644, "pki/etcd/ca.key": 0o600, "pki/sa.key": 0o600, "pki/sa.pub": 0o644,
		"admin.conf": 0o600, "bootstrap-token": 0o600, "cluster.yaml": 0o644,
	}
	for _, n := range nodes {
		want[n+".ign"] = 0o600
	}
	got := map[string]os.FileMode{}
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			fi, _ := d.Info()
			rel, _ := filepath.Rel(dir, p)
			got[rel] = fi.Mode().Perm()
		}
		return nil
	})
	for p, m := range want {
		if got[p] != m {
			t.Errorf("%s: mode %v, want %v", p, got[p], m)
		}
	}
	if len(got) != len(want) {
		t.Errorf("files %v, want %v", got, want)
	}
	if fi, _ := os.Stat(dir); fi.Mode().Perm() != 0o700 {
		t.Errorf("output dir mode %v, want 0700", fi.Mode().Perm())
	}
	if ents, _ := os.ReadDir(filepath.Dir(dir)); len(ents) != 1 {
		t.Errorf("left beside the output: %v", ents)
	}
}

// checkAdminConf checks admin.conf's server and its client certificate, signed by ca.
func checkAdminConf(t *testing.T, dir string, ca *pki.CA, tc initCase) {
	t.Helper()
	adminData, _ := os.ReadFile(filepath.Join(dir, "admin.conf"))
	admin, err := kubeconfig.Parse(adminData)
	if err != nil {
		t.Fatal(err)
	}
	if admin.Server != tc.adminHost || admin.TLSServerName != tc.spec.AdminTLSServerName {
		t.Errorf("admin.conf server %s tls-server-name %q", admin.Server, admin.TLSServerName)
	}
	if err := pki.CheckLeaf(ca, pki.KeyPair{CertPEM: admin.CertPEM, KeyPEM: admin.KeyPEM},
		pki.Cert{CommonName: "kubernetes-admin", Organization: []string{"kubeadm:cluster-admins"}, Client: true}, now); err != nil {
		t.Errorf("admin.conf client certificate: %v", err)
	}
}

// checkNodeIgnition checks a node's Ignition config: its node.yaml, the CA, what its role
// needs, and that it holds exactly the files it should, with their modes.
func checkNodeIgnition(t *testing.T, dir string, n Node, tc initCase, ca *pki.CA, tok pki.Token) {
	ign, _ := os.ReadFile(filepath.Join(dir, n.Ignition))
	files := nodeFiles(t, ign)
	nc, err := config.ParseNode(files[nodeimage.NodeConfigPath].Contents, "node.yaml")
	if err != nil {
		t.Fatalf("node.yaml: %v", err)
	}
	if nc.Hostname != n.Name || string(nc.Role) != n.Role || nc.Cluster.Name != tc.spec.Name ||
		nc.APIEndpoint != tc.endpoint || nc.Kubernetes.Version != DefaultKubernetesVersion {
		t.Errorf("node.yaml: %+v", nc)
	}
	if n.Role == roleEtcd {
		checkEtcdNode(t, dir, n, nc, files, tc)
		return
	}
	if !bytes.Equal(files["/etc/kubernetes/pki/ca.crt"].Contents, ca.CertPEM) {
		t.Error("ca.crt differs from pki/ca.crt")
	}
	wantFiles := map[string]os.FileMode{nodeimage.NodeConfigPath: 0o644, "/etc/kubernetes/pki/ca.crt": 0o644}
	if n.Role == roleControlPlane {
		for p, m := range map[string]os.FileMode{
			"/etc/kubernetes/pki/ca.key": 0o600, "/etc/kubernetes/pki/front-proxy-ca.crt": 0o644,
			"/etc/kubernetes/pki/front-proxy-ca.key": 0o600, "/etc/kubernetes/pki/etcd/ca.crt": 0o644,
			"/etc/kubernetes/pki/etcd/ca.key": 0o600, "/etc/kubernetes/pki/sa.key": 0o600,
			"/etc/kubernetes/pki/sa.pub": 0o644, "/etc/kiln/bootstrap-token": 0o600,
		} {
			wantFiles[p] = m
		}
		checkControlPlaneNode(t, dir, n, nc, files, tc, tok)
	} else {
		wantFiles["/etc/kubernetes/bootstrap-kubelet.conf"] = 0o600
		checkWorkerNode(t, nc, files, tc, ca, tok)
	}
	for p, m := range wantFiles {
		f, ok := files[p]
		if !ok {
			t.Errorf("%s missing", p)
		} else if f.Mode.Perm() != m {
			t.Errorf("%s: mode %v, want %v", p, f.Mode.Perm(), m)
		}
	}
	if len(files) != len(wantFiles) {
		var paths []string
		for p := range files {
			paths = append(paths, p)
		}
		t.Errorf("files %v, want exactly %d", paths, len(wantFiles))
	}
}

// checkControlPlaneNode checks a control plane's leader election, etcd members and volume,
// bootstrap token and etcd CA key.
func checkControlPlaneNode(t *testing.T, dir string, n Node, nc *config.Node, files map[string]config.File, tc initCase, tok pki.Token) {
	t.Helper()
	wantLE := config.LeaderElection{}
	if tc.spec.SlowControlPlane {
		wantLE = slowLeaderElection
	}
	if nc.Kubernetes.LeaderElection != wantLE {
		t.Errorf("leader election %+v, want %+v", nc.Kubernetes.LeaderElection, wantLE)
	}
	checkEtcdTimings(t, nc, tc.spec.SlowControlPlane && tc.spec.EtcdNodes == 0)
	if !slices.Equal(nc.Preflight.Ignore, tc.spec.ControlPlanePreflightIgnore) {
		t.Errorf("preflight.ignore %v, want %v", nc.Preflight.Ignore, tc.spec.ControlPlanePreflightIgnore)
	}
	if nc.Etcd == nil || !slices.Equal(nc.Etcd.Members, tc.members) || nc.Etcd.Member != n.EtcdMember {
		t.Errorf("etcd %+v, want members %v", nc.Etcd, tc.members)
	}
	if nc.Etcd.External != (tc.spec.EtcdNodes > 0) {
		t.Errorf("etcd.external %v with %d etcd nodes", nc.Etcd.External, tc.spec.EtcdNodes)
	}
	if tc.spec.EtcdNodes > 0 {
		if nc.Etcd.Volume != nil || nc.Etcd.Member != "" {
			t.Errorf("control plane of the external topology with an etcd member: %+v", nc.Etcd)
		}
	} else if serial := ""; nc.Etcd.Volume != nil {
		serial = nc.Etcd.Volume.Serial
		if serial != tc.volume {
			t.Errorf("etcd volume serial %q, want %q", serial, tc.volume)
		}
	} else if tc.volume != "" {
		t.Error("no etcd volume")
	}
	if got, _ := pki.ParseToken(string(files["/etc/kiln/bootstrap-token"].Contents)); got != tok {
		t.Error("bootstrap token differs from the one in the output directory")
	}
	key, _ := os.ReadFile(filepath.Join(dir, "pki/etcd/ca.key"))
	if !bytes.Equal(files["/etc/kubernetes/pki/etcd/ca.key"].Contents, key) {
		t.Error("etcd/ca.key differs from pki/etcd/ca.key")
	}
}

// checkEtcdTimings checks a member's Raft timings: slow ones (500ms, 5s) or etcd's own.
func checkEtcdTimings(t *testing.T, nc *config.Node, slow bool) {
	t.Helper()
	if hb, el := nc.Etcd.EtcdTimings(); slow != (hb == 500 && el == 5000) || (!slow && hb+el != 0) {
		t.Errorf("etcd heartbeat %dms, election %dms; want slow timings: %v", hb, el, slow)
	}
}

// checkEtcdNode checks an etcd node: its member, the members, its disk and Raft timings, and
// that it holds the etcd CA and nothing else of the cluster's.
func checkEtcdNode(t *testing.T, dir string, n Node, nc *config.Node, files map[string]config.File, tc initCase) {
	t.Helper()
	if nc.Etcd == nil || nc.Etcd.External || nc.Etcd.Member != n.EtcdMember || !slices.Equal(nc.Etcd.Members, tc.members) ||
		nc.Etcd.Volume == nil || nc.Etcd.Volume.Serial != tc.volume {
		t.Errorf("etcd %+v, want member %s of %v on serial %s", nc.Etcd, n.EtcdMember, tc.members, tc.volume)
	}
	checkEtcdTimings(t, nc, tc.spec.SlowControlPlane)
	key, _ := os.ReadFile(filepath.Join(dir, "pki/etcd/ca.key"))
	if !bytes.Equal(files["/etc/kubernetes/pki/etcd/ca.key"].Contents, key) {
		t.Error("etcd/ca.key differs from pki/etcd/ca.key")
	}
	want := []string{nodeimage.NodeConfigPath, "/etc/kubernetes/pki/etcd/ca.crt", "/etc/kubernetes/pki/etcd/ca.key"}
	var got []string
	for p := range files {
		got = append(got, p)
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("files %v, want exactly %v", got, want)
	}
}

// checkWorkerNode checks that a worker has no etcd and a bootstrap kubeconfig with the
// endpoint, token and CA.
func checkWorkerNode(t *testing.T, nc *config.Node, files map[string]config.File, tc initCase, ca *pki.CA, tok pki.Token) {
	t.Helper()
	if nc.Etcd != nil {
		t.Error("worker with etcd")
	}
	kc, err := kubeconfig.Parse(files["/etc/kubernetes/bootstrap-kubelet.conf"].Contents)
	if err != nil {
		t.Fatal(err)
	}
	if kc.Server != "https://"+tc.endpoint || kc.User != "kubelet-bootstrap" || kc.Token != tok.String() || !bytes.Equal(kc.CAPEM, ca.CertPEM) {
		t.Errorf("bootstrap-kubelet.conf: %+v", kc)
	}
}

// What a control plane's first boot does with its Ignition config: the certs and
// kubeconfigs phases succeed on the delivered CAs.
func TestControlPlaneFirstBoot(t *testing.T) {
	c, err := generate(Spec{Name: "demo", DNSZone: "k8s.example.com", ControlPlanes: 1, Workers: 1}, now)
	if err != nil {
		t.Fatal(err)
	}
	ign, err := c.ignition(c.Nodes[0])
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	for p, f := range nodeFiles(t, ign) {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := atomicfile.Write(filepath.Join(root, p), f.Contents, atomicfile.Options{Mode: f.Mode.Perm()}); err != nil {
			t.Fatal(err)
		}
	}
	nc, err := config.LoadNodeIn(root)
	if err != nil {
		t.Fatal(err)
	}
	host, _, _ := net.SplitHostPort(nc.APIEndpoint)
	n := pki.Node{Hostname: nc.Hostname, IPs: []net.IP{net.ParseIP("192.168.100.11")},
		APIServerSANs: []string{host, nc.InternalName("api")}, EtcdSANs: []string{nc.InternalName("etcd-" + nc.Etcd.Member)},
		ServiceCIDR: nc.Kubernetes.ServiceCIDR, ClusterDomain: nc.Kubernetes.ClusterDomain}
	pkiDir := filepath.Join(root, "etc/kubernetes/pki")
	if changed, err := pki.ControlPlaneCerts(pkiDir, n, now); err != nil || len(changed) != 7 {
		t.Fatalf("certs phase: %v, %v", changed, err)
	}
	if changed, err := pki.ControlPlaneKubeconfigs(filepath.Join(root, "etc/kubernetes"), pkiDir, n, "https://192.168.100.11:6443", now); err != nil || len(changed) != 5 {
		t.Fatalf("kubeconfig phase: %v, %v", changed, err)
	}
	// The worker's bootstrap kubeconfig trusts the CA that signed the API server.
	data, _ := os.ReadFile(filepath.Join(pkiDir, "apiserver.crt"))
	apiserver, _ := pki.ParseCertPEM(data)
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(c.CA.CertPEM)
	if _, err := apiserver.Verify(x509.VerifyOptions{Roots: roots, DNSName: "api.internal.demo.k8s.example.com", CurrentTime: now}); err != nil {
		t.Errorf("the API server's certificate is not valid for the default endpoint: %v", err)
	}
}

func TestInitRefusesAndReplaces(t *testing.T) {
	parent := t.TempDir()
	dir := filepath.Join(parent, "out")
	spec := Spec{Name: "demo", DNSZone: "example.com", ControlPlanes: 1, Workers: 1}

	// An empty directory is fine.
	os.Mkdir(dir, 0o755)
	if _, err := Init(dir, spec, false, now); err != nil {
		t.Fatalf("empty dir: %v", err)
	}
	first, _ := os.ReadFile(filepath.Join(dir, "pki/ca.crt"))

	// A second init without --force keeps the first cluster.
	_, err := Init(dir, spec, false, now)
	if !errors.Is(err, errNotEmpty) || !strings.Contains(err.Error(), "--force") {
		t.Errorf("second init: %v, want a refusal mentioning --force", err)
	}
	if again, _ := os.ReadFile(filepath.Join(dir, "pki/ca.crt")); !bytes.Equal(again, first) {
		t.Error("a refused init changed the CA")
	}

	// --force replaces it whole: a stray file of the old directory is gone.
	os.WriteFile(filepath.Join(dir, "stray"), []byte("x"), 0o644)
	spec.Workers = 0
	if _, err := Init(dir, spec, true, now); err != nil {
		t.Fatal(err)
	}
	if again, _ := os.ReadFile(filepath.Join(dir, "pki/ca.crt")); bytes.Equal(again, first) {
		t.Error("--force kept the old CA")
	}
	for _, gone := range []string{"stray", "demo-worker-1.ign"} {
		if _, err := os.Stat(filepath.Join(dir, gone)); err == nil {
			t.Errorf("%s survived --force", gone)
		}
	}
	if ents, _ := os.ReadDir(parent); len(ents) != 1 {
		t.Errorf("left beside the output: %v", ents)
	}

	// A bad spec writes nothing.
	bad := filepath.Join(parent, "bad")
	if _, err := Init(bad, Spec{Name: "Bad"}, false, now); err == nil {
		t.Error("bad spec accepted")
	}
	if _, err := os.Stat(bad); err == nil {
		t.Error("a failed init left its output directory")
	}
	// A file in the way.
	os.WriteFile(filepath.Join(parent, "file"), nil, 0o644)
	if _, err := Init(filepath.Join(parent, "file"), spec, true, now); err == nil || !strings.Contains(err.Error(), "not a directory") {
		t.Errorf("file as output: %v", err)
	}
}

func TestSpecErrors(t *testing.T) {
	ok := Spec{Name: "demo", DNSZone: "example.com", ControlPlanes: 1, Workers: 1}
	for _, tc := range []struct {
		name   string
		change func(*Spec)
		want   string
	}{
		{"no name", func(s *Spec) { s.Name = "" }, "--name: is required"},
		{"upper-case name", func(s *Spec) { s.Name = "Demo" }, `--name: "Demo" is not an RFC 1123 label`},
		{"long name", func(s *Spec) { s.Name = strings.Repeat("a", 60) }, "longer than 63"},
		{"no zone", func(s *Spec) { s.DNSZone = "" }, "--dns-zone: is required"},
		{"bad zone", func(s *Spec) { s.DNSZone = "Ex_ample.com" }, `--dns-zone: "Ex_ample.com" is not an RFC 1123 DNS name`},
		{"two control planes", func(s *Spec) { s.ControlPlanes = 2 }, "--control-planes: 2"},
		{"negative workers", func(s *Spec) { s.Workers = -1 }, "--workers: -1"},
		{"two etcd nodes", func(s *Spec) { s.EtcdNodes = 2 }, "--etcd-nodes: 2: a cluster has 0 (a member on each control plane), 1, 3 or 5 etcd nodes"},
		{"endpoint without port", func(s *Spec) { s.APIEndpoint = "10.0.0.1" }, "--api-endpoint"},
		{"serial with slash", func(s *Spec) { s.EtcdDiskSerial = "a/b" }, "--etcd-disk-serial"},
		{"bad pod CIDR", func(s *Spec) { s.PodCIDR = "10.244.0.0" }, "--pod-cidr: \"10.244.0.0\" is not a CIDR"},
		{"overlapping CIDRs", func(s *Spec) { s.PodCIDR = "10.96.0.0/16" }, "--service-cidr: 10.96.0.0/12 overlaps podCIDR"},
		{"http admin server", func(s *Spec) { s.AdminServer = "http://x:1" }, "--admin-server"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := ok
			tc.change(&s)
			_, err := generate(s, now)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Generate: %v, want an error containing %q", err, tc.want)
			}
		})
	}
}
