package etcdmember

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func parseIPs(ips []string) []net.IP {
	var out []net.IP
	for _, s := range ips {
		out = append(out, net.ParseIP(s))
	}
	return out
}

// testPKI is a CA and one certificate it signed for the loopback names, used by every
// member as server, peer and client certificate.
type testPKI struct {
	dir          string
	ca, crt, key string
	client       *tls.Config
}

func newTestPKI(t *testing.T, ips ...string) testPKI {
	t.Helper()
	dir := t.TempDir()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "etcd-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "member"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), DNSNames: []string{"localhost"},
		IPAddresses: parseIPs(ips),
		KeyUsage:    x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(key)
	p := testPKI{dir: dir, ca: filepath.Join(dir, "ca.crt"), crt: filepath.Join(dir, "member.crt"), key: filepath.Join(dir, "member.key")}
	write := func(path, typ string, b []byte) {
		if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: b}), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(p.ca, "CERTIFICATE", caDER)
	write(p.crt, "CERTIFICATE", der)
	write(p.key, "EC PRIVATE KEY", keyDER)
	pair, err := tls.LoadX509KeyPair(p.crt, p.key)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(caCert)
	p.client = &tls.Config{Certificates: []tls.Certificate{pair}, RootCAs: pool, MinVersion: tls.VersionTLS12}
	return p
}

