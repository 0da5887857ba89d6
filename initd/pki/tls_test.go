package pki

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kilnproject/kiln/internal/kubeconfig"
)

// The written certificates work for real TLS: the API server's serves, admin.conf's
// client certificate is accepted, and the client trusts the server through the
// kubeconfig's CA, by the name and by the IP.
func TestTLSHandshake(t *testing.T) {
	pkiDir := newPKIDir(t)
	kubeDir := filepath.Dir(pkiDir)
	n := testNode()
	n.IPs = append(n.IPs, net.ParseIP("127.0.0.1"))
	realNow := time.Now()
	if _, err := ControlPlaneCerts(pkiDir, n, realNow); err != nil {
		t.Fatal(err)
	}
	if _, err := ControlPlaneKubeconfigs(kubeDir, pkiDir, n, "https://127.0.0.1:6443", realNow); err != nil {
		t.Fatal(err)
	}
	serverCert, err := tls.LoadX509KeyPair(filepath.Join(pkiDir, "apiserver.crt"), filepath.Join(pkiDir, "apiserver.key"))
	if err != nil {
		t.Fatal(err)
	}
	caPEM, _ := os.ReadFile(filepath.Join(pkiDir, "ca.crt"))
	clientCAs := x509.NewCertPool()
	clientCAs.AppendCertsFromPEM(caPEM)

	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c := r.TLS.PeerCertificates[0]
		io.WriteString(w, c.Subject.CommonName+" "+c.Subject.Organization[0])
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{serverCert}, ClientCAs: clientCAs, ClientAuth: tls.RequireAndVerifyClientCert}
	srv.StartTLS()
	defer srv.Close()
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())

	data, _ := os.ReadFile(filepath.Join(kubeDir, "admin.conf"))
	kc, err := kubeconfig.Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	clientCert, err := tls.X509KeyPair(kc.CertPEM, kc.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(kc.CAPEM)
	for _, serverName := range []string{"", "kubernetes.default.svc", "api.internal.demo.example.com"} {
		client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{
			RootCAs: roots, Certificates: []tls.Certificate{clientCert}, ServerName: serverName}}}
		resp, err := client.Get("https://127.0.0.1:" + port)
		if err != nil {
			t.Fatalf("server name %q: %v", serverName, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(body) != "kubernetes-admin kubeadm:cluster-admins" {
			t.Errorf("server saw client %q", body)
		}
	}
}
