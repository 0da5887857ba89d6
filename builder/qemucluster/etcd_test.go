package qemucluster

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kilnproject/kiln/builder/cluster"
	"github.com/kilnproject/kiln/initd/pki"
	"github.com/kilnproject/kiln/internal/testkit"
)

// The host asks a member for its status and its trouble counters with the state
// directory's client certificate, issued from cluster init's etcd CA: against a real etcd of
// the pinned version, serving TLS with a certificate of the same CA.
func TestMemberStatusAndMetrics(t *testing.T) {
	bin := testkit.Component(t, "etcd", "etcd")
	s := &State{Name: "demo", Dir: t.TempDir()}
	pkiDir := filepath.Join(s.initDir(), cluster.PKIDir)
	kp, err := pki.NewCA(pki.EtcdCACommonName, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := pki.WriteKeyPair(pkiDir, pki.EtcdCAName, kp); err != nil {
		t.Fatal(err)
	}
	if err := s.writeEtcdClient(time.Now()); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(s.file(etcdClientName + ".key")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("client key: %v, %v; want 0600", fi, err)
	}
	ca, err := pki.LoadCA(pkiDir, pki.EtcdCAName)
	if err != nil {
		t.Fatal(err)
	}
	server, err := ca.Issue(pki.Cert{CommonName: "member", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, Server: true, Client: true}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := pki.WriteKeyPair(s.Dir, "server", server); err != nil {
		t.Fatal(err)
	}
	port, peer := testkit.FreePort(t), testkit.FreePort(t)
	client := "https://127.0.0.1:" + strconv.Itoa(port)
	peerURL := "https://127.0.0.1:" + strconv.Itoa(peer)
	cmd := exec.Command(bin, "--name=a", "--data-dir="+filepath.Join(s.Dir, "data"), "--log-level=warn",
		"--listen-client-urls="+client, "--advertise-client-urls="+client,
		"--listen-peer-urls="+peerURL, "--initial-advertise-peer-urls="+peerURL, "--initial-cluster=a="+peerURL,
		"--cert-file="+s.file("server.crt"), "--key-file="+s.file("server.key"), "--client-cert-auth",
		"--trusted-ca-file="+filepath.Join(pkiDir, pki.EtcdCAName+".crt"),
		"--peer-cert-file="+s.file("server.crt"), "--peer-key-file="+s.file("server.key"), "--peer-client-cert-auth",
		"--peer-trusted-ca-file="+filepath.Join(pkiDir, pki.EtcdCAName+".crt"))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })

	tc, err := s.EtcdTLS()
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		self, leader, slow, err := memberStatus(ctx, client, tc)
		cancel()
		if err == nil {
			if self.learner || leader != self.id || self.id == 0 {
				t.Errorf("status: self %+v, leader %x; want the leader of its one-member cluster", self, leader)
			}
			if slow.LeaderChanges < 1 {
				t.Errorf("metrics: %+v; a new cluster has seen one leader change", slow)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("member status: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	ca2, cert, key := s.EtcdClientFiles()
	for _, f := range []string{ca2, cert, key} {
		if _, err := os.Stat(f); err != nil || !strings.HasPrefix(f, s.Dir) {
			t.Errorf("etcdctl file %s: %v", f, err)
		}
	}
}
