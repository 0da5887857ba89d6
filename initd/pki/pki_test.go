package pki

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/x509"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kilnproject/kiln/internal/testkit"
)

var now = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// newPKIDir writes the three CAs and the service-account key into a temp dir.
func newPKIDir(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "pki")
	for name, cn := range map[string]string{CAName: CACommonName, FrontProxyCAName: FrontProxyCACommonName, EtcdCAName: EtcdCACommonName} {
		kp, err := NewCA(cn, now)
		if err != nil {
			t.Fatal(err)
		}
		if err := WriteKeyPair(dir, name, kp); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func testNode() Node {
	return Node{
		Hostname:      "demo-cp-1",
		IPs:           []net.IP{net.ParseIP("192.168.100.11")},
		APIServerSANs: []string{"api.internal.demo.example.com", "10.0.2.2"},
		EtcdSANs:      []string{"etcd-a.internal.demo.example.com"},
	}
}

func mode(t *testing.T, path string) os.FileMode {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode().Perm()
}

func readCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	c, err := ParseCertPEM(data)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return c
}

func openssl(t *testing.T, args ...string) string {
	t.Helper()
	return testkit.Run(t, testkit.Tool(t, "openssl", "openssl"), args...)
}

func TestNewCA(t *testing.T) {
	for _, cn := range []string{CACommonName, FrontProxyCACommonName, EtcdCACommonName} {
		t.Run(cn, func(t *testing.T) {
			kp, err := NewCA(cn, now)
			if err != nil {
				t.Fatal(err)
			}
			ca, err := ParseCA(kp)
			if err != nil {
				t.Fatal(err)
			}
			c := ca.Cert
			if c.Subject.CommonName != cn || !c.IsCA || c.KeyUsage&x509.KeyUsageCertSign == 0 {
				t.Errorf("CA cert: CN %q IsCA %t usage %v", c.Subject.CommonName, c.IsCA, c.KeyUsage)
			}
			if got := c.NotAfter.Sub(now); got != caValidity {
				t.Errorf("CA validity %s, want 10 years", got)
			}
			if k, ok := c.PublicKey.(*ecdsa.PublicKey); !ok || k.Curve != elliptic.P256() {
				t.Errorf("CA key is %T, want ECDSA P-256", c.PublicKey)
			}
			if !bytes.HasPrefix(kp.KeyPEM, []byte("-----BEGIN PRIVATE KEY-----")) {
				t.Errorf("key is not PKCS#8: %.40q", kp.KeyPEM)
			}
			dir := t.TempDir()
			if err := WriteKeyPair(dir, "ca", kp); err != nil {
				t.Fatal(err)
			}
			out := openssl(t, "x509", "-in", filepath.Join(dir, "ca.crt"), "-noout", "-text")
			for _, want := range []string{"Subject: CN = " + cn, "CA:TRUE", "Certificate Sign", "prime256v1"} {
				if !strings.Contains(out, want) {
					t.Errorf("openssl x509 -text lacks %q:\n%s", want, out)
				}
			}
			openssl(t, "pkey", "-in", filepath.Join(dir, "ca.key"), "-noout")
		})
	}
}

