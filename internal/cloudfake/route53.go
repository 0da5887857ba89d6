package cloudfake

import (
	"cmp"
	"encoding/xml"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
)

const route53NS = "https://route53.amazonaws.com/doc/2013-04-01/"

// Route53 is a fake of the Route 53 REST-XML API for one hosted zone of A and AAAA record
// sets, as Route 53 answers it. It accepts requests signed (SigV4) with Creds for route53
// and refuses others with SignatureDoesNotMatch, a change batch that is not Route 53's
// XML with MalformedXML and an operation it does not know with UnknownOperationException.
// It lists hosted zones by name and record
// sets in Route 53's order (names with their labels reversed, then types), MaxItems at a
// time. It checks a change batch (names inside the zone, A and AAAA sets with a TTL and
// addresses of their type) and applies it all or nothing: a CREATE of an existing set or a
// DELETE that does not match the set exactly fails the batch with InvalidChangeBatch. A
// change is PENDING for PendingPolls GetChange answers, then INSYNC.
type Route53 struct {
	// Creds are the credentials requests must be signed with.
	Creds AWSCredentials
	// ZoneID is the hosted zone's id (without /hostedzone/), Zone its name with the
	// trailing dot.
	ZoneID, Zone string
	// Sets are the zone's record sets by name and type ("www.example.test. A").
	Sets map[string]Route53RecordSet
	// PendingPolls is how many GetChange answers report a change PENDING before INSYNC.
	PendingPolls int
	// BeforeChange, when set, runs before the fake applies a change batch: the place for
	// another node to change the sets between a client's read and its change.
	BeforeChange func(f *Route53)

	// Mutex guards the fake's state: a test holds it to read or change Sets, PendingPolls and BeforeChange while the
	// fake serves.
	sync.Mutex
	batches [][]Route53Change
	pending map[string]int // change id → PENDING answers left
	calls   []string
	refused []string
}

// Route53RecordSet is a record set of the Route 53 fake.
type Route53RecordSet struct {
	Name, Type string
	TTL        *int64
	Values     []string
}

// Route53Change is one change of a batch the Route 53 fake applied.
type Route53Change struct {
	Action string
	Set    Route53RecordSet
}

// route53XMLSet is a record set as the API's XML has it.
type route53XMLSet struct {
	XMLName xml.Name `xml:"ResourceRecordSet"`
	Name    string   `xml:"Name"`
	Type    string   `xml:"Type"`
	TTL     *int64   `xml:"TTL"`
	Records []struct {
		Value string `xml:"Value"`
	} `xml:"ResourceRecords>ResourceRecord"`
}

func (x route53XMLSet) set() Route53RecordSet {
	s := Route53RecordSet{Name: x.Name, Type: x.Type, TTL: x.TTL}
	for _, r := range x.Records {
		s.Values = append(s.Values, r.Value)
	}
	return s
}

func (s Route53RecordSet) xml() route53XMLSet {
	x := route53XMLSet{Name: s.Name, Type: s.Type, TTL: s.TTL}
	for _, v := range s.Values {
		x.Records = append(x.Records, struct {
			Value string `xml:"Value"`
		}{v})
	}
	return x
}

// Calls returns the operations the fake took, in order: ListHostedZonesByName,
// ListResourceRecordSets, ChangeResourceRecordSets, GetChange.
func (f *Route53) Calls() []string {
	f.Lock()
	defer f.Unlock()
	return slices.Clone(f.calls)
}

// Refused returns the requests the fake refused, each with the reason.
func (f *Route53) Refused() []string {
	f.Lock()
	defer f.Unlock()
	return slices.Clone(f.refused)
}

// Batches returns the change batches the fake applied, in order.
func (f *Route53) Batches() [][]Route53Change {
	f.Lock()
	defer f.Unlock()
	return slices.Clone(f.batches)
}

// Records returns the values of the record set of name (with the trailing dot) and typ,
// none when there is no such set.
func (f *Route53) Records(name, typ string) []string {
	f.Lock()
	defer f.Unlock()
	return slices.Clone(f.Sets[name+" "+typ].Values)
}

