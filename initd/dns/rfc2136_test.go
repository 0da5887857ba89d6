package dns

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	mdns "github.com/miekg/dns"

	"github.com/kilnproject/kiln/internal/testkit"
)

const (
	namedPath = "/usr/sbin/named"
	testZone  = "example.test"
	testKey   = "kiln-update"
	// openZone takes unsigned updates from 127.0.0.1.
	openZone = "open.test"
)

// bind is a real BIND serving the dynamic zone example.test on 127.0.0.1 and a free
// port, updatable with the TSIG key testKey, and the zone open.test, updatable
// without a key from 127.0.0.1.
type bind struct {
	dir, conf string
	port      int
	secret    string
	cmd       *exec.Cmd
	exited    chan struct{} // closed when named has exited
	log       *syncBuffer
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// newBind writes BIND's configuration; start runs it.
func newBind(t *testing.T) *bind {
	t.Helper()
	if _, err := os.Stat(namedPath); err != nil {
		t.Skipf("%s missing (Debian packages bind9 and bind9-dnsutils): %v", namedPath, err)
	}
	if _, err := exec.LookPath("dig"); err != nil {
		t.Skip("dig missing (Debian package bind9-dnsutils)")
	}
	dir := t.TempDir()
	key := make([]byte, 32)
	rand.Read(key)
	b := &bind{dir: dir, conf: filepath.Join(dir, "named.conf"), port: testkit.FreeTCPUDPPort(t), secret: base64.StdEncoding.EncodeToString(key), log: &syncBuffer{}}
	conf := fmt.Sprintf(`controls { };
options {
	directory %[1]q;
	listen-on port %[2]d { 127.0.0.1; };
	listen-on-v6 { none; };
	pid-file %[3]q;
	session-keyfile %[4]q;
	recursion no;
	dnssec-validation no;
};
key %[5]q {
	algorithm hmac-sha256;
	secret %[6]q;
};
zone %[7]q {
	type primary;
	file %[8]q;
	allow-update { key %[5]q; };
};
zone %[9]q {
	type primary;
	file %[10]q;
	allow-update { 127.0.0.1; };
};
`, dir, b.port, filepath.Join(dir, "named.pid"), filepath.Join(dir, "session.key"), testKey, b.secret, testZone, filepath.Join(dir, testZone+".zone"),
		openZone, filepath.Join(dir, openZone+".zone"))
	zone := `$TTL 300
@	IN SOA ns.example.test. admin.example.test. 1 3600 600 86400 60
@	IN NS ns.example.test.
ns	IN A 127.0.0.1
other	IN A 192.0.2.99
`
	for name, data := range map[string]string{b.conf: conf, filepath.Join(dir, testZone+".zone"): zone, filepath.Join(dir, openZone+".zone"): zone} {
		if err := os.WriteFile(name, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		b.stop()
		if t.Failed() {
			t.Logf("named output:\n%s", b.log)
		}
	})
	return b
}

func (b *bind) server() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(b.port)) }

// start runs named in the foreground and waits until it answers for the zone.
func (b *bind) start(t *testing.T) {
	t.Helper()
	args := []string{"-g", "-c", b.conf}
	if os.Geteuid() == 0 {
		args = append(args, "-u", "root")
	}
	b.cmd = exec.Command(namedPath, args...)
	b.cmd.Stdout, b.cmd.Stderr = b.log, b.log
	if err := b.cmd.Start(); err != nil {
		t.Fatalf("start named: %v", err)
	}
	exited := make(chan struct{})
	b.exited = exited
	go func() { b.cmd.Wait(); close(exited) }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		m := new(mdns.Msg)
		m.SetQuestion(testZone+".", mdns.TypeSOA)
		c := &mdns.Client{Net: "tcp", Timeout: 300 * time.Millisecond}
		if in, _, err := c.Exchange(m, b.server()); err == nil && in.Rcode == mdns.RcodeSuccess && len(in.Answer) > 0 {
			return
		}
		select {
		case <-exited:
			t.Fatalf("named exited:\n%s", b.log)
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("named does not answer on %s:\n%s", b.server(), b.log)
		}
	}
}

