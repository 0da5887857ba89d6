package cloudfake

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"

	gdns "google.golang.org/api/dns/v1"
)

// CloudDNS is a fake of the Cloud DNS v1 API for one managed zone of A and AAAA record
// sets, as Cloud DNS answers it. A request must carry Token as its bearer token (else
// 401) and name a method of the fake (else 404): managedZones.list, resourceRecordSets.list
// and changes.create. A change applies all or nothing: a deletion that does not match the
// current set exactly fails it with 412 conditionNotMet, an addition of a set that exists
// after the deletions with 409 alreadyExists; a change that is empty, malformed, or adds
// a set outside the zone, without a TTL or with data not of its type is refused with 400.
type CloudDNS struct {
	// Token is the bearer token requests must carry.
	Token string
	// Project is the project, ZoneName the managed zone's name and DNSName its DNS name
	// with the trailing dot.
	Project, ZoneName, DNSName string
	// Sets are the zone's record sets by name and type ("www.example.test. A").
	Sets map[string]*gdns.ResourceRecordSet

	// Mutex guards the fake's state: a test holds it to read or change Sets while the
	// fake serves.
	sync.Mutex
	changes []*gdns.Change
	refused []string
}

// Changes returns the changes the fake applied, in order.
func (f *CloudDNS) Changes() []*gdns.Change {
	f.Lock()
	defer f.Unlock()
	return slices.Clone(f.changes)
}

// Refused returns the requests the fake refused, each with the reason.
func (f *CloudDNS) Refused() []string {
	f.Lock()
	defer f.Unlock()
	return slices.Clone(f.refused)
}

// Records returns the data of the record set of name (with the trailing dot) and typ,
// none when there is no such set.
func (f *CloudDNS) Records(name, typ string) []string {
	f.Lock()
	defer f.Unlock()
	if s := f.Sets[name+" "+typ]; s != nil {
		return slices.Clone(s.Rrdatas)
	}
	return nil
}

// ServeHTTP implements http.Handler.
func (f *CloudDNS) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.Lock()
	defer f.Unlock()
	refuse := func(status int, msg, reason, why string) {
		f.refused = append(f.refused, refusal(r, why))
		googleError(w, status, msg, reason)
	}
	if got := r.Header.Get("Authorization"); got != "Bearer "+f.Token {
		refuse(http.StatusUnauthorized, "Request had invalid authentication credentials. Expected OAuth 2 access token, login cookie or other valid authentication credential.",
			"authError", bearerRefusal(got))
		return
	}
	zones := "/dns/v1/projects/" + f.Project + "/managedZones"
	zone := zones + "/" + f.ZoneName
	q := r.URL.Query()
	switch {
	case r.Method == http.MethodGet && r.URL.Path == zones:
		var list []*gdns.ManagedZone
		if q.Get("dnsName") == "" || strings.EqualFold(q.Get("dnsName"), f.DNSName) {
			list = append(list, &gdns.ManagedZone{Kind: "dns#managedZone", Name: f.ZoneName, DnsName: f.DNSName, Visibility: "private"})
		}
		googleJSON(w, &gdns.ManagedZonesListResponse{Kind: "dns#managedZonesListResponse", ManagedZones: list})
	case r.Method == http.MethodGet && r.URL.Path == zone+"/rrsets":
		if q.Has("type") && !q.Has("name") {
			refuse(http.StatusBadRequest, "The 'parameters.type' requires 'parameters.name'.", "invalid", "rrsets.list with a type and no name")
			return
		}
		var list []*gdns.ResourceRecordSet
		for _, k := range slices.Sorted(maps.Keys(f.Sets)) {
			if s := f.Sets[k]; (!q.Has("name") || strings.EqualFold(s.Name, q.Get("name"))) && (!q.Has("type") || s.Type == q.Get("type")) {
				list = append(list, s)
			}
		}
		googleJSON(w, &gdns.ResourceRecordSetsListResponse{Kind: "dns#resourceRecordSetsListResponse", Rrsets: list})
	case r.Method == http.MethodPost && r.URL.Path == zone+"/changes":
		var c gdns.Change
		if err := json.NewDecoder(r.Body).Decode(&c); err != nil {
			refuse(http.StatusBadRequest, "Invalid JSON payload received. "+err.Error(), "parseError", "change: "+err.Error())
			return
		}
		if len(c.Additions)+len(c.Deletions) == 0 {
			refuse(http.StatusBadRequest, "The 'entity.change' resource must contain additions or deletions.", "required", "empty change")
			return
		}
		for _, a := range c.Additions {
			if reason, err := f.checkAddition(a); err != nil {
				refuse(http.StatusBadRequest, err.Error(), reason, err.Error())
				return
			}
		}
		f.create(w, &c)
	case strings.HasPrefix(r.URL.Path, zones+"/"):
		name, _, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, zones+"/"), "/")
		if name != f.ZoneName {
			googleError(w, http.StatusNotFound, "The 'parameters.managedZone' resource named '"+name+"' does not exist.", "notFound")
			return
		}
		refuse(http.StatusNotFound, "Not Found", "notFound", "not a method of the fake")
	default:
		refuse(http.StatusNotFound, "Not Found", "notFound", "not a method of the fake")
	}
}

// checkAddition checks a set a change adds as Cloud DNS does, and returns the reason it
// gives for a set it refuses.
func (f *CloudDNS) checkAddition(s *gdns.ResourceRecordSet) (string, error) {
	if !strings.HasSuffix(strings.ToLower(s.Name), "."+strings.ToLower(f.DNSName)) || s.Ttl <= 0 || len(s.Rrdatas) == 0 || (s.Type != "A" && s.Type != "AAAA") {
		return "invalid", fmt.Errorf("Invalid value for 'entity.change.additions[%s][%s]'", s.Name, s.Type)
	}
	for _, v := range s.Rrdatas {
		if a, err := netip.ParseAddr(v); err != nil || a.Is4() != (s.Type == "A") {
			return "invalidRecordData", fmt.Errorf("Invalid value for 'entity.change.additions[%s][%s].rrdata': '%s'", s.Name, s.Type, v)
		}
	}
	return "", nil
}

// create applies change c all or nothing.
func (f *CloudDNS) create(w http.ResponseWriter, c *gdns.Change) {
	sets := maps.Clone(f.Sets)
	if sets == nil {
		sets = map[string]*gdns.ResourceRecordSet{}
	}
	for _, d := range c.Deletions {
		cur, ok := sets[d.Name+" "+d.Type]
		if !ok || cur.Ttl != d.Ttl || !slices.Equal(cur.Rrdatas, d.Rrdatas) {
			googleError(w, http.StatusPreconditionFailed, fmt.Sprintf("Precondition not met for 'entity.change.deletions[%s][%s]'", d.Name, d.Type), "conditionNotMet")
			return
		}
		delete(sets, d.Name+" "+d.Type)
	}
	for _, a := range c.Additions {
		if _, ok := sets[a.Name+" "+a.Type]; ok {
			googleError(w, http.StatusConflict, fmt.Sprintf("The resource 'entity.change.additions[%s][%s]' named '%s (%s)' already exists", a.Name, a.Type, a.Name, a.Type), "alreadyExists")
			return
		}
		a.Kind = "dns#resourceRecordSet"
		sets[a.Name+" "+a.Type] = a
	}
	f.Sets = sets
	c.Id, c.Status, c.Kind, c.StartTime = fmt.Sprint(len(f.changes)+1), "pending", "dns#change", "2026-01-01T00:00:00.000Z"
	f.changes = append(f.changes, c)
	googleJSON(w, c)
}
