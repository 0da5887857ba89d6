package dns

import (
	"context"
	"encoding/xml"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/route53"

	"github.com/kilnproject/kiln/internal/cloudfake"
)

const r53NS = "https://route53.amazonaws.com/doc/2013-04-01/"

type r53RRSet struct {
	Name            string     `xml:"Name"`
	Type            string     `xml:"Type"`
	TTL             *int64     `xml:"TTL"`
	SetIdentifier   string     `xml:"SetIdentifier,omitempty"`
	ResourceRecords []r53Value `xml:"ResourceRecords>ResourceRecord"`
}

type r53Value struct {
	Value string `xml:"Value"`
}

func (s r53RRSet) values() []string {
	var out []string
	for _, v := range s.ResourceRecords {
		out = append(out, v.Value)
	}
	return out
}

type r53Change struct {
	Action string   `xml:"Action"`
	Set    r53RRSet `xml:"ResourceRecordSet"`
}

// fakeRoute53 answers the Route 53 REST-XML API for one hosted zone the way Route 53
// does: it verifies each request's SigV4 signature with the one access key it knows,
// checks change batches (actions, names in the zone, types, TTL, values) and applies
// a batch all or nothing, refusing a DELETE that does not match the set exactly.
type fakeRoute53 struct {
	t              *testing.T
	zoneID, zone   string
	key, secret    string
	mu             sync.Mutex
	sets           map[string]r53RRSet // "name type"
	batches        [][]r53Change
	changes        map[string]int // change ID → GetChange calls left before INSYNC
	beforeChange   func(f *fakeRoute53)
	pendingPolls   int
	getChangeCalls int
}

func newFakeRoute53(t *testing.T) (*fakeRoute53, *route53.Client) {
	f := &fakeRoute53{t: t, zoneID: "Z0KILN12345", zone: "example.test.", key: "AKIDKILN", secret: "kiln-secret",
		sets: map[string]r53RRSet{}, changes: map[string]int{}}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	return f, f.client(srv.URL, f.secret)
}

func (f *fakeRoute53) client(endpoint, secret string) *route53.Client {
	return route53.New(route53.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(endpoint),
		Credentials:  credentials.NewStaticCredentialsProvider(f.key, secret, ""),
	})
}

func (f *fakeRoute53) fail(w http.ResponseWriter, status int, code, msg string) {
	w.WriteHeader(status)
	fmt.Fprintf(w, `<?xml version="1.0"?><ErrorResponse xmlns=%q><Error><Type>Sender</Type><Code>%s</Code><Message>%s</Message></Error><RequestId>r1</RequestId></ErrorResponse>`, r53NS, code, msg)
}

// checkSignature checks r as AWS does (cloudfake.CheckSigV4) with the key the fake knows,
// and that it was signed for Route 53.
func (f *fakeRoute53) checkSignature(r *http.Request, body []byte) error {
	scope, err := cloudfake.CheckSigV4(r, body, cloudfake.AWSCredentials{AccessKeyID: f.key, SecretAccessKey: f.secret})
	if err != nil {
		return err
	}
	if scope.Service != "route53" {
		return fmt.Errorf("signed for service %s, not route53", scope.Service)
	}
	return nil
}