func TestParseCAErrors(t *testing.T) {
	a, _ := NewCA("a", now)
	b, _ := NewCA("b", now)
	leafCA, _ := ParseCA(a)
	leaf, _ := leafCA.Issue(Cert{CommonName: "leaf", Client: true}, now)
	for _, tc := range []struct {
		name string
		kp   KeyPair
		want string
	}{
		{"key of another CA", KeyPair{CertPEM: a.CertPEM, KeyPEM: b.KeyPEM}, "does not match"},
		{"not a CA", leaf, "is not a CA"},
		{"garbage", KeyPair{CertPEM: []byte("nope"), KeyPEM: a.KeyPEM}, "no CERTIFICATE"},
		{"no key", KeyPair{CertPEM: a.CertPEM}, "no private key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseCA(tc.kp)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("ParseCA: %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestLoadCANamesFile(t *testing.T) {
	dir := t.TempDir()
	_, err := LoadCA(dir, "etcd/ca")
	if err == nil || !strings.Contains(err.Error(), filepath.Join(dir, "etcd/ca.crt")) {
		t.Errorf("LoadCA of a missing CA: %v, want the file named", err)
	}
	a, _ := NewCA("a", now)
	b, _ := NewCA("b", now)
	WriteKeyPair(dir, "ca", KeyPair{CertPEM: a.CertPEM, KeyPEM: b.KeyPEM})
	_, err = LoadCA(dir, "ca")
	if err == nil || !strings.Contains(err.Error(), filepath.Join(dir, "ca")) || !strings.Contains(err.Error(), "does not match") {
		t.Errorf("LoadCA of a mismatched pair: %v", err)
	}
}

func TestWriteKeyPairModes(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a", "b")
	kp, _ := NewCA("x", now)
	if err := WriteKeyPair(dir, "etcd/ca", kp); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]os.FileMode{
		filepath.Join(dir, "etcd/ca.crt"): 0o644,
		filepath.Join(dir, "etcd/ca.key"): 0o600,
		filepath.Join(dir, "etcd"):        0o755,
		dir:                               0o755,
	} {
		if got := mode(t, path); got != want {
			t.Errorf("%s: mode %v, want %v", path, got, want)
		}
	}
	ents, _ := os.ReadDir(filepath.Join(dir, "etcd"))
	if len(ents) != 2 {
		t.Errorf("leftover temp files: %v", ents)
	}
}

func TestServiceAccountKey(t *testing.T) {
	kp, err := NewServiceAccountKey()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := WriteKeyPair(dir, ServiceAccount, kp); err != nil {
		t.Fatal(err)
	}
	if mode(t, filepath.Join(dir, "sa.key")) != 0o600 || mode(t, filepath.Join(dir, "sa.pub")) != 0o644 {
		t.Error("sa.key must be 0600 and sa.pub 0644")
	}
	if _, err := os.Stat(filepath.Join(dir, "sa.crt")); err == nil {
		t.Error("sa.crt written; the public key belongs in sa.pub")
	}
	key, err := parseKeyPEM(kp.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	rk, ok := key.(*rsa.PrivateKey)
	if !ok || rk.N.BitLen() != 2048 {
		t.Fatalf("sa.key is %T, want RSA 2048", key)
	}
	out := openssl(t, "pkey", "-pubin", "-in", filepath.Join(dir, "sa.pub"), "-noout", "-text")
	if !strings.Contains(out, "2048 bit") {
		t.Errorf("openssl on sa.pub: %s", out)
	}
	pubFromKey := openssl(t, "pkey", "-in", filepath.Join(dir, "sa.key"), "-pubout")
	if pubFromKey != string(kp.CertPEM) {
		t.Error("sa.pub is not the public half of sa.key")
	}
}

func TestControlPlaneCerts(t *testing.T) {
	dir := newPKIDir(t)
	n := testNode()
	changed, err := ControlPlaneCerts(dir, n, now)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(changed, controlPlaneLeafNames) {
		t.Errorf("first run wrote %v, want all of %v", changed, controlPlaneLeafNames)
	}
	etcdNames := []string{"demo-cp-1", "etcd-a.internal.demo.example.com", "localhost"}
	etcdIPs := []string{"127.0.0.1", "192.168.100.11", "::1"}
	for _, tc := range []struct {
		name, ca string
		cn       string
		org      []string
		dns, ips []string
		eku      []x509.ExtKeyUsage
	}{
		{"apiserver", "ca", "kube-apiserver", nil,
			[]string{"api.internal.demo.example.com", "demo-cp-1", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local", "localhost"},
			[]string{"10.0.2.2", "10.96.0.1", "127.0.0.1", "192.168.100.11"},
			[]x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}},
		{"apiserver-kubelet-client", "ca", "kube-apiserver-kubelet-client", []string{"kubeadm:cluster-admins"}, nil, nil, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}},
		{"front-proxy-client", "front-proxy-ca", "front-proxy-client", nil, nil, nil, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}},
		{"etcd/server", "etcd/ca", "demo-cp-1", nil, etcdNames, etcdIPs, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}},
		{"etcd/peer", "etcd/ca", "demo-cp-1", nil, etcdNames, etcdIPs, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}},
		{"etcd/healthcheck-client", "etcd/ca", "kube-etcd-healthcheck-client", nil, nil, nil, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}},
		{"apiserver-etcd-client", "etcd/ca", "kube-apiserver-etcd-client", nil, nil, nil, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			crt, key := filepath.Join(dir, tc.name+".crt"), filepath.Join(dir, tc.name+".key")
			if mode(t, crt) != 0o644 || mode(t, key) != 0o600 {
				t.Errorf("modes %v %v, want 0644 0600", mode(t, crt), mode(t, key))
			}
			c := readCert(t, crt)
			ca := readCert(t, filepath.Join(dir, tc.ca+".crt"))
			roots := x509.NewCertPool()
			roots.AddCert(ca)
			if _, err := c.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: now, KeyUsages: tc.eku}); err != nil {
				t.Errorf("does not verify under %s for %v: %v", tc.ca, tc.eku, err)
			}
			if c.Subject.CommonName != tc.cn || !slices.Equal(c.Subject.Organization, tc.org) {
				t.Errorf("subject CN=%s O=%v, want CN=%s O=%v", c.Subject.CommonName, c.Subject.Organization, tc.cn, tc.org)
			}
			if got := slices.Sorted(slices.Values(c.DNSNames)); !slices.Equal(got, tc.dns) {
				t.Errorf("DNS SANs %v, want %v", got, tc.dns)
			}
			var ips []string
			for _, ip := range c.IPAddresses {
				ips = append(ips, ip.String())
			}
			if slices.Sort(ips); !slices.Equal(ips, tc.ips) {
				t.Errorf("IP SANs %v, want %v", ips, tc.ips)
			}
			if !slices.Equal(c.ExtKeyUsage, tc.eku) || c.KeyUsage&x509.KeyUsageDigitalSignature == 0 || c.IsCA {
				t.Errorf("usages %v / %v IsCA %t", c.ExtKeyUsage, c.KeyUsage, c.IsCA)
			}
			if got := c.NotAfter.Sub(now); got != leafValidity {
				t.Errorf("validity %s, want 1 year", got)
			}
			out := openssl(t, "verify", "-attime", "1772380800", "-CAfile", filepath.Join(dir, tc.ca+".crt"), crt)
			if !strings.Contains(out, ": OK") {
				t.Errorf("openssl verify: %s", out)
			}
			// The key on disk is the certificate's.
			if openssl(t, "x509", "-in", crt, "-noout", "-pubkey") != openssl(t, "pkey", "-in", key, "-pubout") {
				t.Error("key does not match certificate")
			}
		})
	}
	text := openssl(t, "x509", "-in", filepath.Join(dir, "apiserver.crt"), "-noout", "-text")
	for _, want := range []string{"DNS:kubernetes.default.svc.cluster.local", "IP Address:10.96.0.1", "TLS Web Server Authentication"} {
		if !strings.Contains(text, want) {
			t.Errorf("openssl x509 -text of apiserver.crt lacks %q", want)
		}
	}
}