func (b *bind) stop() {
	if b.exited == nil {
		return
	}
	b.cmd.Process.Signal(os.Interrupt)
	select {
	case <-b.exited:
	case <-time.After(10 * time.Second):
		b.cmd.Process.Kill()
		<-b.exited
	}
}

// dig asks the server with dig, as an operator would, and returns the sorted answers.
func (b *bind) dig(t *testing.T, name, typ string) []string {
	t.Helper()
	out, err := exec.Command("dig", "@127.0.0.1", "-p", strconv.Itoa(b.port), name, typ, "+short", "+tcp").Output()
	if err != nil {
		t.Fatalf("dig %s %s: %v", name, typ, err)
	}
	lines := strings.Fields(string(out))
	slices.Sort(lines)
	return lines
}

func (b *bind) provider() *RFC2136 {
	return &RFC2136{Server: b.server(), Zone: testZone, KeyName: testKey, Secret: b.secret}
}

func addrs(s ...string) []netip.Addr {
	var out []netip.Addr
	for _, a := range s {
		out = append(out, netip.MustParseAddr(a))
	}
	return out
}

// bindStep is one Upsert against BIND and what dig answers afterwards.
type bindStep struct {
	name string
	recs []Record
	want map[string][]string // "name type" → dig answers
}

var bindSteps = []bindStep{
	{"create", []Record{
		{Name: testEtcd, Type: TypeA, Addrs: addrs("10.0.0.5"), TTL: 60},
		{Name: testEtcd, Type: TypeAAAA, Addrs: addrs("fd00::5"), TTL: 60},
		{Name: testAPI + ".", Type: TypeA, Addrs: addrs("10.0.0.5"), TTL: 60, Shared: true},
	}, map[string][]string{testEtcd + " A": {"10.0.0.5"}, testEtcd + " AAAA": {"fd00::5"}, testAPI + " A": {"10.0.0.5"}}},
	{"new IP replaces the old", []Record{
		{Name: testEtcd, Type: TypeA, Addrs: addrs("10.0.0.6"), TTL: 60},
	}, map[string][]string{testEtcd + " A": {"10.0.0.6"}, testEtcd + " AAAA": {"fd00::5"}}},
	{"another control-plane node joins the shared api name", []Record{
		{Name: testAPI, Type: TypeA, Addrs: addrs("10.0.0.7"), TTL: 60, Shared: true},
	}, map[string][]string{testAPI + " A": {"10.0.0.5", "10.0.0.7"}}},
	{"a control-plane node's address changes", WithStale(
		[]Record{{Name: testAPI, Type: TypeA, Addrs: addrs("10.0.0.6"), TTL: 60, Shared: true}},
		[]Record{{Name: testAPI, Type: TypeA, Addrs: addrs("10.0.0.5"), TTL: 60, Shared: true}},
	), map[string][]string{testAPI + " A": {"10.0.0.6", "10.0.0.7"}}},
}