// ServeHTTP implements http.Handler.
func (f *Route53) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	f.Lock()
	defer f.Unlock()
	refuse := func(status int, code, msg, why string) {
		f.refused = append(f.refused, refusal(r, why))
		route53Error(w, status, code, msg)
	}
	if err != nil {
		refuse(http.StatusBadRequest, "InvalidInput", "The request body could not be read.", "read body: "+err.Error())
		return
	}
	if err := checkAWS(r, body, f.Creds, "route53", ""); err != nil {
		refuse(http.StatusForbidden, "SignatureDoesNotMatch", err.Error(), err.Error())
		return
	}
	p := strings.TrimSuffix(strings.TrimPrefix(r.URL.Path, "/2013-04-01/"), "/")
	q := r.URL.Query()
	rrset := "hostedzone/" + f.ZoneID + "/rrset"
	w.Header().Set("Content-Type", "text/xml")
	switch {
	case r.Method == http.MethodGet && p == "hostedzonesbyname":
		f.calls = append(f.calls, "ListHostedZonesByName")
		f.listZones(w, q)
	case r.Method == http.MethodGet && p == rrset:
		if q.Has("type") && !q.Has("name") {
			refuse(http.StatusBadRequest, "InvalidInput", "The input is not valid: type requires name", "ListResourceRecordSets with a type and no name")
			return
		}
		f.calls = append(f.calls, "ListResourceRecordSets")
		f.listSets(w, q)
	case r.Method == http.MethodPost && p == rrset:
		var req struct {
			XMLName xml.Name `xml:"ChangeResourceRecordSetsRequest"`
			Changes []struct {
				Action string        `xml:"Action"`
				Set    route53XMLSet `xml:"ResourceRecordSet"`
			} `xml:"ChangeBatch>Changes>Change"`
		}
		if err := xml.Unmarshal(body, &req); err != nil || req.XMLName.Space != route53NS || len(req.Changes) == 0 {
			why := fmt.Sprintf("change batch: %v (namespace %q, %d changes)", err, req.XMLName.Space, len(req.Changes))
			refuse(http.StatusBadRequest, "MalformedXML", why, why)
			return
		}
		var changes []Route53Change
		for _, c := range req.Changes {
			changes = append(changes, Route53Change{Action: c.Action, Set: c.Set.set()})
		}
		f.calls = append(f.calls, "ChangeResourceRecordSets")
		f.change(w, changes)
	case r.Method == http.MethodGet && strings.HasPrefix(p, "change/"):
		f.calls = append(f.calls, "GetChange")
		f.getChange(w, strings.TrimPrefix(p, "change/"))
	case (r.Method == http.MethodGet || r.Method == http.MethodPost) && strings.HasPrefix(p, "hostedzone/") && strings.Count(p, "/") == 2 && strings.HasSuffix(p, "/rrset"):
		op := "ListResourceRecordSets"
		if r.Method == http.MethodPost {
			op = "ChangeResourceRecordSets"
		}
		f.calls = append(f.calls, op)
		route53Error(w, http.StatusNotFound, "NoSuchHostedZone", "No hosted zone found with ID: "+strings.Split(p, "/")[1])
	default:
		refuse(http.StatusNotFound, "UnknownOperationException", "Unknown operation "+r.Method+" "+r.URL.Path, "not an operation of the fake")
	}
}

// maxItems is the request's maxitems, def when absent, at most limit.
func maxItems(q url.Values, def, limit int) int {
	n, err := strconv.Atoi(q.Get("maxitems"))
	if err != nil || n <= 0 {
		return def
	}
	return min(n, limit)
}

// listZones answers ListHostedZonesByName: the zones from dnsname on, in Route 53's order.
func (f *Route53) listZones(w http.ResponseWriter, q url.Values) {
	dnsName := q.Get("dnsname")
	fmt.Fprintf(w, `<ListHostedZonesByNameResponse xmlns="%s"><HostedZones>`, route53NS)
	if dnsName == "" || reverseLabels(dnsName) <= reverseLabels(f.Zone) {
		fmt.Fprintf(w, `<HostedZone><Id>/hostedzone/%s</Id><Name>%s</Name><CallerReference>kiln</CallerReference><Config><PrivateZone>false</PrivateZone></Config><ResourceRecordSetCount>%d</ResourceRecordSetCount></HostedZone>`,
			f.ZoneID, xmlText(f.Zone), len(f.Sets))
	}
	fmt.Fprintf(w, `</HostedZones>`)
	if dnsName != "" {
		fmt.Fprintf(w, `<DNSName>%s</DNSName>`, xmlText(dnsName))
	}
	fmt.Fprintf(w, `<IsTruncated>false</IsTruncated><MaxItems>%d</MaxItems></ListHostedZonesByNameResponse>`, maxItems(q, 100, 100))
}

// listSets answers ListResourceRecordSets: the sets from (name, type) on, in Route 53's
// order, at most maxitems of them.
func (f *Route53) listSets(w http.ResponseWriter, q url.Values) {
	sets := slices.SortedFunc(maps.Values(f.Sets), func(a, b Route53RecordSet) int {
		return cmp.Or(strings.Compare(reverseLabels(a.Name), reverseLabels(b.Name)), strings.Compare(a.Type, b.Type))
	})
	start, startType := reverseLabels(q.Get("name")), q.Get("type")
	limit := maxItems(q, 300, 300)
	fmt.Fprintf(w, `<ListResourceRecordSetsResponse xmlns="%s"><ResourceRecordSets>`, route53NS)
	n := 0
	var next *Route53RecordSet
	for _, s := range sets {
		if q.Has("name") && cmp.Or(strings.Compare(reverseLabels(s.Name), start), strings.Compare(s.Type, startType)) < 0 {
			continue
		}
		if n == limit {
			next = &s
			break
		}
		b, _ := xml.Marshal(s.xml())
		w.Write(b)
		n++
	}
	fmt.Fprint(w, `</ResourceRecordSets>`)
	if next != nil {
		fmt.Fprintf(w, `<IsTruncated>true</IsTruncated><NextRecordName>%s</NextRecordName><NextRecordType>%s</NextRecordType>`, xmlText(next.Name), next.Type)
	} else {
		fmt.Fprint(w, `<IsTruncated>false</IsTruncated>`)
	}
	fmt.Fprintf(w, `<MaxItems>%d</MaxItems></ListResourceRecordSetsResponse>`, limit)
}