func (f *fakeRoute53) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	if err := f.checkSignature(r, body); err != nil {
		f.fail(w, http.StatusForbidden, "SignatureDoesNotMatch", err.Error())
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	p := strings.TrimSuffix(strings.TrimPrefix(r.URL.Path, "/2013-04-01/"), "/")
	q := r.URL.Query()
	switch {
	case r.Method == http.MethodGet && p == "hostedzonesbyname":
		fmt.Fprintf(w, `<ListHostedZonesByNameResponse xmlns=%q><HostedZones>`, r53NS)
		if fqdn(q.Get("dnsname")) <= f.zone {
			fmt.Fprintf(w, `<HostedZone><Id>/hostedzone/%s</Id><Name>%s</Name><CallerReference>c</CallerReference></HostedZone>`, f.zoneID, f.zone)
		}
		fmt.Fprintf(w, `</HostedZones><IsTruncated>false</IsTruncated><MaxItems>%s</MaxItems></ListHostedZonesByNameResponse>`, q.Get("maxitems"))
	case p == "hostedzone/"+f.zoneID+"/rrset" && r.Method == http.MethodGet:
		f.list(w, q)
	case p == "hostedzone/"+f.zoneID+"/rrset" && r.Method == http.MethodPost:
		f.change(w, body)
	case strings.HasPrefix(p, "change/") && r.Method == http.MethodGet:
		id := strings.TrimPrefix(p, "change/")
		left, ok := f.changes[id]
		if !ok {
			f.fail(w, http.StatusNotFound, "NoSuchChange", "no change "+id)
			return
		}
		f.getChangeCalls++
		status := "INSYNC"
		if left > 0 {
			status, f.changes[id] = "PENDING", left-1
		}
		fmt.Fprintf(w, `<GetChangeResponse xmlns=%q><ChangeInfo><Id>/change/%s</Id><Status>%s</Status><SubmittedAt>2026-01-01T00:00:00Z</SubmittedAt></ChangeInfo></GetChangeResponse>`, r53NS, id, status)
	default:
		f.fail(w, http.StatusNotFound, "NoSuchHostedZone", r.Method+" "+r.URL.Path)
	}
}

func (f *fakeRoute53) list(w http.ResponseWriter, q url.Values) {
	var keys []string
	for k := range f.sets {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	start := q.Get("name") + " " + q.Get("type")
	fmt.Fprintf(w, `<ListResourceRecordSetsResponse xmlns=%q><ResourceRecordSets>`, r53NS)
	for _, k := range keys {
		if k >= start {
			b, _ := xml.Marshal(struct {
				XMLName xml.Name `xml:"ResourceRecordSet"`
				r53RRSet
			}{r53RRSet: f.sets[k]})
			w.Write(b)
		}
	}
	fmt.Fprintf(w, `</ResourceRecordSets><IsTruncated>false</IsTruncated><MaxItems>%s</MaxItems></ListResourceRecordSetsResponse>`, q.Get("maxitems"))
}

func (f *fakeRoute53) change(w http.ResponseWriter, body []byte) {
	var req struct {
		XMLName xml.Name    `xml:"ChangeResourceRecordSetsRequest"`
		Changes []r53Change `xml:"ChangeBatch>Changes>Change"`
	}
	if err := xml.Unmarshal(body, &req); err != nil || req.XMLName.Space != r53NS {
		f.fail(w, http.StatusBadRequest, "MalformedXML", fmt.Sprintf("%v (namespace %q)", err, req.XMLName.Space))
		return
	}
	if f.beforeChange != nil {
		f.beforeChange(f)
		f.beforeChange = nil
	}
	sets := map[string]r53RRSet{}
	for k, v := range f.sets {
		sets[k] = v
	}
	var msgs []string
	for _, c := range req.Changes {
		s := c.Set
		key := s.Name + " " + s.Type
		switch {
		case !strings.HasSuffix(s.Name, "."+f.zone):
			msgs = append(msgs, fmt.Sprintf("%s is not in zone %s", s.Name, f.zone))
			continue
		case s.Type != "A" && s.Type != "AAAA":
			msgs = append(msgs, "type "+s.Type)
			continue
		case s.TTL == nil || len(s.ResourceRecords) == 0:
			msgs = append(msgs, key+": TTL and ResourceRecords are required")
			continue
		}
		if _, err := parseAddrs(s.Type, s.values()); err != nil {
			msgs = append(msgs, err.Error())
			continue
		}
		cur, exists := sets[key]
		switch c.Action {
		case "UPSERT":
			sets[key] = s
		case "CREATE":
			if exists {
				msgs = append(msgs, fmt.Sprintf("Tried to create resource record set %s type %s, but it already exists", s.Name, s.Type))
			}
			sets[key] = s
		case "DELETE":
			if !exists || *cur.TTL != *s.TTL || !slices.Equal(cur.values(), s.values()) {
				msgs = append(msgs, fmt.Sprintf("Tried to delete resource record set %s type %s, but the values provided do not match the current values", s.Name, s.Type))
			}
			delete(sets, key)
		default:
			msgs = append(msgs, "action "+c.Action)
		}
	}
	if len(msgs) > 0 {
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprintf(w, `<?xml version="1.0"?><InvalidChangeBatch xmlns=%q><Messages>`, r53NS)
		for _, m := range msgs {
			fmt.Fprintf(w, "<Message>%s</Message>", m)
		}
		fmt.Fprint(w, `</Messages><RequestId>r2</RequestId></InvalidChangeBatch>`)
		return
	}
	f.sets = sets
	f.batches = append(f.batches, req.Changes)
	id := fmt.Sprintf("C%d", len(f.batches))
	f.changes[id] = f.pendingPolls
	fmt.Fprintf(w, `<ChangeResourceRecordSetsResponse xmlns=%q><ChangeInfo><Id>/change/%s</Id><Status>PENDING</Status><SubmittedAt>2026-01-01T00:00:00Z</SubmittedAt></ChangeInfo></ChangeResourceRecordSetsResponse>`, r53NS, id)
}

// batchSummary is the last batch as "ACTION name type ttl values" lines.
func (f *fakeRoute53) lastBatch() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.batches) == 0 {
		return nil
	}
	var out []string
	for _, c := range f.batches[len(f.batches)-1] {
		out = append(out, fmt.Sprintf("%s %s %s %d %s", c.Action, c.Set.Name, c.Set.Type, *c.Set.TTL, strings.Join(c.Set.values(), ",")))
	}
	return out
}

