package qemutests

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"

	gdns "google.golang.org/api/dns/v1"
)

// fakeCloudDNS answers the Cloud DNS v1 API for one managed zone as Cloud DNS does: a
// bearer token is required (401 otherwise); changes.create applies all or nothing, a
// deletion that does not match the current set exactly refused with 412 conditionNotMet
// and an addition of an existing set with 409 alreadyExists.
type fakeCloudDNS struct {
	project, zoneName, dnsName, token string

	mu      sync.Mutex
	sets    map[string]*gdns.ResourceRecordSet // "name type"
	changes int
	refused []string
}

func (f *fakeCloudDNS) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r.Header.Get("Authorization") != "Bearer "+f.token {
		f.refused = append(f.refused, r.Method+" "+r.URL.Path)
		gceFail(w, http.StatusUnauthorized, "Request had invalid authentication credentials.", "authError")
		return
	}
	zones := "/dns/v1/projects/" + f.project + "/managedZones"
	zone := zones + "/" + f.zoneName
	q := r.URL.Query()
	switch {
	case r.Method == http.MethodGet && r.URL.Path == zones:
		var list []*gdns.ManagedZone
		if q.Get("dnsName") == "" || q.Get("dnsName") == f.dnsName {
			list = append(list, &gdns.ManagedZone{Kind: "dns#managedZone", Name: f.zoneName, DnsName: f.dnsName, Visibility: "private"})
		}
		gceJSON(w, &gdns.ManagedZonesListResponse{ManagedZones: list})
	case r.Method == http.MethodGet && r.URL.Path == zone+"/rrsets":
		var list []*gdns.ResourceRecordSet
		for _, s := range f.sets {
			if (q.Get("name") == "" || s.Name == q.Get("name")) && (q.Get("type") == "" || s.Type == q.Get("type")) {
				list = append(list, s)
			}
		}
		slices.SortFunc(list, func(a, b *gdns.ResourceRecordSet) int { return strings.Compare(a.Name+a.Type, b.Name+b.Type) })
		gceJSON(w, &gdns.ResourceRecordSetsListResponse{Rrsets: list})
	case r.Method == http.MethodPost && r.URL.Path == zone+"/changes":
		f.create(w, r)
	case strings.HasPrefix(r.URL.Path, zones+"/"):
		gceFail(w, http.StatusNotFound, "The 'parameters.managedZone' resource named '"+strings.Split(strings.TrimPrefix(r.URL.Path, zones+"/"), "/")[0]+"' does not exist.", "notFound")
	default:
		gceFail(w, http.StatusNotFound, "Not Found", "notFound")
	}
}

func (f *fakeCloudDNS) create(w http.ResponseWriter, r *http.Request) {
	var c gdns.Change
	if err := json.NewDecoder(r.Body).Decode(&c); err != nil {
		gceFail(w, http.StatusBadRequest, "Invalid JSON payload received. "+err.Error(), "parseError")
		return
	}
	sets := map[string]*gdns.ResourceRecordSet{}
	for k, v := range f.sets {
		sets[k] = v
	}
	for _, d := range c.Deletions {
		cur, ok := sets[d.Name+" "+d.Type]
		if !ok || cur.Ttl != d.Ttl || !slices.Equal(cur.Rrdatas, d.Rrdatas) {
			gceFail(w, http.StatusPreconditionFailed, fmt.Sprintf("Precondition not met for 'entity.change.deletions[%s][%s]'", d.Name, d.Type), "conditionNotMet")
			return
		}
		delete(sets, d.Name+" "+d.Type)
	}
	for _, a := range c.Additions {
		if _, ok := sets[a.Name+" "+a.Type]; ok {
			gceFail(w, http.StatusConflict, fmt.Sprintf("The resource 'entity.change.additions[%s][%s]' named '%s (%s)' already exists", a.Name, a.Type, a.Name, a.Type), "alreadyExists")
			return
		}
		if err := checkCloudDNSSet(a, f.dnsName); err != nil {
			gceFail(w, http.StatusBadRequest, err.Error(), "invalid")
			return
		}
		sets[a.Name+" "+a.Type] = a
	}
	f.sets, f.changes = sets, f.changes+1
	c.Id, c.Status, c.Kind, c.StartTime = fmt.Sprint(f.changes), "pending", "dns#change", "2026-01-01T00:00:00.000Z"
	gceJSON(w, &c)
}

func checkCloudDNSSet(s *gdns.ResourceRecordSet, zone string) error {
	if !strings.HasSuffix(s.Name, "."+zone) || s.Ttl <= 0 || len(s.Rrdatas) == 0 || (s.Type != "A" && s.Type != "AAAA") {
		return fmt.Errorf("Invalid value for 'entity.change.additions[%s][%s]'", s.Name, s.Type)
	}
	for _, v := range s.Rrdatas {
		if a, err := netip.ParseAddr(v); err != nil || a.Is4() != (s.Type == "A") {
			return fmt.Errorf("Invalid value for 'entity.change.additions[%s][%s].rrdata': '%s'", s.Name, s.Type, v)
		}
	}
	return nil
}

// records returns name's values of type typ ("" when none).
func (f *fakeCloudDNS) records(name, typ string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if s := f.sets[name+" "+typ]; s != nil {
		return strings.Join(s.Rrdatas, " ")
	}
	return ""
}