// idempotentCase is a change to a control plane's certificates and what a second run must redo.
type idempotentCase struct {
	name   string
	change func(n *Node, dir string) time.Time
	want   []string
}

var idempotentCases = []idempotentCase{
	{"nothing changed", func(*Node, string) time.Time { return now.Add(time.Hour) }, nil},
	{"node IP added", func(n *Node, _ string) time.Time {
		n.IPs = append(n.IPs, net.ParseIP("10.0.0.5"))
		return now
	}, []string{"apiserver", "etcd/server", "etcd/peer"}},
	{"API SAN changed", func(n *Node, _ string) time.Time {
		n.APIServerSANs = []string{"api.example.org"}
		return now
	}, []string{"apiserver"}},
	{"SANs reordered", func(n *Node, _ string) time.Time {
		n.APIServerSANs = []string{"10.0.2.2", "API.internal.demo.example.com."}
		return now
	}, nil},
	{"etcd member renamed", func(n *Node, _ string) time.Time {
		n.EtcdSANs = []string{"etcd-b.internal.demo.example.com"}
		return now
	}, []string{"etcd/server", "etcd/peer"}},
	{"service CIDR moved", func(n *Node, _ string) time.Time {
		n.ServiceCIDR = "10.32.0.0/16"
		return now
	}, []string{"apiserver"}},
	{"hostname changed", func(n *Node, _ string) time.Time {
		n.Hostname = "demo-cp-9"
		return now
	}, []string{"apiserver", "etcd/server", "etcd/peer"}},
	{"29 days before expiry", func(*Node, string) time.Time { return now.Add(leafValidity - 29*24*time.Hour) }, controlPlaneLeafNames},
	{"31 days before expiry", func(*Node, string) time.Time { return now.Add(leafValidity - 31*24*time.Hour) }, nil},
	{"front-proxy CA replaced", func(_ *Node, dir string) time.Time {
		kp, _ := NewCA(FrontProxyCACommonName, now)
		WriteKeyPair(dir, FrontProxyCAName, kp)
		return now
	}, []string{"front-proxy-client"}},
	{"key lost", func(_ *Node, dir string) time.Time {
		os.Remove(filepath.Join(dir, "etcd/peer.key"))
		return now
	}, []string{"etcd/peer"}},
	{"key of another cert", func(_ *Node, dir string) time.Time {
		b, _ := os.ReadFile(filepath.Join(dir, "front-proxy-client.key"))
		os.WriteFile(filepath.Join(dir, "apiserver-etcd-client.key"), b, 0o600)
		return now
	}, []string{"apiserver-etcd-client"}},
	{"cert corrupt", func(_ *Node, dir string) time.Time {
		os.WriteFile(filepath.Join(dir, "apiserver.crt"), []byte("junk"), 0o644)
		return now
	}, []string{"apiserver"}},
}