func (f *fakeRoute53) numBatches() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.batches)
}

// route53Steps are the registrations TestRoute53 makes, in order, and the change batch each
// sends.
var route53Steps = []providerStep{
	{"create", []Record{
		{Name: testEtcd, Type: typeA, Addrs: addrs("10.0.0.5"), TTL: 60},
		{Name: testEtcd, Type: typeAAAA, Addrs: addrs("fd00::5"), TTL: 60},
		{Name: testAPI, Type: typeA, Addrs: addrs("10.0.0.5"), TTL: 60, Shared: true},
	}, []string{
		"UPSERT etcd-a.internal.prod.example.test. A 60 10.0.0.5",
		"UPSERT etcd-a.internal.prod.example.test. AAAA 60 fd00::5",
		"CREATE api.internal.prod.example.test. A 60 10.0.0.5",
	}},
	{"unchanged: nothing sent", []Record{
		{Name: testEtcd, Type: typeA, Addrs: addrs("10.0.0.5"), TTL: 60},
		{Name: testAPI, Type: typeA, Addrs: addrs("10.0.0.5"), TTL: 60, Shared: true},
	}, nil},
	{"new IP", []Record{
		{Name: testEtcd, Type: typeA, Addrs: addrs("10.0.0.6"), TTL: 60},
	}, []string{"UPSERT etcd-a.internal.prod.example.test. A 60 10.0.0.6"}},
	{"second control-plane node", []Record{
		{Name: testAPI, Type: typeA, Addrs: addrs("10.0.0.7"), TTL: 60, Shared: true},
	}, []string{
		"DELETE api.internal.prod.example.test. A 60 10.0.0.5",
		"CREATE api.internal.prod.example.test. A 60 10.0.0.5,10.0.0.7",
	}},
}

