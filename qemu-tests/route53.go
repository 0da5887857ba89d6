package qemutests

import (
	"encoding/xml"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
)

const r53NS = "https://route53.amazonaws.com/doc/2013-04-01/"

type r53Set struct {
	Name    string   `xml:"Name"`
	Type    string   `xml:"Type"`
	TTL     *int64   `xml:"TTL"`
	Records []string `xml:"ResourceRecords>ResourceRecord>Value"`
}

// fakeRoute53 answers the Route 53 REST-XML API for one hosted zone as Route 53 does:
// requests signed with the instance role's credentials only; change batches checked
// (names inside the zone, A/AAAA with valid addresses, a TTL) and applied all or
// nothing, a CREATE of an existing set and a DELETE that does not match the set exactly
// refused with InvalidChangeBatch.
type fakeRoute53 struct {
	creds        roleCreds
	zoneID, zone string // zone with the trailing dot

	mu      sync.Mutex
	sets    map[string]r53Set // "name type"
	batches int
	refused []string
}

func (f *fakeRoute53) fail(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "text/xml")
	w.WriteHeader(status)
	fmt.Fprintf(w, `<?xml version="1.0"?><ErrorResponse xmlns="%s"><Error><Type>Sender</Type><Code>%s</Code><Message>%s</Message></Error><RequestId>r-err</RequestId></ErrorResponse>`, r53NS, code, xmlText(msg))
}

func (f *fakeRoute53) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	_, err := checkSigV4(r, body, f.creds, "route53")
	f.mu.Lock()
	defer f.mu.Unlock()
	if err != nil {
		f.refused = append(f.refused, err.Error())
		f.fail(w, http.StatusForbidden, "SignatureDoesNotMatch", err.Error())
		return
	}
	p := strings.TrimSuffix(strings.TrimPrefix(r.URL.Path, "/2013-04-01/"), "/")
	q := r.URL.Query()
	w.Header().Set("Content-Type", "text/xml")
	switch {
	case r.Method == http.MethodGet && p == "hostedzonesbyname":
		fmt.Fprintf(w, `<ListHostedZonesByNameResponse xmlns="%s"><HostedZones><HostedZone><Id>/hostedzone/%s</Id><Name>%s</Name><CallerReference>kiln</CallerReference></HostedZone></HostedZones><IsTruncated>false</IsTruncated><MaxItems>%s</MaxItems></ListHostedZonesByNameResponse>`,
			r53NS, f.zoneID, f.zone, q.Get("maxitems"))
	case r.Method == http.MethodGet && p == "hostedzone/"+f.zoneID+"/rrset":
		f.list(w, q.Get("name"), q.Get("type"), q.Get("maxitems"))
	case r.Method == http.MethodPost && p == "hostedzone/"+f.zoneID+"/rrset":
		f.change(w, body)
	case r.Method == http.MethodGet && strings.HasPrefix(p, "change/"):
		fmt.Fprintf(w, `<GetChangeResponse xmlns="%s"><ChangeInfo><Id>/%s</Id><Status>INSYNC</Status><SubmittedAt>2026-01-01T00:00:00Z</SubmittedAt></ChangeInfo></GetChangeResponse>`, r53NS, p)
	case strings.HasPrefix(p, "hostedzone/"):
		f.fail(w, http.StatusNotFound, "NoSuchHostedZone", "No hosted zone found with ID: "+strings.Split(p, "/")[1])
	default:
		f.fail(w, http.StatusNotFound, "UnknownOperationException", r.Method+" "+r.URL.Path)
	}
}

// list answers ListResourceRecordSets from (name, type) on, in Route 53's order.
func (f *fakeRoute53) list(w http.ResponseWriter, name, typ, max string) {
	keys := make([]string, 0, len(f.sets))
	for k := range f.sets {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	fmt.Fprintf(w, `<ListResourceRecordSetsResponse xmlns="%s"><ResourceRecordSets>`, r53NS)
	for _, k := range keys {
		if k >= name+" "+typ {
			b, _ := xml.Marshal(struct {
				XMLName xml.Name `xml:"ResourceRecordSet"`
				r53Set
			}{r53Set: f.sets[k]})
			w.Write(b)
		}
	}
	fmt.Fprintf(w, `</ResourceRecordSets><IsTruncated>false</IsTruncated><MaxItems>%s</MaxItems></ListResourceRecordSetsResponse>`, max)
}

func (f *fakeRoute53) change(w http.ResponseWriter, body []byte) {
	var req struct {
		XMLName xml.Name `xml:"ChangeResourceRecordSetsRequest"`
		Changes []struct {
			Action string `xml:"Action"`
			Set    r53Set `xml:"ResourceRecordSet"`
		} `xml:"ChangeBatch>Changes>Change"`
	}
	if err := xml.Unmarshal(body, &req); err != nil || req.XMLName.Space != r53NS || len(req.Changes) == 0 {
		f.fail(w, http.StatusBadRequest, "MalformedXML", fmt.Sprintf("%v (namespace %q, %d changes)", err, req.XMLName.Space, len(req.Changes)))
		return
	}
	sets := map[string]r53Set{}
	for k, v := range f.sets {
		sets[k] = v
	}
	var msgs []string
	for _, c := range req.Changes {
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
			if !exists || *cur.TTL != *s.TTL || !slices.Equal(cur.Records, s.Records) {
				msgs = append(msgs, fmt.Sprintf("Tried to delete resource record set [name='%s', type='%s'] but the values provided do not match the current values", s.Name, s.Type))
			}
			delete(sets, key)
		default:
			msgs = append(msgs, "Invalid action "+c.Action)
		}
	}
	if len(msgs) > 0 {
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprintf(w, `<?xml version="1.0"?><InvalidChangeBatch xmlns="%s"><Messages>`, r53NS)
		for _, m := range msgs {
			fmt.Fprintf(w, "<Message>%s</Message>", xmlText(m))
		}
		fmt.Fprint(w, `</Messages><RequestId>r-icb</RequestId></InvalidChangeBatch>`)
		return
	}
	f.sets, f.batches = sets, f.batches+1
	fmt.Fprintf(w, `<ChangeResourceRecordSetsResponse xmlns="%s"><ChangeInfo><Id>/change/C%d</Id><Status>PENDING</Status><SubmittedAt>2026-01-01T00:00:00Z</SubmittedAt></ChangeInfo></ChangeResourceRecordSetsResponse>`, r53NS, f.batches)
}

func (f *fakeRoute53) checkSet(s r53Set) error {
	switch {
	case !strings.HasSuffix(s.Name, "."+f.zone):
		return fmt.Errorf("RRSet with DNS name %s is not permitted in zone %s", s.Name, f.zone)
	case s.Type != "A" && s.Type != "AAAA":
		return fmt.Errorf("unexpected type %s", s.Type)
	case s.TTL == nil || len(s.Records) == 0:
		return fmt.Errorf("%s %s: TTL and ResourceRecords are required", s.Name, s.Type)
	}
	for _, v := range s.Records {
		a, err := netip.ParseAddr(v)
		if err != nil || a.Is4() != (s.Type == "A") {
			return fmt.Errorf("Invalid Resource Record: FATAL problem: ARRDATAIllegalIPv4Address (Value is not a valid IPv4 address) encountered with '%s'", v)
		}
	}
	return nil
}

// records returns name's values of type typ ("" when none).
func (f *fakeRoute53) records(name, typ string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return strings.Join(f.sets[name+" "+typ].Records, " ")
}