func TestRFC2136WithBIND(t *testing.T) {
	b := newBind(t)
	b.start(t)
	ctx := context.Background()
	p := b.provider()
	const etcd = testEtcd

	for _, s := range bindSteps {
		if err := p.Upsert(ctx, s.recs); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		for q, want := range s.want {
			name, typ, _ := strings.Cut(q, " ")
			if got := b.dig(t, name, typ); !slices.Equal(got, want) {
				t.Errorf("%s: dig %s = %v, want %v", s.name, q, got, want)
			}
		}
	}
	if got := b.dig(t, "other.example.test", "A"); !slices.Equal(got, []string{"192.0.2.99"}) {
		t.Errorf("an unrelated record changed: %v", got)
	}

	got, err := p.Lookup(ctx, etcd)
	if err != nil || !sameAddrs(got, addrs("10.0.0.6", "fd00::5")) {
		t.Errorf("Lookup(%s) = %v, %v; want 10.0.0.6 fd00::5", etcd, got, err)
	}
	if got, err := p.Lookup(ctx, "missing.example.test"); err != nil || len(got) != 0 {
		t.Errorf("Lookup(missing) = %v, %v; want nothing", got, err)
	}

	t.Run("refused", func(t *testing.T) { testRefusedUpdates(t, ctx, b) })

	t.Run("record outside the zone", func(t *testing.T) {
		err := p.Upsert(ctx, []Record{{Name: "api.example.org", Type: TypeA, Addrs: addrs("10.0.0.1"), TTL: 60}})
		if err == nil || !strings.Contains(err.Error(), "not inside zone example.test") || !errors.Is(err, errConfig) {
			t.Errorf("err = %v", err)
		}
	})
}

// testRefusedUpdates checks BIND refuses updates with a wrong secret, an unknown key or no
// signature, each error names the rcode and the server, and the zone keeps its record.
func testRefusedUpdates(t *testing.T, ctx context.Context, b *bind) {
	const etcd = testEtcd
	other := make([]byte, 32)
	rand.Read(other)
	cases := []struct {
		name      string
		p         *RFC2136
		rcode     int
		tsig      int
		errSubstr string
	}{
		{"wrong secret", &RFC2136{Server: b.server(), Zone: testZone, KeyName: testKey, Secret: base64.StdEncoding.EncodeToString(other)}, mdns.RcodeNotAuth, mdns.RcodeBadSig, "NOTAUTH (TSIG BADSIG"},
		{"unknown key", &RFC2136{Server: b.server(), Zone: testZone, KeyName: "someone-else", Secret: b.secret}, mdns.RcodeNotAuth, mdns.RcodeBadKey, "NOTAUTH (TSIG BADKEY"},
		{"unsigned", &RFC2136{Server: b.server(), Zone: testZone}, mdns.RcodeRefused, 0, "REFUSED"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.p.Upsert(ctx, []Record{{Name: etcd, Type: TypeA, Addrs: addrs("192.0.2.66"), TTL: 60}})
			var rc *RcodeError
			if !errors.As(err, &rc) || rc.Rcode != c.rcode || rc.TSIGError != c.tsig {
				t.Fatalf("err = %v, want rcode %s tsig %d", err, rcodeName(c.rcode), c.tsig)
			}
			t.Log(err)
			if !strings.Contains(err.Error(), c.errSubstr) || !strings.Contains(err.Error(), b.server()) {
				t.Errorf("err = %q, want it to name %q and the server", err, c.errSubstr)
			}
			if got := b.dig(t, etcd, "A"); !slices.Equal(got, []string{"10.0.0.6"}) {
				t.Errorf("zone changed: dig %s A = %v", etcd, got)
			}
		})
	}
}

