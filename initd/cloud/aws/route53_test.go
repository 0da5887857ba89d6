package aws

import (
	"context"
	"fmt"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kilnproject/kiln/initd/config"
	"github.com/kilnproject/kiln/initd/dns"
	"github.com/kilnproject/kiln/initd/dns/dnstest"
	"github.com/kilnproject/kiln/internal/cloudfake"
)

// The Route 53 provider tests' hosted zone and the key the fake knows.
const (
	r53ZoneID = "Z0KILN12345"
	r53Key    = "AKIDKILN"
	r53Secret = "kiln-secret"
)

// newFakeRoute53 is a Route 53 holding hosted zone example.test. that takes requests signed
// with the test key, and its URL.
func newFakeRoute53(t *testing.T) (*cloudfake.Route53, string) {
	f := &cloudfake.Route53{Creds: cloudfake.AWSCredentials{AccessKeyID: r53Key, SecretAccessKey: r53Secret},
		ZoneID: r53ZoneID, Zone: "example.test."}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	return f, srv.URL
}

// testRoute53Client is a Route 53 client of endpoint that signs with the test key and secret.
func testRoute53Client(t *testing.T, endpoint, secret string) *Route53Client {
	c, err := newRoute53Client(endpoint, "us-east-1", staticCredentials{AccessKeyID: r53Key, SecretAccessKey: secret})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// lastBatch is f's last change batch as "ACTION name type ttl values" lines.
func lastBatch(f *cloudfake.Route53) []string {
	batches := f.Batches()
	if len(batches) == 0 {
		return nil
	}
	var out []string
	for _, c := range batches[len(batches)-1] {
		out = append(out, fmt.Sprintf("%s %s %s %d %s", c.Action, c.Set.Name, c.Set.Type, *c.Set.TTL, strings.Join(c.Set.Values, ",")))
	}
	return out
}

// route53Steps are the registrations TestRoute53 makes, in order, and the change batch each
// sends.
var route53Steps = []providerStep{
	{"create", []dns.Record{
		{Name: dnstest.Etcd, Type: dns.TypeA, Addrs: dnstest.Addrs("10.0.0.5"), TTL: 60},
		{Name: dnstest.Etcd, Type: dns.TypeAAAA, Addrs: dnstest.Addrs("fd00::5"), TTL: 60},
		{Name: dnstest.API, Type: dns.TypeA, Addrs: dnstest.Addrs("10.0.0.5"), TTL: 60, Shared: true},
	}, []string{
		"UPSERT etcd-a.internal.prod.example.test. A 60 10.0.0.5",
		"UPSERT etcd-a.internal.prod.example.test. AAAA 60 fd00::5",
		"CREATE api.internal.prod.example.test. A 60 10.0.0.5",
	}},
	{"unchanged: nothing sent", []dns.Record{
		{Name: dnstest.Etcd, Type: dns.TypeA, Addrs: dnstest.Addrs("10.0.0.5"), TTL: 60},
		{Name: dnstest.API, Type: dns.TypeA, Addrs: dnstest.Addrs("10.0.0.5"), TTL: 60, Shared: true},
	}, nil},
	{"new IP", []dns.Record{
		{Name: dnstest.Etcd, Type: dns.TypeA, Addrs: dnstest.Addrs("10.0.0.6"), TTL: 60},
	}, []string{"UPSERT etcd-a.internal.prod.example.test. A 60 10.0.0.6"}},
	{"second control-plane node", []dns.Record{
		{Name: dnstest.API, Type: dns.TypeA, Addrs: dnstest.Addrs("10.0.0.7"), TTL: 60, Shared: true},
	}, []string{
		"DELETE api.internal.prod.example.test. A 60 10.0.0.5",
		"CREATE api.internal.prod.example.test. A 60 10.0.0.5,10.0.0.7",
	}},
}

func TestRoute53(t *testing.T) {
	f, endpoint := newFakeRoute53(t)
	client := testRoute53Client(t, endpoint, r53Secret)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p := &Route53{Client: client, Zone: "example.test"} // hosted zone found by name
	register := func(recs []dns.Record) error {
		st, err := dns.Register(ctx, p, recs, dns.Options{})
		if err != nil || st.State != dns.StateRegistered {
			return fmt.Errorf("%v %v", st, err)
		}
		return nil
	}
	dnstest.RunSteps(t, steps(route53Steps), register, func() int { return len(f.Batches()) }, func() []string { return lastBatch(f) })
	if got, err := p.Lookup(ctx, dnstest.Etcd); err != nil || !dnstest.SameAddrs(got, dnstest.Addrs("10.0.0.6", "fd00::5")) {
		t.Errorf("Lookup = %v, %v", got, err)
	}

	t.Run("race on the shared name", func(t *testing.T) { testRoute53Race(t, ctx, f, p) })
	t.Run("wait for INSYNC", func(t *testing.T) { testRoute53WaitInSync(t, ctx, f, client) })
	noRefusals(t, f.Refused())
	t.Run("errors", func(t *testing.T) { testRoute53Errors(t, ctx, f, endpoint, client) })
}

// testRoute53Race checks a shared name another node changes between our read and our change.
func testRoute53Race(t *testing.T, ctx context.Context, f *cloudfake.Route53, p *Route53) {
	// Another node adds itself between our read and our change: Route 53 refuses
	// the DELETE, the next attempt reads again and keeps the other node.
	f.Lock()
	f.BeforeChange = func(f *cloudfake.Route53) {
		s := f.Sets["api.internal.prod.example.test. A"]
		s.Values = append(slices.Clone(s.Values), "10.0.0.9")
		f.Sets["api.internal.prod.example.test. A"] = s
		f.BeforeChange = nil
	}
	f.Unlock()
	var states []string
	st, err := dns.Register(ctx, p, []dns.Record{{Name: dnstest.API, Type: dns.TypeA, Addrs: dnstest.Addrs("10.0.0.8"), TTL: 60, Shared: true}},
		dns.Options{MinBackoff: time.Millisecond, OnState: func(s dns.State) { states = append(states, s.String()) }})
	if err != nil || st.Attempts != 2 {
		t.Fatalf("Register = %+v, %v", st, err)
	}
	if len(states) != 3 || !strings.Contains(states[1], "InvalidChangeBatch") {
		t.Errorf("states = %q", states)
	}
	if got, _ := p.Lookup(ctx, dnstest.API); !dnstest.SameAddrs(got, dnstest.Addrs("10.0.0.5", "10.0.0.7", "10.0.0.8", "10.0.0.9")) {
		t.Errorf("api = %v", got)
	}
}

// getChanges is how many GetChange calls f took.
func getChanges(f *cloudfake.Route53) int {
	n := 0
	for _, c := range f.Calls() {
		if c == "GetChange" {
			n++
		}
	}
	return n
}

// testRoute53WaitInSync checks Upsert polls GetChange until INSYNC and gives up after Wait.
func testRoute53WaitInSync(t *testing.T, ctx context.Context, f *cloudfake.Route53, client *Route53Client) {
	f.Lock()
	f.PendingPolls = 2
	f.Unlock()
	calls := getChanges(f)
	w := &Route53{Client: client, HostedZoneID: "/hostedzone/" + f.ZoneID, Wait: 5 * time.Second, PollInterval: 10 * time.Millisecond}
	if err := w.Upsert(ctx, []dns.Record{{Name: dnstest.Etcd, Type: dns.TypeA, Addrs: dnstest.Addrs("10.0.0.10"), TTL: 30}}); err != nil {
		t.Fatal(err)
	}
	if n := getChanges(f) - calls; n != 3 {
		t.Errorf("GetChange called %d times, want 3 (PENDING, PENDING, INSYNC)", n)
	}
	f.Lock()
	f.PendingPolls = 1000
	f.Unlock()
	w.Wait = 100 * time.Millisecond
	err := w.Upsert(ctx, []dns.Record{{Name: dnstest.Etcd, Type: dns.TypeA, Addrs: dnstest.Addrs("10.0.0.11"), TTL: 30}})
	if err == nil || !strings.Contains(err.Error(), "still PENDING") {
		t.Errorf("err = %v, want still PENDING", err)
	}
}

// testRoute53Errors checks a wrong secret and unknown zones fail with Route 53's own words,
// and that the fake refused the wrongly signed request.
func testRoute53Errors(t *testing.T, ctx context.Context, f *cloudfake.Route53, endpoint string, client *Route53Client) {
	cases := []struct {
		name        string
		p           *Route53
		want        string
		wantRefused string
	}{
		{"wrong secret", &Route53{Client: testRoute53Client(t, endpoint, "wrong"), HostedZoneID: f.ZoneID}, "SignatureDoesNotMatch", "signature does not match"},
		{"unknown zone name", &Route53{Client: client, Zone: "example.org"}, "no hosted zone is named example.org", ""},
		{"unknown zone ID", &Route53{Client: client, HostedZoneID: "ZNOPE"}, "NoSuchHostedZone", ""},
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

// aws.route53HostedZoneId names the hosted zone, so no lookup by name is made; without it
// the zone is the one named dns.zone.
func TestRoute53Provider(t *testing.T) {
	n, err := config.ParseNode([]byte("cluster: {name: prod, dnsZone: k8s.example.com}\nrole: worker\ndns: {provider: route53}\naws: {route53HostedZoneId: Z0KILN12345}\n"), "node.yaml")
	if err != nil {
		t.Fatal(err)
	}
	p := route53Provider(n, &Route53Client{})
	if got := p.Name(); got != "route53 hosted zone Z0KILN12345" {
		t.Errorf("provider %q, want the hosted zone by ID", got)
	}
	if p, err := (Cloud{}).DNS(context.Background(), &config.Node{}); p != nil || err != nil {
		t.Errorf("DNS without dns.provider route53 = %v, %v; want nil, nil", p, err)
	}
}
