package dns

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/oauth2"
	gdns "google.golang.org/api/dns/v1"
	"google.golang.org/api/option"
)

// fakeCloudDNS answers the Cloud DNS v1 API for one managed zone as Cloud DNS does:
// a bearer token is required; a change's deletions must match the current record
// sets exactly (else 412 conditionNotMet) and its additions must not exist after the
// deletions (else 409 alreadyExists); a change applies all or nothing.
type fakeCloudDNS struct {
	project, zoneName, dnsName, token string
	mu                                sync.Mutex
	sets                              map[string]*gdns.ResourceRecordSet // "name type"
	changes                           []*gdns.Change
}

func newFakeCloudDNS(t *testing.T, token string) (*fakeCloudDNS, *gdns.Service) {
	f := &fakeCloudDNS{project: "kiln-proj", zoneName: "prod-zone", dnsName: "example.test.", token: "ya29.kiln",
		sets: map[string]*gdns.ResourceRecordSet{}}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	return f, f.service(t, srv.URL, token)
}

func (f *fakeCloudDNS) service(t *testing.T, endpoint, token string) *gdns.Service {
	svc, err := gdns.NewService(context.Background(), option.WithEndpoint(endpoint+"/"),
		option.WithTokenSource(oauth2.StaticTokenSource(&oauth2.Token{AccessToken: token, Expiry: time.Now().Add(time.Hour)})))
	if err != nil {
		t.Fatal(err)
	}
	return svc
}

func (f *fakeCloudDNS) fail(w http.ResponseWriter, code int, reason, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"code": code, "message": msg,
		"errors": []map[string]string{{"reason": reason, "message": msg, "domain": "global"}}}})
}

func (f *fakeCloudDNS) reply(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}

func (f *fakeCloudDNS) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Authorization") != "Bearer "+f.token {
		f.fail(w, http.StatusUnauthorized, "authError", "Request had invalid authentication credentials.")
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	base := "/dns/v1/projects/" + f.project + "/managedZones"
	zone := base + "/" + f.zoneName
	q := r.URL.Query()
	switch {
	case r.Method == http.MethodGet && r.URL.Path == base:
		var zones []*gdns.ManagedZone
		if q.Get("dnsName") == f.dnsName {
			zones = append(zones, &gdns.ManagedZone{Name: f.zoneName, DnsName: f.dnsName})
		}
		f.reply(w, &gdns.ManagedZonesListResponse{ManagedZones: zones})
	case r.Method == http.MethodGet && r.URL.Path == zone+"/rrsets":
		var sets []*gdns.ResourceRecordSet
		for _, s := range f.sets {
			if (q.Get("name") == "" || s.Name == q.Get("name")) && (q.Get("type") == "" || s.Type == q.Get("type")) {
				sets = append(sets, s)
			}
		}
		slices.SortFunc(sets, func(a, b *gdns.ResourceRecordSet) int { return strings.Compare(a.Name+a.Type, b.Name+b.Type) })
		f.reply(w, &gdns.ResourceRecordSetsListResponse{Rrsets: sets})
	case r.Method == http.MethodPost && r.URL.Path == zone+"/changes":
		var c gdns.Change
		if err := json.NewDecoder(r.Body).Decode(&c); err != nil {
			f.fail(w, http.StatusBadRequest, "invalid", err.Error())
			return
		}
		sets := map[string]*gdns.ResourceRecordSet{}
		for k, v := range f.sets {
			sets[k] = v
		}
		for _, d := range c.Deletions {
			cur, ok := sets[d.Name+" "+d.Type]
			if !ok || cur.Ttl != d.Ttl || !slices.Equal(cur.Rrdatas, d.Rrdatas) {
				f.fail(w, http.StatusPreconditionFailed, "conditionNotMet", fmt.Sprintf("Precondition not met for 'entity.change.deletions[%s][%s]'", d.Name, d.Type))
				return
			}
			delete(sets, d.Name+" "+d.Type)
		}
		for _, a := range c.Additions {
			if _, ok := sets[a.Name+" "+a.Type]; ok {
				f.fail(w, http.StatusConflict, "alreadyExists", fmt.Sprintf("The resource 'entity.change.additions[%s][%s]' named '%s (%s)' already exists", a.Name, a.Type, a.Name, a.Type))
				return
			}
			if !strings.HasSuffix(a.Name, "."+f.dnsName) || a.Ttl <= 0 || len(a.Rrdatas) == 0 {
				f.fail(w, http.StatusBadRequest, "invalid", fmt.Sprintf("Invalid value for 'entity.change.additions[%s][%s]'", a.Name, a.Type))
				return
			}
			if _, err := parseAddrs(a.Type, a.Rrdatas); err != nil {
				f.fail(w, http.StatusBadRequest, "invalidRecordData", err.Error())
				return
			}
			sets[a.Name+" "+a.Type] = a
		}
		f.sets = sets
		c.Id, c.Status, c.Kind = fmt.Sprint(len(f.changes)+1), "pending", "dns#change"
		f.changes = append(f.changes, &c)
		f.reply(w, &c)
	default:
		f.fail(w, http.StatusNotFound, "notFound", "The requested resource was not found: "+r.URL.Path)
	}
}