// TestRegisterWaitsForBIND: the server is down when registration starts; Register
// reports pending with the error, backs off, and registers once named comes up.
func TestRegisterWaitsForBIND(t *testing.T) {
	b := newBind(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	recs := []Record{{Name: "etcd-b.internal.prod.example.test", Type: TypeA, Addrs: addrs("10.1.0.2"), TTL: 30}}

	var mu sync.Mutex
	var states []State
	var times []time.Time
	pendingErrs := make(chan struct{}, 100)
	var waits []time.Duration // the backoffs Register chose, as it logs them
	res := Start(ctx, b.provider(), recs, Options{
		MinBackoff: 50 * time.Millisecond, MaxBackoff: 400 * time.Millisecond,
		Log: slog.New(retryHandler{&mu, &waits}),
		OnState: func(s State) {
			mu.Lock()
			states = append(states, s)
			times = append(times, time.Now())
			mu.Unlock()
			if s.State == StatePending && s.LastError != "" {
				pendingErrs <- struct{}{}
			}
		},
	})
	for range 5 {
		select {
		case <-pendingErrs:
		case r := <-res:
			t.Fatalf("Register returned while the server is down: %+v", r)
		case <-ctx.Done():
			t.Fatal("no pending state")
		}
	}
	b.start(t)
	var r result
	select {
	case r = <-res:
	case <-ctx.Done():
		t.Fatal("not registered after the server came up")
	}
	if r.Err != nil || r.State.State != StateRegistered || r.State.String() != "registered" {
		t.Fatalf("result = %+v", r)
	}
	if got := b.dig(t, "etcd-b.internal.prod.example.test", "A"); !slices.Equal(got, []string{"10.1.0.2"}) {
		t.Errorf("dig = %v", got)
	}

	mu.Lock()
	defer mu.Unlock()
	checkPendingThenBackoffs(t, b, states, times, waits)

	// A second run finds the record in place and changes nothing.
	st, err := Register(ctx, b.provider(), recs, Options{})
	if err != nil || st.Attempts != 1 || st.State != StateRegistered {
		t.Errorf("second Register = %+v, %v", st, err)
	}
}

// checkPendingThenBackoffs checks Register first reported pending without an error, then the
// update error, and waited between attempts as its backoff says.
func checkPendingThenBackoffs(t *testing.T, b *bind, states []State, times []time.Time, waits []time.Duration) {
	t.Helper()
	if states[0].State != StatePending || states[0].LastError != "" {
		t.Errorf("first state = %v, want pending", states[0])
	}
	p := states[1]
	if !strings.HasPrefix(p.String(), "pending: update zone example.test at "+b.server()) || !strings.Contains(p.String(), "connection refused") {
		t.Errorf("pending state = %q, want the update error", p.String())
	}
	// Waits double, each jittered to between half and all of it, up to the maximum; the
	// attempts really are that far apart (or more: the machine's speed only adds).
	if len(waits) < 5 {
		t.Fatalf("%d waits logged, want at least 5", len(waits))
	}
	limit := 50 * time.Millisecond
	for i, w := range waits {
		if i > 0 {
			limit = min(2*limit, 400*time.Millisecond)
		}
		if w < limit/2-time.Millisecond || w > limit+time.Millisecond {
			t.Errorf("wait %d = %v, want %v..%v", i, w, limit/2, limit)
		}
		// times[i+1] is reported after attempt i+1 failed, times[i+2] after the next.
		if i+2 < len(times) && times[i+2].Sub(times[i+1]) < w-time.Millisecond {
			t.Errorf("attempt %d came %v after the one before, before its wait of %v", i+2, times[i+2].Sub(times[i+1]), w)
		}
	}
}

// retryHandler is a slog handler that keeps the retry_in of Register's "registration pending"
// records.
type retryHandler struct {
	mu    *sync.Mutex
	waits *[]time.Duration
}

func (h retryHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h retryHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h retryHandler) WithGroup(string) slog.Handler            { return h }
func (h retryHandler) Handle(_ context.Context, r slog.Record) error {
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "retry_in" {
			h.mu.Lock()
			*h.waits = append(*h.waits, a.Value.Duration())
			h.mu.Unlock()
		}
		return true
	})
	return nil
}