func TestHasData(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(dir string) error
		want  bool
	}{
		{"missing", func(dir string) error { return os.RemoveAll(dir) }, false},
		{"empty", func(string) error { return nil }, false},
		{"lost+found only", func(dir string) error { return os.Mkdir(filepath.Join(dir, "lost+found"), 0o700) }, false},
		{"member dir", func(dir string) error { return os.Mkdir(filepath.Join(dir, "member"), 0o700) }, true},
		{"member wal", func(dir string) error { return os.MkdirAll(filepath.Join(dir, "member", "wal"), 0o700) }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := tc.setup(dir); err != nil {
				t.Fatal(err)
			}
			got, err := HasData(dir)
			if err != nil || got != tc.want {
				t.Errorf("HasData = %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}

// Three members booting at once, as machines of an autoscaling group do: the seed starts a
// one-member cluster, the others wait for it and join one at a time as learners, each
// promoted once it caught up; every member then serves what any other wrote.
func TestMembersJoinOneAtATime(t *testing.T) {
	c := newTestCluster(t)
	plans := c.bootAll("a", "b", "c")
	if p := plans["a"]; p.State != StateNew || p.Learner || !slices.Equal(p.Members, c.members[:1]) {
		t.Errorf("seed a: plan %+v, want a new one-member cluster", p)
	}
	for _, n := range []string{"b", "c"} {
		if p := plans[n]; p.State != StateExisting || !p.Learner || !p.Changed {
			t.Errorf("%s: plan %+v, want to join as a learner", n, p)
		}
	}
	c.voters("a", "a", "b", "c")
	if err := c.put("b", "/kiln/from-b", "1"); err != nil {
		t.Fatal(err)
	}
	if got := c.get("c", "/kiln/from-b"); got != "1" {
		t.Errorf("c reads %q for a key written through b, want 1", got)
	}
	// Booted at once, b and c waited for the seed.
	for _, n := range []string{"b", "c"} {
		if !slices.ContainsFunc(c.waits[n], func(r string) bool { return strings.Contains(r, "seed member a ("+c.ip(1)+")") }) {
			t.Errorf("%s never waited for the seed; its waits: %q", n, c.waits[n])
		}
	}
}

// A member whose data directory holds data just starts: nothing is asked or changed.
func TestMemberWithDataStarts(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "member", "wal"), 0o700); err != nil {
		t.Fatal(err)
	}
	members := []Member{{"a", "https://127.0.19.1:2380"}, {"b", "https://127.0.19.2:2380"}}
	p, err := Decide(context.Background(), Options{Name: "b", PeerURL: members[1].PeerURL, DataDir: dir, Members: members})
	if err != nil || p.Changed || p.Learner || !slices.Equal(p.Members, members) {
		t.Errorf("Decide = %+v, %v: want the static cluster, unchanged", p, err)
	}
	if _, err := Join(context.Background(), Options{Name: "b", PeerURL: members[1].PeerURL, DataDir: dir, Members: members}); !errors.Is(err, ErrHasData) {
		t.Errorf("Join on a data dir: %v, want ErrHasData", err)
	}
}

// With no member running, a member other than the seed waits for the seed, naming it; the
// seed (etcd.seed may name another than the first) starts the cluster.
func TestNoMemberAnswers(t *testing.T) {
	c := newTestCluster(t)
	ctx := context.Background()
	_, err := Decide(ctx, c.opts("b"))
	var w *WaitError
	if !errors.As(err, &w) || !strings.Contains(w.Reason, "waiting for the seed member a ("+c.ip(1)+") to start the cluster") {
		t.Errorf("b with nobody up: %v, want to wait for the seed a", err)
	}
	o := c.opts("c")
	o.Seed = "c"
	p, err := Decide(ctx, o)
	if err != nil || p.State != StateNew || !slices.Equal(p.Members, c.members[2:]) {
		t.Errorf("c as the seed: %+v, %v: want a new one-member cluster", p, err)
	}
}

// A member that is lost (power cut) leaves two of three: the cluster still writes; started
// again with its data it catches up, nothing asked or changed.
func TestLostMemberComesBack(t *testing.T) {
	c := newTestCluster(t)
	c.bootAll("a", "b", "c")
	c.voters("a", "a", "b", "c")
	c.kill("c")
	if err := c.put("a", "/kiln/while-c-was-down", "written"); err != nil {
		t.Fatalf("write with c down: %v", err)
	}
	plans := c.bootAll("c")
	if p := plans["c"]; p.Changed || p.Learner {
		t.Errorf("c with its data: plan %+v, want to just start", p)
	}
	c.voters("c", "a", "b", "c")
	if got := c.get("c", "/kiln/while-c-was-down"); got != "written" {
		t.Errorf("c reads %q, want what was written while it was down", got)
	}
}

// A member replaced by a new machine with a blank disk removes its stale self, joins as a
// learner under the same name and is promoted; a first boot cut off after the join plans the
// same again without changing anything. The seed replaced does the same: it never starts a
// second cluster beside the running one.
func TestReplacedMemberRejoins(t *testing.T) {
	for _, replaced := range []string{"b", "a"} {
		t.Run(replaced, func(t *testing.T) {
			c := newTestCluster(t)
			c.bootAll("a", "b", "c")
			c.voters("c", "a", "b", "c")
			if err := c.put("c", "/kiln/before", "kept"); err != nil {
				t.Fatal(err)
			}
			// etcd names a new member by its peer URLs and the second it is added: added
			// again within the second of its first addition, the replacement would get the ID
			// just removed, which etcd refuses. A machine is not replaced that fast.
			time.Sleep(time.Second)
			c.kill(replaced)
			c.wipe(replaced)

			ctx := context.Background()
			first, err := Join(ctx, c.opts(replaced))
			if err != nil {
				t.Fatal(err)
			}
			if first.State != StateExisting || !first.Changed || !first.Learner {
				t.Fatalf("first join = %+v, want existing, changed, learner", first)
			}
			again, err := Decide(ctx, c.opts(replaced))
			if err != nil {
				t.Fatal(err)
			}
			if again.State != StateExisting || again.Changed || !again.Learner || !slices.Equal(again.Members, first.Members) {
				t.Fatalf("second run = %+v, want %+v unchanged", again, first)
			}
			if !slices.Equal(again.Members, c.members) {
				t.Errorf("initial cluster = %v, want %v", again.Members, c.members)
			}
			c.start(replaced, again)
			if _, err := Promote(ctx, c.opts(replaced), 200*time.Millisecond); err != nil {
				t.Fatalf("promote: %v\n%s", err, c.output(replaced))
			}
			c.voters("c", "a", "b", "c")
			if got := c.get(replaced, "/kiln/before"); got != "kept" {
				t.Errorf("%s reads %q, want the value written before", replaced, got)
			}
		})
	}
}

// A blank seed whose peers listen but have no quorum waits: starting a new cluster beside
// them would split the cluster in two.
func TestBlankSeedWaitsForQuorum(t *testing.T) {
	c := newTestCluster(t)
	c.bootAll("a", "b", "c")
	c.voters("a", "a", "b", "c")
	c.kill("a")
	c.kill("b")
	c.wipe("a")
	_, err := Decide(context.Background(), c.opts("a"))
	var w *WaitError
	if !errors.As(err, &w) || !strings.Contains(w.Reason, c.ip(3)) || !strings.Contains(w.Reason, "quorum") {
		t.Fatalf("blank seed with only c up: %v, want to wait for the quorum", err)
	}
}

// Every member powered off at once and started again with its data: the cluster comes
// back with what it held.
func TestFullRestart(t *testing.T) {
	c := newTestCluster(t)
	c.bootAll("a", "b", "c")
	c.voters("a", "a", "b", "c")
	if err := c.put("a", "/kiln/before", "kept"); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"a", "b", "c"} {
		c.kill(n)
	}
	plans := c.bootAll("c", "b", "a")
	for n, p := range plans {
		if p.Changed || p.Learner {
			t.Errorf("%s: plan %+v, want to just start", n, p)
		}
	}
	c.voters("b", "a", "b", "c")
	if got := c.get("b", "/kiln/before"); got != "kept" {
		t.Errorf("b reads %q after the restart, want kept", got)
	}
}

// Probe tells the members that listen from those that do not.
func TestProbe(t *testing.T) {
	c := newTestCluster(t)
	ctx := context.Background()
	c.bootAll("a")
	c.voters("a", "a")
	r := Probe(ctx, c.members, time.Second)
	if got, want := r.String(), "etcd: 1 of 3 members reachable ("+c.ip(2)+", "+c.ip(3)+" unreachable)"; got != want {
		t.Errorf("probe with a alone = %q, want %q", got, want)
	}
	c.bootAll("b", "c")
	c.voters("a", "a", "b", "c")
	if r := Probe(ctx, c.members, time.Second); r.String() != "etcd: 3 of 3 members reachable" {
		t.Errorf("probe with all up = %q", r)
	}
}
