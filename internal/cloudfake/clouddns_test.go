package cloudfake

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"

	"golang.org/x/oauth2"
	gdns "google.golang.org/api/dns/v1"
	"google.golang.org/api/option"
)

func dnsService(t *testing.T, srv *httptest.Server, token string) *gdns.Service {
	svc, err := gdns.NewService(context.Background(), option.WithEndpoint(srv.URL+"/"),
		option.WithHTTPClient(oauth2.NewClient(context.Background(), oauth2.StaticTokenSource(&oauth2.Token{AccessToken: token}))))
	if err != nil {
		t.Fatal(err)
	}
	return svc
}

// TestCloudDNS drives the Cloud DNS fake with Google's client: the managed zone found by
// its DNS name, a change applied and its sets listed; a change whose deletion does not
// match fails whole with 412, and a request with another token is refused.
func TestCloudDNS(t *testing.T) {
	f := &CloudDNS{Token: gceToken, Project: gceProject, ZoneName: "kiln", DNSName: "kiln.test."}
	srv := httptest.NewServer(f)
	defer srv.Close()
	ctx := context.Background()
	svc := dnsService(t, srv, gceToken)

	zones, err := svc.ManagedZones.List(gceProject).DnsName("kiln.test.").Context(ctx).Do()
	if err != nil || len(zones.ManagedZones) != 1 || zones.ManagedZones[0].Name != "kiln" {
		t.Fatalf("ManagedZones.List = %+v, %v", zones, err)
	}
	a := &gdns.ResourceRecordSet{Name: "a.kiln.test.", Type: "A", Ttl: 60, Rrdatas: []string{"10.0.0.1"}}
	if _, err := svc.Changes.Create(gceProject, "kiln", &gdns.Change{Additions: []*gdns.ResourceRecordSet{a}}).Context(ctx).Do(); err != nil {
		t.Fatalf("Changes.Create: %v", err)
	}
	sets, err := svc.ResourceRecordSets.List(gceProject, "kiln").Name("a.kiln.test.").Type("A").Context(ctx).Do()
	if err != nil || len(sets.Rrsets) != 1 || !slices.Equal(sets.Rrsets[0].Rrdatas, []string{"10.0.0.1"}) {
		t.Errorf("ResourceRecordSets.List = %+v, %v", sets, err)
	}
	stale := &gdns.ResourceRecordSet{Name: "a.kiln.test.", Type: "A", Ttl: 60, Rrdatas: []string{"10.0.0.9"}}
	b := &gdns.ResourceRecordSet{Name: "b.kiln.test.", Type: "A", Ttl: 60, Rrdatas: []string{"10.0.0.2"}}
	_, err = svc.Changes.Create(gceProject, "kiln", &gdns.Change{Deletions: []*gdns.ResourceRecordSet{stale}, Additions: []*gdns.ResourceRecordSet{b}}).Context(ctx).Do()
	if status, reason := apiCode(err); status != http.StatusPreconditionFailed || reason != "conditionNotMet" || f.Records("b.kiln.test.", "A") != nil {
		t.Errorf("a change with a stale deletion: %v; b = %q", err, f.Records("b.kiln.test.", "A"))
	}
	checkRefused(t, f.Refused(), "")

	tests := []struct {
		name        string
		token       string
		change      *gdns.Change
		wantStatus  int
		wantReason  string
		wantRefused string
	}{
		{"another token", "ya29.other", &gdns.Change{Additions: []*gdns.ResourceRecordSet{b}}, http.StatusUnauthorized, "authError", "another bearer token"},
		{"an address of the wrong family", gceToken, &gdns.Change{Additions: []*gdns.ResourceRecordSet{{Name: "c.kiln.test.", Type: "A", Ttl: 60, Rrdatas: []string{"fd00::1"}}}},
			http.StatusBadRequest, "invalidRecordData", "rrdata"},
		{"a name outside the zone", gceToken, &gdns.Change{Additions: []*gdns.ResourceRecordSet{{Name: "c.example.org.", Type: "A", Ttl: 60, Rrdatas: []string{"10.0.0.3"}}}},
			http.StatusBadRequest, "invalid", "c.example.org."},
		{"an empty change", gceToken, &gdns.Change{}, http.StatusBadRequest, "required", "empty change"},
		{"an existing set added", gceToken, &gdns.Change{Additions: []*gdns.ResourceRecordSet{a}}, http.StatusConflict, "alreadyExists", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &CloudDNS{Token: gceToken, Project: gceProject, ZoneName: "kiln", DNSName: "kiln.test.",
				Sets: map[string]*gdns.ResourceRecordSet{"a.kiln.test. A": a}}
			srv := httptest.NewServer(f)
			defer srv.Close()
			_, err := dnsService(t, srv, tt.token).Changes.Create(gceProject, "kiln", tt.change).Do()
			if status, reason := apiCode(err); status != tt.wantStatus || reason != tt.wantReason {
				t.Errorf("answered %v, want %d %s", err, tt.wantStatus, tt.wantReason)
			}
			checkRefused(t, f.Refused(), tt.wantRefused)
			if len(f.Changes()) != 0 {
				t.Errorf("changes applied: %+v", f.Changes())
			}
		})
	}
}