func TestLoadTSIGSecret(t *testing.T) {
	dir := t.TempDir()
	cases := []struct {
		name, data, secret, alg, err string
	}{
		{"bare", "c2VjcmV0c2VjcmV0c2VjcmV0\n", "c2VjcmV0c2VjcmV0c2VjcmV0", "", ""},
		{"key clause", "key \"kiln\" {\n\talgorithm hmac-sha512;\n\tsecret \"c2VjcmV0\";\n};\n", "c2VjcmV0", "hmac-sha512", ""},
		{"garbage", "not a key\n", "", "", "neither a base64 secret"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(dir, c.name)
			os.WriteFile(path, []byte(c.data), 0o600)
			secret, alg, err := loadTSIGSecret(path)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) || !strings.Contains(err.Error(), path) {
					t.Fatalf("err = %v, want %q naming the file", err, c.err)
				}
				return
			}
			if err != nil || secret != c.secret || alg != c.alg {
				t.Errorf("= %q, %q, %v; want %q, %q", secret, alg, err, c.secret, c.alg)
			}
		})
	}
	if _, err := exec.LookPath("tsig-keygen"); err == nil {
		out, err := exec.Command("tsig-keygen", "-a", "hmac-sha256", "kiln").Output()
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, "tsig-keygen")
		os.WriteFile(path, out, 0o600)
		if secret, alg, err := loadTSIGSecret(path); err != nil || alg != "hmac-sha256" || len(secret) != 44 {
			t.Errorf("tsig-keygen output: %q, %q, %v", secret, alg, err)
		}
	}
}

// forger is a DNS server on UDP and TCP that is not the zone's primary: it answers
// every update NOERROR and every A query with forgedAddr, signed as sign says.
type forger struct {
	addr string
}

const forgedAddr = "192.0.2.66"

// forgerSign says how a forger signs its replies: not at all, or with keyName and
// secret (the real name and secret make it the control case, a server that does know the
// key).
type forgerSign struct {
	keyName, secret string
}

func newForger(t *testing.T, sign forgerSign) *forger {
	t.Helper()
	port := testkit.FreeTCPUDPPort(t)
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	handler := mdns.HandlerFunc(func(w mdns.ResponseWriter, r *mdns.Msg) {
		m := new(mdns.Msg)
		m.SetReply(r)
		m.Authoritative = true
		if r.Opcode == mdns.OpcodeQuery && len(r.Question) == 1 && r.Question[0].Qtype == mdns.TypeA {
			m.Answer = append(m.Answer, &mdns.A{
				Hdr: mdns.RR_Header{Name: r.Question[0].Name, Rrtype: mdns.TypeA, Class: mdns.ClassINET, Ttl: 60},
				A:   net.ParseIP(forgedAddr),
			})
		}
		if sign.keyName != "" {
			alg := mdns.HmacSHA256
			if sig := r.IsTsig(); sig != nil {
				alg = sig.Algorithm
			}
			m.SetTsig(FQDN(sign.keyName), alg, 300, time.Now().Unix())
		}
		w.WriteMsg(m)
	})
	var secrets map[string]string
	if sign.keyName != "" {
		secrets = map[string]string{FQDN(sign.keyName): sign.secret}
	}
	for _, network := range []string{"tcp", "udp"} {
		started := make(chan struct{})
		srv := &mdns.Server{Addr: addr, Net: network, Handler: handler, TsigSecret: secrets, NotifyStartedFunc: func() { close(started) },
			MsgAcceptFunc: func(mdns.Header) mdns.MsgAcceptAction { return mdns.MsgAccept }} // updates too
		failed := make(chan error, 1)
		go func() { failed <- srv.ListenAndServe() }()
		select {
		case <-started:
		case err := <-failed:
			t.Fatalf("forger on %s %s: %v", network, addr, err)
		}
		t.Cleanup(func() { srv.Shutdown() })
	}
	return &forger{addr: addr}
}