func TestControlPlaneCertsIdempotent(t *testing.T) {
	for _, tc := range idempotentCases {
		t.Run(tc.name, func(t *testing.T) {
			dir := newPKIDir(t)
			n := testNode()
			if _, err := ControlPlaneCerts(dir, n, now); err != nil {
				t.Fatal(err)
			}
			at := tc.change(&n, dir)
			before := testkit.Snapshot(t, dir)
			changed, err := ControlPlaneCerts(dir, n, at)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(changed, tc.want) {
				t.Errorf("re-issued %v, want %v", changed, tc.want)
			}
			after := testkit.Snapshot(t, dir)
			for rel, f := range after {
				name := strings.TrimSuffix(rel, filepath.Ext(rel))
				if f.Mode.IsRegular() && before[rel].Content != f.Content && !slices.Contains(tc.want, name) {
					t.Errorf("%s changed on disk but was not reported", rel)
				}
			}
			// A third run converges.
			if again, err := ControlPlaneCerts(dir, n, at); err != nil || len(again) > 0 {
				t.Errorf("third run wrote %v, %v", again, err)
			}
		})
	}
}

func TestControlPlaneCertsErrors(t *testing.T) {
	dir := newPKIDir(t)
	os.Remove(filepath.Join(dir, "etcd/ca.key"))
	_, err := ControlPlaneCerts(dir, testNode(), now)
	if err == nil || !strings.Contains(err.Error(), filepath.Join(dir, "etcd/ca.key")) {
		t.Errorf("missing etcd CA key: %v", err)
	}
	_, err = ControlPlaneCerts(newPKIDir(t), Node{}, now)
	if err == nil || !strings.Contains(err.Error(), "hostname") {
		t.Errorf("empty hostname: %v", err)
	}
	_, err = ControlPlaneCerts(newPKIDir(t), Node{Hostname: "x", ServiceCIDR: "10.96.0.0"}, now)
	if err == nil || !strings.Contains(err.Error(), "service CIDR") {
		t.Errorf("bad service CIDR: %v", err)
	}
}

