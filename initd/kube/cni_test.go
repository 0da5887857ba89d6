package kube

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kilnproject/kiln/initd/pki"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

// testCA is a cluster CA for tests.
func testCA(t *testing.T) *pki.CA {
	t.Helper()
	kp, err := pki.NewCA("kubernetes", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	ca, err := pki.ParseCA(kp)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func issue(t *testing.T, ca *pki.CA, c pki.Cert) pki.KeyPair {
	t.Helper()
	kp, err := ca.Issue(c, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return kp
}

func mustWrite(t *testing.T, p string, data []byte, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, data, mode); err != nil {
		t.Fatal(err)
	}
}

// fakeAPI is a TLS server that requires a client certificate of ca and serves one Node
// whose pod CIDR appears after a few reads, as kube-controller-manager allocates it.
type fakeAPI struct {
	*httptest.Server
	reads    atomic.Int32
	register int32         // reads answered 404 (kubelet has not registered the node yet)
	allocate int32         // reads before the pod CIDR appears
	delay    time.Duration // how long each answer takes
	cidrs    []string
	users    chan string
}

func newFakeAPI(t *testing.T, ca *pki.CA, node string) *fakeAPI {
	t.Helper()
	f := &fakeAPI{users: make(chan string, 100)}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := f.reads.Add(1)
		time.Sleep(f.delay)
		if len(r.TLS.PeerCertificates) > 0 {
			f.users <- r.TLS.PeerCertificates[0].Subject.CommonName
		}
		if r.URL.Path != "/api/v1/nodes/"+node || n <= f.register {
			w.WriteHeader(http.StatusNotFound)
			fmt.Fprintf(w, `{"kind":"Status","reason":"NotFound","message":"nodes %q not found"}`, node)
			return
		}
		obj := map[string]any{"kind": "Node", "metadata": map[string]any{"name": node}, "spec": map[string]any{}}
		if n > f.allocate {
			obj["spec"] = map[string]any{"podCIDR": f.cidrs[0], "podCIDRs": f.cidrs}
		}
		json.NewEncoder(w).Encode(obj)
	}))
	serving := issue(t, ca, pki.Cert{CommonName: "kube-apiserver", IPs: []net.IP{net.ParseIP("127.0.0.1")}, Server: true})
	cert, err := tls.X509KeyPair(serving.CertPEM, serving.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	f.Server = srv
	return f
}

