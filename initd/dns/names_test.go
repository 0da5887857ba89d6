package dns

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kilnproject/kiln/initd/config"
)

func node(t *testing.T, yaml string) *config.Node {
	t.Helper()
	n, err := config.ParseNode([]byte(yaml), "node.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestNames(t *testing.T) {
	cp := "cluster: {name: prod, dnsZone: k8s.example.com}\nrole: control-plane\netcd: {member: b, members: [a, b, c]}\n"
	cases := []struct {
		name  string
		yaml  string
		addrs []netip.Addr
		want  []string
		err   string
	}{
		{"control-plane", cp, addrs("10.0.0.5"), []string{
			"api.internal.prod.k8s.example.com A 10.0.0.5 (ttl 60) shared",
			"etcd-b.internal.prod.k8s.example.com A 10.0.0.5 (ttl 60)",
		}, ""},
		{"dual stack, ttl", cp + "dns: {provider: hosts, ttl: 300}\n", []netip.Addr{netip.MustParseAddr("10.0.0.5"), netip.MustParseAddr("fd00::5"), {}}, []string{
			"api.internal.prod.k8s.example.com A 10.0.0.5 (ttl 300) shared",
			"api.internal.prod.k8s.example.com AAAA fd00::5 (ttl 300) shared",
			"etcd-b.internal.prod.k8s.example.com A 10.0.0.5 (ttl 300)",
			"etcd-b.internal.prod.k8s.example.com AAAA fd00::5 (ttl 300)",
		}, ""},
		{"etcd only", "cluster: {name: prod, dnsZone: k8s.example.com}\nrole: etcd\netcd: {member: a, members: [a]}\n", addrs("10.0.0.9"), []string{
			"etcd-a.internal.prod.k8s.example.com A 10.0.0.9 (ttl 60)",
		}, ""},
		{"worker", "cluster: {name: prod, dnsZone: k8s.example.com}\nrole: worker\n", addrs("10.0.0.9"), nil, ""},
		{"no address", cp, nil, nil, "no address to publish for api.internal.prod.k8s.example.com"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			n := node(t, c.yaml)
			recs, err := Names(n, c.addrs...)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err = %v, want %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, r := range recs {
				s := r.String()
				if r.Shared {
					s += " shared"
				}
				got = append(got, s)
			}
			if !slices.Equal(got, c.want) {
				t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(c.want, "\n"))
			}
			for _, r := range recs {
				if host, _, _ := strings.Cut(r.Name, ".internal."); n.InternalName(host) != r.Name {
					t.Errorf("%s is not config.Node.InternalName(%s)", r.Name, host)
				}
			}
		})
	}
}

// memProvider is an in-memory Provider whose Upsert fails while failures > 0.
type memProvider struct {
	mu       sync.Mutex
	recs     map[string][]netip.Addr
	failures int
	upserts  int
	noLookup bool
}

func (m *memProvider) Name() string { return "mem" }

func (m *memProvider) Upsert(ctx context.Context, recs []Record) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.upserts++
	if m.failures > 0 {
		m.failures--
		return errors.New("server unreachable")
	}
	for _, r := range recs {
		key := FQDN(r.Name) + " " + r.Type
		m.recs[key], _ = r.Want(m.recs[key])
	}
	return nil
}

func (m *memProvider) Lookup(ctx context.Context, name string) ([]netip.Addr, error) {
	if m.noLookup {
		return nil, fmt.Errorf("mem: %w", errNoLookup)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Concat(m.recs[FQDN(name)+" A"], m.recs[FQDN(name)+" AAAA"]), nil
}

func TestRegister(t *testing.T) {
	rec := Record{Name: "etcd-a.internal.prod.example.test", Type: TypeA, Addrs: addrs("10.0.0.5"), TTL: 60}
	cases := []struct {
		name        string
		p           *memProvider
		recs        []Record
		timeout     time.Duration
		wantState   string
		wantUpserts int
		wantErr     string
	}{
		{"registers", &memProvider{}, []Record{rec}, time.Minute, "registered", 1, ""},
		{"already there: nothing to do", &memProvider{recs: map[string][]netip.Addr{FQDN(rec.Name) + " A": addrs("10.0.0.5")}}, []Record{rec}, time.Minute, "registered", 0, ""},
		{"other address: updated", &memProvider{recs: map[string][]netip.Addr{FQDN(rec.Name) + " A": addrs("10.0.0.4")}}, []Record{rec}, time.Minute, "registered", 1, ""},
		{"without lookup: always updated", &memProvider{noLookup: true}, []Record{rec}, time.Minute, "registered", 1, ""},
		{"retries", &memProvider{failures: 3}, []Record{rec}, time.Minute, "registered", 4, ""},
		{"gives up when ctx ends", &memProvider{failures: 1 << 30}, []Record{rec}, 100 * time.Millisecond, "pending: server unreachable", -1, "not registered after"},
		{"invalid record: failed, no retry", &memProvider{}, []Record{{Name: rec.Name, Type: "MX", TTL: 60}}, time.Minute, `failed: record etcd-a.internal.prod.example.test: type "MX" is not A or AAAA`, 0, "not A or AAAA"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.p.recs == nil {
				c.p.recs = map[string][]netip.Addr{}
			}
			ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
			defer cancel()
			var last State
			r := <-Start(ctx, c.p, c.recs, Options{MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, OnState: func(s State) { last = s }})
			if got := r.State.String(); got != c.wantState || last.String() != c.wantState {
				t.Errorf("state %q (last reported %q), want %q", got, last.String(), c.wantState)
			}
			if (r.Err == nil) != (c.wantErr == "") || (r.Err != nil && !strings.Contains(r.Err.Error(), c.wantErr)) {
				t.Errorf("err = %v, want %q", r.Err, c.wantErr)
			}
			if c.wantUpserts >= 0 && c.p.upserts != c.wantUpserts {
				t.Errorf("%d upserts, want %d", c.p.upserts, c.wantUpserts)
			}
		})
	}
}