// lastChange is the last change as "-name type ttl data" and "+…" lines.
func (f *fakeCloudDNS) lastChange() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.changes) == 0 {
		return nil
	}
	c := f.changes[len(f.changes)-1]
	var out []string
	for _, d := range c.Deletions {
		out = append(out, fmt.Sprintf("-%s %s %d %s", d.Name, d.Type, d.Ttl, strings.Join(d.Rrdatas, ",")))
	}
	for _, a := range c.Additions {
		out = append(out, fmt.Sprintf("+%s %s %d %s", a.Name, a.Type, a.Ttl, strings.Join(a.Rrdatas, ",")))
	}
	return out
}

func (f *fakeCloudDNS) numChanges() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.changes)
}

// cloudDNSSteps are the Upserts TestCloudDNS makes, in order, and the change each sends.
var cloudDNSSteps = []providerStep{
	{"create", []Record{
		{Name: testEtcd, Type: typeA, Addrs: addrs("10.0.0.5"), TTL: 60},
		{Name: testEtcd, Type: typeAAAA, Addrs: addrs("fd00::5"), TTL: 60},
		{Name: testAPI, Type: typeA, Addrs: addrs("10.0.0.5"), TTL: 60, Shared: true},
	}, []string{
		"+etcd-a.internal.prod.example.test. A 60 10.0.0.5",
		"+etcd-a.internal.prod.example.test. AAAA 60 fd00::5",
		"+api.internal.prod.example.test. A 60 10.0.0.5",
	}},
	{"unchanged: nothing sent", []Record{
		{Name: testEtcd, Type: typeA, Addrs: addrs("10.0.0.5"), TTL: 60},
	}, nil},
	{"new IP replaces the set", []Record{
		{Name: testEtcd, Type: typeA, Addrs: addrs("10.0.0.6"), TTL: 60},
	}, []string{
		"-etcd-a.internal.prod.example.test. A 60 10.0.0.5",
		"+etcd-a.internal.prod.example.test. A 60 10.0.0.6",
	}},
	{"new TTL", []Record{
		{Name: testEtcd, Type: typeA, Addrs: addrs("10.0.0.6"), TTL: 30},
	}, []string{
		"-etcd-a.internal.prod.example.test. A 60 10.0.0.6",
		"+etcd-a.internal.prod.example.test. A 30 10.0.0.6",
	}},
	{"second control-plane node", []Record{
		{Name: testAPI, Type: typeA, Addrs: addrs("10.0.0.7"), TTL: 60, Shared: true},
	}, []string{
		"-api.internal.prod.example.test. A 60 10.0.0.5",
		"+api.internal.prod.example.test. A 60 10.0.0.5,10.0.0.7",
	}},
	{"the first one's address changes", WithStale(
		[]Record{{Name: testAPI, Type: typeA, Addrs: addrs("10.0.0.6"), TTL: 60, Shared: true}},
		[]Record{{Name: testAPI, Type: typeA, Addrs: addrs("10.0.0.5"), TTL: 60, Shared: true}},
	), []string{
		"-api.internal.prod.example.test. A 60 10.0.0.5,10.0.0.7",
		"+api.internal.prod.example.test. A 60 10.0.0.6,10.0.0.7",
	}},
}

func TestCloudDNS(t *testing.T) {
	f, svc := newFakeCloudDNS(t, "ya29.kiln")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p := &CloudDNS{Service: svc, Project: f.project, Zone: "example.test"} // managed zone found by DNS name
	runProviderSteps(t, cloudDNSSteps, func(recs []Record) error { return p.Upsert(ctx, recs) }, f.numChanges, f.lastChange)
	if got, err := p.Lookup(ctx, testEtcd); err != nil || !sameAddrs(got, addrs("10.0.0.6", "fd00::5")) {
		t.Errorf("Lookup = %v, %v", got, err)
	}
	if got, err := p.Lookup(ctx, "nothing.example.test"); err != nil || len(got) != 0 {
		t.Errorf("Lookup(nothing) = %v, %v", got, err)
	}

	t.Run("errors", func(t *testing.T) {
		srv := httptest.NewServer(f)
		defer srv.Close()
		cases := []struct {
			name string
			p    *CloudDNS
			want string
		}{
			{"bad token", &CloudDNS{Service: f.service(t, srv.URL, "expired"), Project: f.project, ManagedZone: f.zoneName}, "401"},
			{"unknown zone", &CloudDNS{Service: svc, Project: f.project, Zone: "example.org"}, "project kiln-proj has no managed zone for example.org"},
			{"unknown managed zone", &CloudDNS{Service: svc, Project: f.project, ManagedZone: "nope"}, "404"},
		}
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) { checkUpsertRefused(t, ctx, c.p, c.p.Zone, c.want) })
		}
	})
}