func TestRoute53(t *testing.T) {
	f, client := newFakeRoute53(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p := &Route53{Client: client, Zone: "example.test"} // hosted zone found by name
	register := func(recs []Record) error {
		st, err := Register(ctx, p, recs, Options{})
		if err != nil || st.State != stateRegistered {
			return fmt.Errorf("%v %v", st, err)
		}
		return nil
	}
	runProviderSteps(t, route53Steps, register, f.numBatches, f.lastBatch)
	if got, err := p.Lookup(ctx, testEtcd); err != nil || !sameAddrs(got, addrs("10.0.0.6", "fd00::5")) {
		t.Errorf("Lookup = %v, %v", got, err)
	}

	t.Run("race on the shared name", func(t *testing.T) { testRoute53Race(t, ctx, f, p) })
	t.Run("wait for INSYNC", func(t *testing.T) { testRoute53WaitInSync(t, ctx, f, client) })
	t.Run("errors", func(t *testing.T) { testRoute53Errors(t, ctx, f, client) })
}

// testRoute53Race checks a shared name another node changes between our read and our change.
func testRoute53Race(t *testing.T, ctx context.Context, f *fakeRoute53, p *Route53) {
	// Another node adds itself between our read and our change: Route 53 refuses
	// the DELETE, the next attempt reads again and keeps the other node.
	f.beforeChange = func(f *fakeRoute53) {
		s := f.sets["api.internal.prod.example.test. A"]
		s.ResourceRecords = append(slices.Clone(s.ResourceRecords), r53Value{"10.0.0.9"})
		f.sets["api.internal.prod.example.test. A"] = s
	}
	var states []string
	st, err := Register(ctx, p, []Record{{Name: testAPI, Type: typeA, Addrs: addrs("10.0.0.8"), TTL: 60, Shared: true}},
		Options{MinBackoff: time.Millisecond, OnState: func(s State) { states = append(states, s.String()) }})
	if err != nil || st.Attempts != 2 {
		t.Fatalf("Register = %+v, %v", st, err)
	}
	if len(states) != 3 || !strings.Contains(states[1], "InvalidChangeBatch") {
		t.Errorf("states = %q", states)
	}
	if got, _ := p.Lookup(ctx, testAPI); !sameAddrs(got, addrs("10.0.0.5", "10.0.0.7", "10.0.0.8", "10.0.0.9")) {
		t.Errorf("api = %v", got)
	}
}

// testRoute53WaitInSync checks Upsert polls GetChange until INSYNC and gives up after Wait.
func testRoute53WaitInSync(t *testing.T, ctx context.Context, f *fakeRoute53, client *route53.Client) {
	f.pendingPolls = 2
	calls := f.getChangeCalls
	w := &Route53{Client: client, HostedZoneID: "/hostedzone/" + f.zoneID, Wait: 5 * time.Second, PollInterval: 10 * time.Millisecond}
	if err := w.Upsert(ctx, []Record{{Name: testEtcd, Type: typeA, Addrs: addrs("10.0.0.10"), TTL: 30}}); err != nil {
		t.Fatal(err)
	}
	if f.getChangeCalls-calls != 3 {
		t.Errorf("GetChange called %d times, want 3 (PENDING, PENDING, INSYNC)", f.getChangeCalls-calls)
	}
	f.pendingPolls = 1000
	w.Wait = 100 * time.Millisecond
	err := w.Upsert(ctx, []Record{{Name: testEtcd, Type: typeA, Addrs: addrs("10.0.0.11"), TTL: 30}})
	if err == nil || !strings.Contains(err.Error(), "still PENDING") {
		t.Errorf("err = %v, want still PENDING", err)
	}
}

// testRoute53Errors checks a wrong secret and unknown zones fail with Route 53's own words.
func testRoute53Errors(t *testing.T, ctx context.Context, f *fakeRoute53, client *route53.Client) {
	srv := httptest.NewServer(f)
	defer srv.Close()
	cases := []struct {
		name string
		p    *Route53
		want string
	}{
		{"wrong secret", &Route53{Client: f.client(srv.URL, "wrong"), HostedZoneID: f.zoneID}, "SignatureDoesNotMatch"},
		{"unknown zone name", &Route53{Client: client, Zone: "example.org"}, "no hosted zone is named example.org"},
		{"unknown zone ID", &Route53{Client: client, HostedZoneID: "ZNOPE"}, "NoSuchHostedZone"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { checkUpsertRefused(t, ctx, c.p, c.p.Zone, c.want) })
	}
}