// kubeletKubeconfig writes kubelet.conf as kubelet leaves it after its TLS bootstrap:
// the CA embedded, the client certificate and key in one rotated file it points at.
func kubeletKubeconfig(t *testing.T, root, server string, ca *pki.CA, node string) {
	t.Helper()
	client := issue(t, ca, pki.Cert{CommonName: "system:node:" + node, Organization: []string{"system:nodes"}, Client: true})
	mustWrite(t, filepath.Join(root, "var/lib/kubelet/pki/kubelet-client-current.pem"), append(client.CertPEM, client.KeyPEM...), 0o600)
	conf := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- cluster:
    certificate-authority-data: %s
    server: %s
  name: default-cluster
contexts:
- context:
    cluster: default-cluster
    namespace: default
    user: default-auth
  name: default-context
current-context: default-context
preferences: {}
users:
- name: default-auth
  user:
    client-certificate: /var/lib/kubelet/pki/kubelet-client-current.pem
    client-key: /var/lib/kubelet/pki/kubelet-client-current.pem
`, b64(ca.CertPEM), server)
	mustWrite(t, filepath.Join(root, nodeimage.KubeletConfPath), []byte(conf), 0o600)
}

func TestEnsureCNI(t *testing.T) {
	for _, tc := range []struct {
		name     string
		cidrs    []string
		register int32
		allocate int32
		noConf   bool // kubelet has not written kubelet.conf (still bootstrapping)
		delay    time.Duration
		wait     time.Duration
		wantErr  string
	}{
		{name: "pod CIDR at once", cidrs: []string{"10.244.1.0/24"}, wait: 5 * time.Second},
		{name: "waits for registration and allocation", cidrs: []string{"10.244.2.0/24"}, register: 2, allocate: 4, wait: 5 * time.Second},
		{name: "dual stack", cidrs: []string{"10.244.3.0/24", "fd00:10:244:3::/64"}, wait: 5 * time.Second},
		{name: "no pod CIDR in time", cidrs: []string{"10.244.4.0/24"}, allocate: 1000, wait: 200 * time.Millisecond,
			wantErr: "has no spec.podCIDR yet"},
		// A slow API server (or a loaded node): the wait ends while a read is under way, and
		// the error still says what the node lacks.
		{name: "the wait ends during a read", cidrs: []string{"10.244.4.0/24"}, allocate: 1000, delay: 300 * time.Millisecond,
			wait: 100 * time.Millisecond, wantErr: "has no spec.podCIDR yet"},
		{name: "kubelet never got credentials", cidrs: []string{"10.244.5.0/24"}, noConf: true, wait: 300 * time.Millisecond,
			wantErr: "kubelet.conf"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ca := testCA(t)
			api := newFakeAPI(t, ca, "worker-1")
			api.register, api.allocate, api.delay, api.cidrs = tc.register, tc.allocate, tc.delay, tc.cidrs
			root := t.TempDir()
			if !tc.noConf {
				kubeletKubeconfig(t, root, api.URL, ca, "worker-1")
			}
			o := CNIOptions{Root: root, NodeName: "worker-1", Wait: tc.wait, interval: 20 * time.Millisecond}
			cidrs, changed, err := EnsureCNI(context.Background(), o)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
				}
				if _, err := os.Stat(filepath.Join(root, nodeimage.CNIConfPath)); err == nil {
					t.Error("a CNI config was written without a pod CIDR")
				}
				return
			}
			if err != nil || !changed || strings.Join(cidrs, ",") != strings.Join(tc.cidrs, ",") {
				t.Fatalf("EnsureCNI = %v, %v, %v; want %v, true, nil", cidrs, changed, err, tc.cidrs)
			}
			if u := <-api.users; u != "system:node:worker-1" {
				t.Errorf("the API saw user %q, want kubelet's system:node:worker-1", u)
			}
			data, err := os.ReadFile(filepath.Join(root, nodeimage.CNIConfPath))
			if err != nil {
				t.Fatal(err)
			}
			want, _ := bridgeConfig(tc.cidrs)
			if !bytes.Equal(data, want) {
				t.Errorf("%s =\n%s\nwant\n%s", nodeimage.CNIConfPath, data, want)
			}
			// A second run (every later boot) keeps it without asking the API.
			reads := api.reads.Load()
			if _, changed, err := EnsureCNI(context.Background(), o); err != nil || changed {
				t.Errorf("second EnsureCNI changed=%v err=%v, want unchanged", changed, err)
			}
			if api.reads.Load() != reads {
				t.Error("the second run asked the API")
			}
		})
	}
}

func TestBridgeConfig(t *testing.T) {
	data, err := bridgeConfig([]string{"10.244.1.0/24", "fd00:10:244:1::/64"})
	if err != nil {
		t.Fatal(err)
	}
	var conf struct {
		CNIVersion string `json:"cniVersion"`
		Name       string `json:"name"`
		Plugins    []struct {
			Type      string `json:"type"`
			Bridge    string `json:"bridge"`
			IsGateway bool   `json:"isGateway"`
			IPMasq    bool   `json:"ipMasq"`
			IPAM      struct {
				Type   string                `json:"type"`
				Ranges [][]map[string]string `json:"ranges"`
				Routes []map[string]string   `json:"routes"`
			} `json:"ipam"`
			Capabilities map[string]bool `json:"capabilities"`
		} `json:"plugins"`
	}
	if err := json.Unmarshal(data, &conf); err != nil {
		t.Fatal(err)
	}
	if conf.CNIVersion != "1.0.0" || len(conf.Plugins) != 2 {
		t.Fatalf("conf = %+v", conf)
	}
	br, pm := conf.Plugins[0], conf.Plugins[1]
	if br.Type != "bridge" || br.Bridge != "cni0" || !br.IsGateway || !br.IPMasq || br.IPAM.Type != "host-local" ||
		br.IPAM.Ranges[0][0]["subnet"] != "10.244.1.0/24" || br.IPAM.Ranges[1][0]["subnet"] != "fd00:10:244:1::/64" ||
		br.IPAM.Routes[0]["dst"] != "0.0.0.0/0" || br.IPAM.Routes[1]["dst"] != "::/0" {
		t.Errorf("bridge plugin = %+v", br)
	}
	if pm.Type != "portmap" || !pm.Capabilities["portMappings"] {
		t.Errorf("portmap plugin = %+v", pm)
	}
	for _, bad := range [][]string{nil, {"10.244.1.0"}} {
		if _, err := bridgeConfig(bad); err == nil {
			t.Errorf("BridgeConfig(%q) = nil error", bad)
		}
	}
}

func TestLoadKubeconfigErrors(t *testing.T) {
	root := t.TempDir()
	for _, tc := range []struct {
		name, conf, want string
	}{
		{"missing file", "", "no such file"},
		{"not a kubeconfig", "kind: Pod\n", `kind is "Pod"`},
		{"no context", "kind: Config\ncurrent-context: x\n", `current-context "x"`},
		{"missing cluster", "kind: Config\ncurrent-context: c\ncontexts: [{name: c, context: {cluster: k, user: u}}]\nusers: [{name: u, user: {token: t}}]\n", `cluster "k" or user "u"`},
		{"bad CA", "kind: Config\ncurrent-context: c\ncontexts: [{name: c, context: {cluster: k, user: u}}]\nclusters: [{name: k, cluster: {server: 'https://x', certificate-authority-data: 'bm90IGEgY2VydA=='}}]\nusers: [{name: u, user: {token: t}}]\n", "no PEM certificate"},
		{"missing key file", "kind: Config\ncurrent-context: c\ncontexts: [{name: c, context: {cluster: k, user: u}}]\nclusters: [{name: k, cluster: {server: 'https://x'}}]\nusers: [{name: u, user: {client-certificate: /nope.pem, client-key: /nope.pem}}]\n", "client-certificate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := "/etc/kubernetes/" + strings.ReplaceAll(tc.name, " ", "-") + ".conf"
			if tc.conf != "" {
				mustWrite(t, filepath.Join(root, p), []byte(tc.conf), 0o600)
			}
			_, err := LoadKubeconfig(root, p)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "kubeconfig") {
				t.Errorf("err = %v, want one about the kubeconfig containing %q", err, tc.want)
			}
		})
	}
}
