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
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// testPKI is a CA and one certificate it signed for the loopback names, used by every
// member as server, peer and client certificate.
type testPKI struct {
	dir          string
	ca, crt, key string
	client       *tls.Config
}

func newTestPKI(t *testing.T) testPKI {
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
		IPAddresses: []net.IP{net.IPv4(127, 0, 14, 1), net.IPv4(127, 0, 14, 2), net.IPv4(127, 0, 14, 3)},
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

// testCluster is three members a, b, c on 127.0.14.1-3, client port 2379, peer port 2380.
type testCluster struct {
	t       *testing.T
	pki     testPKI
	members []Member
	dirs    map[string]string
	running map[string]*embed.Etcd
}

func newTestCluster(t *testing.T) *testCluster {
	c := &testCluster{t: t, pki: newTestPKI(t), dirs: map[string]string{}, running: map[string]*embed.Etcd{}}
	for i, name := range []string{"a", "b", "c"} {
		c.members = append(c.members, Member{Name: name, PeerURL: fmt.Sprintf("https://127.0.14.%d:2380", i+1)})
		c.dirs[name] = filepath.Join(t.TempDir(), "etcd")
	}
	t.Cleanup(func() {
		for _, e := range c.running {
			e.Close()
		}
	})
	return c
}

func (c *testCluster) member(name string) Member {
	for _, m := range c.members {
		if m.Name == name {
			return m
		}
	}
	c.t.Fatalf("no member %s", name)
	return Member{}
}

// start starts member name with plan's state and cluster; it does not wait for readiness.
func (c *testCluster) start(name string, p Plan) {
	c.t.Helper()
	m := c.member(name)
	cfg := embed.NewConfig()
	cfg.Name = name
	cfg.Dir = c.dirs[name]
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	peer, _ := url.Parse(m.PeerURL)
	client, _ := url.Parse("https://" + net.JoinHostPort(peer.Hostname(), "2379"))
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*peer}, []url.URL{*peer}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*client}, []url.URL{*client}
	cfg.ListenMetricsUrls = nil
	cfg.InitialCluster = ""
	for i, mm := range p.Members {
		if i > 0 {
			cfg.InitialCluster += ","
		}
		cfg.InitialCluster += mm.Name + "=" + mm.PeerURL
	}
	cfg.ClusterState = p.State
	cfg.InitialClusterToken = "kiln-test"
	for _, ti := range []*transport.TLSInfo{&cfg.ClientTLSInfo, &cfg.PeerTLSInfo} {
		ti.CertFile, ti.KeyFile, ti.TrustedCAFile, ti.ClientCertAuth = c.pki.crt, c.pki.key, c.pki.ca, true
	}
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		c.t.Fatalf("start etcd %s: %v", name, err)
	}
	c.running[name] = e
}

func (c *testCluster) waitReady(names ...string) {
	c.t.Helper()
	for _, n := range names {
		select {
		case <-c.running[n].Server.ReadyNotify():
		case err := <-c.running[n].Err():
			c.t.Fatalf("etcd %s: %v", n, err)
		case <-time.After(60 * time.Second):
			c.t.Fatalf("etcd %s not ready after 60s", n)
		}
	}
}

func (c *testCluster) stop(name string) {
	c.running[name].Close()
	delete(c.running, name)
}

func (c *testCluster) opts(name string) Options {
	m := c.member(name)
	return Options{Name: name, PeerURL: m.PeerURL, DataDir: c.dirs[name], Members: c.members, TLS: c.pki.client,
		Timeout: 5 * time.Second}
}

func (c *testCluster) client(name string) *clientv3.Client {
	c.t.Helper()
	ep, _ := ClientURL(c.member(name).PeerURL)
	cl, err := clientv3.New(clientv3.Config{Endpoints: []string{ep}, TLS: c.pki.client, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { cl.Close() })
	return cl
}

// startedNames is the member list's names, sorted; "" for a member not started.
func startedNames(t *testing.T, cl *clientv3.Client) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := cl.MemberList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range r.Members {
		out = append(out, m.Name)
	}
	slices.Sort(out)
	return out
}

