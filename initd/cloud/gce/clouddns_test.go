package gce

import (
	"context"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kilnproject/kiln/initd/dns"
	"github.com/kilnproject/kiln/initd/dns/dnstest"
	"github.com/kilnproject/kiln/internal/cloudfake"
)

// newFakeCloudDNS is Cloud DNS holding managed zone prod-zone (example.test.) of project
// kiln-proj that takes bearer token ya29.kiln, and a client of it that sends token, and its
// URL.
func newFakeCloudDNS(t *testing.T, token string) (*cloudfake.CloudDNS, *DNSService, string) {
	f := &cloudfake.CloudDNS{Token: "ya29.kiln", Project: "kiln-proj", ZoneName: "prod-zone", DNSName: "example.test."}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	return f, dnsService(t, srv.URL, token), srv.URL
}

// dnsService is a Cloud DNS client of endpoint that sends token.
func dnsService(t *testing.T, endpoint, token string) *DNSService {
	svc, err := newDNSService(endpoint+"/", staticToken(token))
	if err != nil {
		t.Fatal(err)
	}
	return svc
}

// lastChange is f's last change as "-name type ttl data" and "+…" lines.
func lastChange(f *cloudfake.CloudDNS) []string {
	changes := f.Changes()
	if len(changes) == 0 {
		return nil
	}
	c := changes[len(changes)-1]
	var out []string
	for _, d := range c.Deletions {
		out = append(out, fmt.Sprintf("-%s %s %d %s", d.Name, d.Type, d.Ttl, strings.Join(d.Rrdatas, ",")))
	}
	for _, a := range c.Additions {
		out = append(out, fmt.Sprintf("+%s %s %d %s", a.Name, a.Type, a.Ttl, strings.Join(a.Rrdatas, ",")))
	}
	return out
}

// cloudDNSSteps are the Upserts TestCloudDNS makes, in order, and the change each sends.
var cloudDNSSteps = []providerStep{
	{"create", []dns.Record{
		{Name: dnstest.Etcd, Type: dns.TypeA, Addrs: dnstest.Addrs("10.0.0.5"), TTL: 60},
		{Name: dnstest.Etcd, Type: dns.TypeAAAA, Addrs: dnstest.Addrs("fd00::5"), TTL: 60},
		{Name: dnstest.API, Type: dns.TypeA, Addrs: dnstest.Addrs("10.0.0.5"), TTL: 60, Shared: true},
	}, []string{
		"+etcd-a.internal.prod.example.test. A 60 10.0.0.5",
		"+etcd-a.internal.prod.example.test. AAAA 60 fd00::5",
		"+api.internal.prod.example.test. A 60 10.0.0.5",
	}},
	{"unchanged: nothing sent", []dns.Record{
		{Name: dnstest.Etcd, Type: dns.TypeA, Addrs: dnstest.Addrs("10.0.0.5"), TTL: 60},
	}, nil},
	{"new IP replaces the set", []dns.Record{
		{Name: dnstest.Etcd, Type: dns.TypeA, Addrs: dnstest.Addrs("10.0.0.6"), TTL: 60},
	}, []string{
		"-etcd-a.internal.prod.example.test. A 60 10.0.0.5",
		"+etcd-a.internal.prod.example.test. A 60 10.0.0.6",
	}},
	{"new TTL", []dns.Record{
		{Name: dnstest.Etcd, Type: dns.TypeA, Addrs: dnstest.Addrs("10.0.0.6"), TTL: 30},
	}, []string{
		"-etcd-a.internal.prod.example.test. A 60 10.0.0.6",
		"+etcd-a.internal.prod.example.test. A 30 10.0.0.6",
	}},
	{"second control-plane node", []dns.Record{
		{Name: dnstest.API, Type: dns.TypeA, Addrs: dnstest.Addrs("10.0.0.7"), TTL: 60, Shared: true},
	}, []string{
		"-api.internal.prod.example.test. A 60 10.0.0.5",
		"+api.internal.prod.example.test. A 60 10.0.0.5,10.0.0.7",
	}},
	{"the first one's address changes", dns.WithStale(
		[]dns.Record{{Name: dnstest.API, Type: dns.TypeA, Addrs: dnstest.Addrs("10.0.0.6"), TTL: 60, Shared: true}},
		[]dns.Record{{Name: dnstest.API, Type: dns.TypeA, Addrs: dnstest.Addrs("10.0.0.5"), TTL: 60, Shared: true}},
	), []string{
		"-api.internal.prod.example.test. A 60 10.0.0.5,10.0.0.7",
		"+api.internal.prod.example.test. A 60 10.0.0.6,10.0.0.7",
	}},
}

func TestCloudDNS(t *testing.T) {
	f, svc, endpoint := newFakeCloudDNS(t, "ya29.kiln")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p := &CloudDNS{Service: svc, Project: f.Project, Zone: "example.test"} // managed zone found by DNS name
	dnstest.RunSteps(t, steps(cloudDNSSteps), func(recs []dns.Record) error { return p.Upsert(ctx, recs) },
		func() int { return len(f.Changes()) }, func() []string { return lastChange(f) })
	if got, err := p.Lookup(ctx, dnstest.Etcd); err != nil || !dnstest.SameAddrs(got, dnstest.Addrs("10.0.0.6", "fd00::5")) {
		t.Errorf("Lookup = %v, %v", got, err)
	}
	if got, err := p.Lookup(ctx, "nothing.example.test"); err != nil || len(got) != 0 {
		t.Errorf("Lookup(nothing) = %v, %v", got, err)
	}
	noRefusals(t, f.Refused())

	t.Run("errors", func(t *testing.T) {
		cases := []struct {
			name        string
			p           *CloudDNS
			want        string
			wantRefused string
		}{
			{"bad token", &CloudDNS{Service: dnsService(t, endpoint, "expired"), Project: f.Project, ManagedZone: f.ZoneName}, "401", "another bearer token"},
			{"unknown zone", &CloudDNS{Service: svc, Project: f.Project, Zone: "example.org"}, "project kiln-proj has no managed zone for example.org", ""},
			{"unknown managed zone", &CloudDNS{Service: svc, Project: f.Project, ManagedZone: "nope"}, "404", ""},
		}
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				before := len(f.Refused())
				dnstest.CheckUpsertRefused(t, ctx, c.p, c.p.Zone, c.want)
				refused := f.Refused()[before:]
				if c.wantRefused == "" && len(refused) > 0 || c.wantRefused != "" && (len(refused) == 0 || !strings.Contains(refused[0], c.wantRefused)) {
					t.Errorf("refused %q, want %q", refused, c.wantRefused)
				}
			})
		}
	})
}

// providerStep is a dnstest.Step of this package's, so its literals may be unkeyed.
type providerStep dnstest.Step

// steps are ps as dnstest.RunSteps takes them.
func steps(ps []providerStep) []dnstest.Step {
	out := make([]dnstest.Step, len(ps))
	for i, p := range ps {
		out[i] = dnstest.Step(p)
	}
	return out
}