// change applies a change batch all or nothing.
func (f *Route53) change(w http.ResponseWriter, changes []Route53Change) {
	if f.BeforeChange != nil {
		f.BeforeChange(f)
	}
	sets := maps.Clone(f.Sets)
	if sets == nil {
		sets = map[string]Route53RecordSet{}
	}
	var msgs []string
	for _, c := range changes {
		s, key := c.Set, c.Set.Name+" "+c.Set.Type
		if err := f.checkSet(s); err != nil {
			msgs = append(msgs, err.Error())
			continue
		}
		cur, exists := sets[key]
		switch c.Action {
		case "UPSERT":
			sets[key] = s
		case "CREATE":
			if exists {
				msgs = append(msgs, fmt.Sprintf("Tried to create resource record set [name='%s', type='%s'] but it already exists", s.Name, s.Type))
			}
			sets[key] = s
		case "DELETE":
			if !exists || cur.TTL == nil || *cur.TTL != *s.TTL || !slices.Equal(cur.Values, s.Values) {
				msgs = append(msgs, fmt.Sprintf("Tried to delete resource record set [name='%s', type='%s'] but the values provided do not match the current values", s.Name, s.Type))
			}
			delete(sets, key)
		default:
			msgs = append(msgs, "Invalid action "+c.Action)
		}
	}
	if len(msgs) > 0 {
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprintf(w, `<?xml version="1.0"?><InvalidChangeBatch xmlns="%s"><Messages>`, route53NS)
		for _, m := range msgs {
			fmt.Fprintf(w, "<Message>%s</Message>", xmlText(m))
		}
		fmt.Fprint(w, `</Messages><RequestId>r-icb</RequestId></InvalidChangeBatch>`)
		return
	}
	f.Sets = sets
	f.batches = append(f.batches, changes)
	id := fmt.Sprintf("C%d", len(f.batches))
	if f.pending == nil {
		f.pending = map[string]int{}
	}
	f.pending[id] = f.PendingPolls
	fmt.Fprintf(w, `<ChangeResourceRecordSetsResponse xmlns="%s"><ChangeInfo><Id>/change/%s</Id><Status>PENDING</Status><SubmittedAt>2026-01-01T00:00:00Z</SubmittedAt></ChangeInfo></ChangeResourceRecordSetsResponse>`, route53NS, id)
}

// checkSet checks a changed set as Route 53 does.
func (f *Route53) checkSet(s Route53RecordSet) error {
	switch {
	case !strings.HasSuffix(strings.ToLower(s.Name), "."+strings.ToLower(f.Zone)):
		return fmt.Errorf("RRSet with DNS name %s is not permitted in zone %s", s.Name, f.Zone)
	case s.Type != "A" && s.Type != "AAAA":
		return fmt.Errorf("RRSet of type %s: the fake holds A and AAAA sets only", s.Type)
	case s.TTL == nil || len(s.Values) == 0:
		return fmt.Errorf("%s %s: TTL and ResourceRecords are required", s.Name, s.Type)
	}
	for _, v := range s.Values {
		if a, err := netip.ParseAddr(v); err != nil || a.Is4() != (s.Type == "A") {
			if s.Type == "A" {
				return fmt.Errorf("Invalid Resource Record: FATAL problem: ARRDATAIllegalIPv4Address (Value is not a valid IPv4 address) encountered with '%s'", v)
			}
			return fmt.Errorf("Invalid Resource Record: FATAL problem: AAAARRDATAIllegalIPv6Address (Value is not a valid IPv6 address) encountered with '%s'", v)
		}
	}
	return nil
}

// getChange answers GetChange: PENDING while the change has PENDING answers left.
func (f *Route53) getChange(w http.ResponseWriter, id string) {
	left, ok := f.pending[id]
	if !ok {
		route53Error(w, http.StatusNotFound, "NoSuchChange", "A change with the specified change ID does not exist: "+id)
		return
	}
	status := "INSYNC"
	if left > 0 {
		status, f.pending[id] = "PENDING", left-1
	}
	fmt.Fprintf(w, `<GetChangeResponse xmlns="%s"><ChangeInfo><Id>/change/%s</Id><Status>%s</Status><SubmittedAt>2026-01-01T00:00:00Z</SubmittedAt></ChangeInfo></GetChangeResponse>`,
		route53NS, xmlText(id), status)
}

// route53Error answers a Route 53 error as the REST-XML API does.
func route53Error(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "text/xml")
	w.WriteHeader(status)
	fmt.Fprintf(w, `<?xml version="1.0"?><ErrorResponse xmlns="%s"><Error><Type>Sender</Type><Code>%s</Code><Message>%s</Message></Error><RequestId>r-err</RequestId></ErrorResponse>`,
		route53NS, code, xmlText(msg))
}
