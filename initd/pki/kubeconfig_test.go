package pki

import (
	"crypto/x509"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kilnproject/kiln/internal/kubeconfig"
)

func TestKubeconfigMarshalRoundTrip(t *testing.T) {
	caKP, _ := NewCA("kubernetes", now)
	ca, _ := ParseCA(caKP)
	leaf, _ := ca.Issue(Cert{CommonName: "u", Client: true}, now)
	for _, k := range []kubeconfig.Config{
		{Cluster: "kubernetes", Server: "https://10.0.0.1:6443", CAPEM: caKP.CertPEM, User: "u", CertPEM: leaf.CertPEM, KeyPEM: leaf.KeyPEM},
		{Cluster: "demo", Server: "https://127.0.0.1:16443", CAPEM: caKP.CertPEM, User: "kubelet-bootstrap", Token: "abcdef.0123456789abcdef", TLSServerName: "api.internal.demo.example.com"},
	} {
		data, err := k.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"apiVersion: v1\n", "kind: Config\n", "current-context: " + k.User + "@" + k.Cluster, "certificate-authority-data: "} {
			if !strings.Contains(string(data), want) {
				t.Errorf("kubeconfig lacks %q:\n%s", want, data)
			}
		}
		back, err := kubeconfig.Parse(data)
		if err != nil {
			t.Fatal(err)
		}
		if back.Server != k.Server || back.User != k.User || back.Cluster != k.Cluster || back.Token != k.Token ||
			back.TLSServerName != k.TLSServerName || string(back.CAPEM) != string(k.CAPEM) ||
			string(back.CertPEM) != string(k.CertPEM) || string(back.KeyPEM) != string(k.KeyPEM) {
			t.Errorf("round trip: got %+v", back)
		}
	}
	for _, bad := range []kubeconfig.Config{
		{Server: "https://x", CAPEM: caKP.CertPEM, User: "u", Token: "t"},
		{Cluster: "c", CAPEM: caKP.CertPEM, User: "u", Token: "t"},
		{Cluster: "c", Server: "https://x", User: "u", Token: "t"},
		{Cluster: "c", Server: "https://x", CAPEM: caKP.CertPEM, User: "u"},
		{Cluster: "c", Server: "https://x", CAPEM: caKP.CertPEM, User: "u", CertPEM: leaf.CertPEM},
	} {
		if _, err := bad.Marshal(); err == nil {
			t.Errorf("Marshal(%+v) accepted", bad)
		}
	}
}

func TestControlPlaneKubeconfigs(t *testing.T) {
	pkiDir := newPKIDir(t)
	kubeDir := filepath.Dir(pkiDir)
	n := testNode()
	server := "https://192.168.100.11:6443"
	changed, err := ControlPlaneKubeconfigs(kubeDir, pkiDir, n, server, now)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(changed, controlPlaneKubeconfigNames) {
		t.Errorf("wrote %v", changed)
	}
	ca, _ := LoadCA(pkiDir, "ca")
	for _, tc := range []struct {
		file, cn string
		org      []string
	}{
		{"admin.conf", "kubernetes-admin", []string{"kubeadm:cluster-admins"}},
		{"super-admin.conf", "kubernetes-super-admin", []string{"system:masters"}},
		{"kubelet.conf", "system:node:demo-cp-1", []string{"system:nodes"}},
		{"controller-manager.conf", "system:kube-controller-manager", nil},
		{"scheduler.conf", "system:kube-scheduler", nil},
	} {
		t.Run(tc.file, func(t *testing.T) {
			path := filepath.Join(kubeDir, tc.file)
			if m := mode(t, path); m != 0o600 {
				t.Errorf("mode %v, want 0600", m)
			}
			data, _ := os.ReadFile(path)
			k, err := kubeconfig.Parse(data)
			if err != nil {
				t.Fatal(err)
			}
			if k.Server != server || k.Cluster != "kubernetes" || k.User != tc.cn || k.Context() != tc.cn+"@kubernetes" {
				t.Errorf("server %s cluster %s user %s", k.Server, k.Cluster, k.User)
			}
			c, err := ParseCertPEM(k.CertPEM)
			if err != nil {
				t.Fatal(err)
			}
			roots := x509.NewCertPool()
			roots.AddCert(ca.Cert)
			if _, err := c.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
				t.Errorf("client cert does not verify: %v", err)
			}
			if c.Subject.CommonName != tc.cn || !slices.Equal(c.Subject.Organization, tc.org) {
				t.Errorf("CN=%s O=%v", c.Subject.CommonName, c.Subject.Organization)
			}
			// openssl reads the embedded certificate and key.
			crt, key := filepath.Join(t.TempDir(), "c.crt"), filepath.Join(t.TempDir(), "c.key")
			os.WriteFile(crt, k.CertPEM, 0o600)
			os.WriteFile(key, k.KeyPEM, 0o600)
			if out := openssl(t, "verify", "-attime", "1772380800", "-CAfile", filepath.Join(pkiDir, "ca.crt"), crt); !strings.Contains(out, "OK") {
				t.Error(out)
			}
			if openssl(t, "x509", "-in", crt, "-noout", "-pubkey") != openssl(t, "pkey", "-in", key, "-pubout") {
				t.Error("embedded key does not match the certificate")
			}
		})
	}

	// Idempotent; a new server or hostname rewrites what depends on it.
	if changed, _ := ControlPlaneKubeconfigs(kubeDir, pkiDir, n, server, now.Add(time.Hour)); len(changed) != 0 {
		t.Errorf("second run wrote %v", changed)
	}
	n.Hostname = "demo-cp-2"
	if changed, _ := ControlPlaneKubeconfigs(kubeDir, pkiDir, n, server, now); !slices.Equal(changed, []string{"kubelet.conf"}) {
		t.Errorf("hostname change wrote %v, want kubelet.conf", changed)
	}
	if changed, _ := ControlPlaneKubeconfigs(kubeDir, pkiDir, n, "https://10.1.1.1:6443", now); len(changed) != 5 {
		t.Errorf("server change wrote %v, want all five", changed)
	}
	kp, _ := NewCA("kubernetes", now)
	WriteKeyPair(pkiDir, "ca", kp)
	if changed, _ := ControlPlaneKubeconfigs(kubeDir, pkiDir, n, "https://10.1.1.1:6443", now); len(changed) != 5 {
		t.Errorf("CA change wrote %v, want all five", changed)
	}
}

func TestServerURL(t *testing.T) {
	for in, want := range map[string]string{
		"api.internal.demo.example.com:6443": "https://api.internal.demo.example.com:6443",
		"https://10.0.0.1:443":               "https://10.0.0.1:443",
		"10.0.0.1":                           "https://10.0.0.1:6443",
		"fd00::1":                            "https://[fd00::1]:6443",
		"[fd00::1]:7443":                     "https://[fd00::1]:7443",
	} {
		if got := ServerURL(in); got != want {
			t.Errorf("ServerURL(%q) = %q, want %q", in, got, want)
		}
	}
}