func TestDualStackServiceIPs(t *testing.T) {
	dir := newPKIDir(t)
	n := testNode()
	n.ServiceCIDR = "10.96.0.0/12,fd00:10:96::/108"
	if _, err := ControlPlaneCerts(dir, n, now); err != nil {
		t.Fatal(err)
	}
	c := readCert(t, filepath.Join(dir, "apiserver.crt"))
	var ips []string
	for _, ip := range c.IPAddresses {
		ips = append(ips, ip.String())
	}
	for _, want := range []string{"10.96.0.1", "fd00:10:96::1"} {
		if !slices.Contains(ips, want) {
			t.Errorf("apiserver IP SANs %v lack %s", ips, want)
		}
	}
}

func TestToken(t *testing.T) {
	seen := map[string]bool{}
	for range 50 {
		tok, err := NewToken()
		if err != nil {
			t.Fatal(err)
		}
		if !tokenRE.MatchString(tok.String()) {
			t.Fatalf("token %q does not match %s", tok, tokenRE)
		}
		if seen[tok.String()] {
			t.Fatal("duplicate token")
		}
		seen[tok.String()] = true
		back, err := ParseToken(tok.String() + "\n")
		if err != nil || back != tok {
			t.Fatalf("ParseToken(%q) = %v, %v", tok, back, err)
		}
	}
	for _, bad := range []string{"", "abcdef", "abcdef.0123456789abcde", "ABCDEF.0123456789abcdef", "abcde.0123456789abcdefg", "abcdef:0123456789abcdef"} {
		_, err := ParseToken(bad)
		if err == nil {
			t.Errorf("ParseToken(%q) accepted", bad)
			continue
		}
		if len(bad) > 7 && strings.Contains(err.Error(), bad[7:]) {
			t.Errorf("error leaks the secret: %v", err)
		}
	}
}

// A dedicated etcd node holds only the etcd CA: EtcdCerts issues its member certificates
// from it, and nothing that needs another CA; a control plane of the external topology has
// no member certificates, only its API server's etcd client certificate.
func TestEtcdNodeAndExternalControlPlaneCerts(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pki")
	kp, err := NewCA(EtcdCACommonName, now)
	if err != nil {
		t.Fatal(err)
	}
	if err := WriteKeyPair(dir, EtcdCAName, kp); err != nil {
		t.Fatal(err)
	}
	n := testNode()
	n.Hostname = "demo-etcd-1"
	changed, err := EtcdCerts(dir, n, now)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"etcd/server", "etcd/peer", "etcd/healthcheck-client"}; !slices.Equal(changed, want) {
		t.Errorf("etcd node: wrote %v, want %v", changed, want)
	}
	c := readCert(t, filepath.Join(dir, "etcd/server.crt"))
	if !slices.Contains(c.DNSNames, "etcd-a.internal.demo.example.com") || c.Subject.CommonName != "demo-etcd-1" {
		t.Errorf("etcd/server: CN %s DNS %v", c.Subject.CommonName, c.DNSNames)
	}
	if again, err := EtcdCerts(dir, n, now); err != nil || len(again) != 0 {
		t.Errorf("second run wrote %v, %v; want nothing", again, err)
	}

	cp := newPKIDir(t)
	n = testNode()
	n.ExternalEtcd, n.EtcdSANs = true, nil
	changed, err = ControlPlaneCerts(cp, n, now)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"apiserver", "apiserver-kubelet-client", "front-proxy-client", "apiserver-etcd-client"}; !slices.Equal(changed, want) {
		t.Errorf("external-etcd control plane: wrote %v, want %v", changed, want)
	}
	if _, err := os.Stat(filepath.Join(cp, "etcd/server.crt")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("external-etcd control plane has etcd/server.crt: %v", err)
	}
}