// A new cluster: three empty members, none answering the first, all start from the static
// cluster; while the first waits for the others, the probe says so.
func (c *testCluster) bootNew() {
	c.t.Helper()
	ctx := context.Background()
	for i, name := range []string{"a", "b", "c"} {
		p, err := Decide(ctx, c.opts(name))
		if err != nil {
			c.t.Fatal(err)
		}
		// The last may find the first two serving: it then starts as "existing" in the
		// place the static cluster gave it, changing nothing.
		if p.Changed || (i < 2 && p.State != StateNew) {
			c.t.Fatalf("%s: plan %+v, want new (or existing, unchanged)", name, p)
		}
		c.start(name, p)
		if i == 0 {
			r := Probe(ctx, c.members, time.Second)
			if got, want := r.String(), "etcd: waiting for quorum: 1 of 3 members reachable (127.0.14.2, 127.0.14.3 unreachable)"; got != want {
				c.t.Errorf("probe with a alone = %q, want %q", got, want)
			}
		}
	}
	c.waitReady("a", "b", "c")
	if r := Probe(ctx, c.members, time.Second); !r.Quorum() || r.String() != "etcd: 3 of 3 members reachable" {
		c.t.Errorf("probe with all up = %q", r)
	}
}

func TestReplacedMemberRejoins(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a three-member etcd cluster")
	}
	c := newTestCluster(t)
	c.bootNew()
	ctx := context.Background()
	if _, err := c.client("a").Put(ctx, "/kiln/before", "kept"); err != nil {
		t.Fatal(err)
	}

	// A data directory with data is never re-initialised: Rejoin refuses, Decide keeps it.
	if _, err := Rejoin(ctx, c.opts("a")); !errors.Is(err, ErrHasData) {
		t.Errorf("Rejoin on a's data dir: %v, want ErrHasData", err)
	}
	if p, err := Decide(ctx, c.opts("a")); err != nil || p.State != StateNew || p.Changed {
		t.Errorf("Decide on a's data dir = %+v, %v: want new, unchanged", p, err)
	}

	// c is replaced: a new machine, a blank disk.
	c.stop("c")
	if err := os.RemoveAll(c.dirs["c"]); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(c.dirs["c"], "lost+found"), 0o700); err != nil {
		t.Fatal(err)
	}

	// Cut off after the removal and addition: the next run changes nothing and plans the same.
	first, err := Rejoin(ctx, c.opts("c"))
	if err != nil {
		t.Fatal(err)
	}
	if first.State != StateExisting || !first.Changed {
		t.Fatalf("first rejoin = %+v, want existing, changed", first)
	}
	again, err := Decide(ctx, c.opts("c"))
	if err != nil {
		t.Fatal(err)
	}
	if again.State != StateExisting || again.Changed || !slices.Equal(again.Members, first.Members) {
		t.Fatalf("second run = %+v, want %+v unchanged", again, first)
	}
	if !slices.Equal(again.Members, c.members) {
		t.Errorf("initial cluster = %v, want %v", again.Members, c.members)
	}

	c.start("c", again)
	c.waitReady("c")
	if got := startedNames(t, c.client("a")); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Errorf("member list names = %v, want a, b, c all started", got)
	}
	var r *clientv3.GetResponse
	deadline := time.Now().Add(30 * time.Second)
	for {
		r, err = c.client("c").Get(ctx, "/kiln/before")
		if err == nil && len(r.Kvs) == 1 || time.Now().After(deadline) {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	if err != nil || len(r.Kvs) != 1 || string(r.Kvs[0].Value) != "kept" {
		t.Errorf("read from the rejoined c: %v %v, want the value written before", r, err)
	}
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