// TestRFC2136RefusesForgedReplies: with a TSIG key configured, a server that answers
// without signing, or signs with a key or secret other than the node's, is not
// believed: its NOERROR to an update is an error saying the reply is not signed, its
// answer to a lookup is an error too, and Register does not report the records as
// registered. A server that does sign with the key (the control case) is believed.
func TestRFC2136RefusesForgedReplies(t *testing.T) {
	secret := func() string {
		k := make([]byte, 32)
		rand.Read(k)
		return base64.StdEncoding.EncodeToString(k)
	}
	nodeSecret := secret()
	const name = "etcd-a.internal.prod.example.test"
	cases := []struct {
		name string
		sign forgerSign
		why  string // in the error; "" means the replies are trusted
	}{
		{"unsigned", forgerSign{}, "it carries no TSIG signature"},
		{"signed with another secret", forgerSign{testKey, secret()}, "does not verify with the key's secret"},
		{"signed with another key", forgerSign{"intruder", secret()}, "signed with another key name"},
		{"signed with the key", forgerSign{testKey, nodeSecret}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newForger(t, c.sign)
			p := &RFC2136{Server: f.addr, Zone: testZone, KeyName: testKey, Secret: nodeSecret, Timeout: 30 * time.Second}
			ctx := context.Background()
			recs := []Record{{Name: name, Type: TypeA, Addrs: addrs(forgedAddr), TTL: 60}}
			checkErr := func(what string, err error) {
				t.Helper()
				if c.why == "" {
					if err != nil {
						t.Errorf("%s: %v", what, err)
					}
					return
				}
				if !errors.Is(err, errReplyNotSigned) || !strings.Contains(err.Error(), c.why) ||
					!strings.Contains(err.Error(), "not signed with the TSIG key "+testKey) || !strings.Contains(err.Error(), f.addr) {
					t.Errorf("%s: err = %v, want it to say the reply from %s is not signed with the TSIG key %s (%s)", what, err, f.addr, testKey, c.why)
				}
			}
			checkErr("update", p.Upsert(ctx, recs))
			got, err := p.Lookup(ctx, name)
			checkErr("lookup", err)
			if c.why != "" && len(got) > 0 {
				t.Errorf("lookup believed the forged answer %v", got)
			}

			// Register believes the forged answer to its lookup only when signed with the
			// key; otherwise it stays pending until cut short.
			rctx, cancel := context.WithCancel(ctx)
			defer cancel()
			st, err := Register(rctx, p, recs, Options{MinBackoff: time.Millisecond, MaxBackoff: time.Millisecond, OnState: func(s State) {
				if s.LastError != "" {
					cancel()
				}
			}})
			if c.why == "" {
				if err != nil || st.State != StateRegistered {
					t.Errorf("Register = %v, %v; want registered", st, err)
				}
				return
			}
			if st.State == StateRegistered || !errors.Is(err, errReplyNotSigned) {
				t.Errorf("Register = %v, %v; want pending with the unsigned reply's error", st, err)
			}
		})
	}
}

// TestRFC2136WithoutTSIGWarns: a registration without a TSIG key works where the server
// allows it, and logs a warning every time; one with a key logs none.
func TestRFC2136WithoutTSIGWarns(t *testing.T) {
	b := newBind(t)
	b.start(t)
	ctx := context.Background()
	cases := []struct {
		name     string
		p        *RFC2136
		zone     string
		warnings int
	}{
		{"unsigned", &RFC2136{Server: b.server(), Zone: openZone}, openZone, 1},
		{"TSIG", b.provider(), testZone, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rec := "etcd-c.internal.prod." + c.zone
			for run, addr := range []string{"10.2.0.3", "10.2.0.4"} {
				var logs bytes.Buffer
				log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
				st, err := Register(ctx, c.p, []Record{{Name: rec, Type: TypeA, Addrs: addrs(addr), TTL: 30}}, Options{Log: log})
				if err != nil || st.State != StateRegistered {
					t.Fatalf("Register %d = %v, %v", run+1, st, err)
				}
				if got := b.dig(t, rec, "A"); !slices.Equal(got, []string{addr}) {
					t.Errorf("dig %s = %v, want %s", rec, got, addr)
				}
				warns := strings.Count(logs.String(), "level=WARN")
				if warns != c.warnings || (c.warnings > 0 && !strings.Contains(logs.String(), "not TSIG-signed")) {
					t.Errorf("Register %d logged %d warnings, want %d about TSIG:\n%s", run+1, warns, c.warnings, logs.String())
				}
			}
		})
	}
}