func TestStatusFile(t *testing.T) {
	root := t.TempDir()
	f := StatusFile{Root: root}
	if _, err := f.Read(); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Read of a missing file = %v", err)
	}
	recs := []Record{{Name: "api.internal.prod.example.test", Type: TypeA, Addrs: addrs("10.0.0.5"), TTL: 60, Shared: true}}
	st, _ := Register(context.Background(), &memProvider{recs: map[string][]netip.Addr{}, failures: 1}, recs, Options{
		MinBackoff: time.Millisecond,
		OnState: func(s State) {
			if err := f.Write(s); err != nil {
				t.Error(err)
			}
		},
	})
	got, err := f.Read()
	if err != nil {
		t.Fatal(err)
	}
	if got.String() != "registered" || got.Attempts != 2 || !got.Updated.Equal(st.Updated) || got.Provider != "mem" || len(got.Records) != 1 || got.Records[0].Addrs[0] != addrs("10.0.0.5")[0] {
		t.Errorf("status = %+v", got)
	}
	if fi, err := filepath.Glob(filepath.Join(root, "var/lib/kiln/*")); err != nil || len(fi) != 1 {
		t.Errorf("files: %v %v", fi, err)
	}
	// The next boot, with a new address, removes the old one from the shared name.
	next := WithStale([]Record{{Name: recs[0].Name, Type: TypeA, Addrs: addrs("10.0.0.6"), TTL: 60, Shared: true}}, got.Records)
	if len(next[0].Stale) != 1 || next[0].Stale[0] != addrs("10.0.0.5")[0] {
		t.Errorf("WithStale = %+v", next)
	}
}

func TestFromConfig(t *testing.T) {
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "etc/kiln"), 0o755)
	os.WriteFile(filepath.Join(root, "etc/kiln/tsig.key"), []byte("key \"kiln-update\" {\n\talgorithm hmac-sha512;\n\tsecret \"c2VjcmV0\";\n};\n"), 0o600)
	os.WriteFile(filepath.Join(root, "etc/kiln/bare.key"), []byte("c2VjcmV0\n"), 0o600)
	base := "cluster: {name: prod, dnsZone: k8s.example.com}\nrole: worker\n"
	rfc := "dns: {provider: rfc2136, server: 10.0.0.53, tsigKeyName: kiln-update, "
	cases := []struct {
		name, dns, want, err, alg string
	}{
		{name: "none", dns: "", want: "<nil>"},
		{name: "hosts", dns: "dns: {provider: hosts}\n", want: "hosts /etc/hosts"},
		{name: "rfc2136", dns: rfc + "tsigSecretFile: /etc/kiln/tsig.key}\n", want: "rfc2136 10.0.0.53:53 zone k8s.example.com", alg: "hmac-sha512"},
		{name: "rfc2136 algorithm as the key clause says", dns: rfc + "tsigSecretFile: /etc/kiln/tsig.key, tsigAlgorithm: hmac-sha512}\n", want: "rfc2136 10.0.0.53:53 zone k8s.example.com", alg: "hmac-sha512"},
		{name: "rfc2136 algorithm for a bare secret", dns: rfc + "tsigSecretFile: /etc/kiln/bare.key, tsigAlgorithm: hmac-sha1}\n", want: "rfc2136 10.0.0.53:53 zone k8s.example.com", alg: "hmac-sha1"},
		{name: "rfc2136 default algorithm for a bare secret", dns: rfc + "tsigSecretFile: /etc/kiln/bare.key}\n", want: "rfc2136 10.0.0.53:53 zone k8s.example.com", alg: ""},
		{name: "rfc2136 algorithm against the key clause", dns: rfc + "tsigSecretFile: /etc/kiln/tsig.key, tsigAlgorithm: hmac-sha256}\n", err: "dns.tsigAlgorithm is hmac-sha256, but the key clause in /etc/kiln/tsig.key says hmac-sha512"},
		{name: "rfc2136 missing secret", dns: rfc + "tsigSecretFile: /etc/kiln/nope}\n", err: "dns.tsigSecretFile: tsig secret: open"},
		{name: "route53 is the aws cloud's", dns: "dns: {provider: route53}\n", err: `dns.provider "route53" is not supported`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p, err := FromConfig(node(t, base+c.dns), root)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err = %v, want %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := "<nil>"
			if p != nil {
				got = p.Name()
			}
			if got != c.want {
				t.Errorf("provider %q, want %q", got, c.want)
			}
			if r, ok := p.(*RFC2136); ok && (r.Secret != "c2VjcmV0" || r.Algorithm != c.alg) {
				t.Errorf("rfc2136 = %+v", r)
			}
		})
	}
}
