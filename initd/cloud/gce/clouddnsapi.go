package gce

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
)

// DNSService is Cloud DNS v1, for the calls CloudDNS makes: managedZones.list,
// resourceRecordSets.list and changes.create.
type DNSService struct{ api *apiClient }

// newDNSService is Cloud DNS at endpoint (its base URL, https://dns.googleapis.com/), with
// tokens' bearer tokens (nil: none).
func newDNSService(endpoint string, tokens tokenSource) (*DNSService, error) {
	api, err := newAPIClient(endpoint, tokens)
	if err != nil {
		return nil, err
	}
	return &DNSService{api: api}, nil
}

// dnsManagedZone is the part of a dns#managedZone that CloudDNS reads.
type dnsManagedZone struct {
	Name    string `json:"name"`
	DNSName string `json:"dnsName"`
}

// dnsManagedZoneList is a page of managedZones.list's answer.
type dnsManagedZoneList struct {
	ManagedZones  []dnsManagedZone `json:"managedZones"`
	NextPageToken string           `json:"nextPageToken"`
}

func (l *dnsManagedZoneList) nextPage() string { return l.NextPageToken }

// dnsRecordSet is a dns#resourceRecordSet. A set read from Cloud DNS keeps the JSON it
// came as and is written back as such, so that a change deletes exactly the set Cloud DNS
// holds (a routing policy, say, included).
type dnsRecordSet struct {
	Name    string   `json:"name"`
	Type    string   `json:"type"`
	TTL     int64    `json:"ttl,omitempty"`
	Rrdatas []string `json:"rrdatas,omitempty"`

	raw json.RawMessage
}

// dnsRecordSetFields is dnsRecordSet without its methods.
type dnsRecordSetFields dnsRecordSet

// UnmarshalJSON implements json.Unmarshaler, keeping the set's JSON.
func (s *dnsRecordSet) UnmarshalJSON(data []byte) error {
	if err := json.Unmarshal(data, (*dnsRecordSetFields)(s)); err != nil {
		return err
	}
	s.raw = append(json.RawMessage(nil), data...)
	return nil
}

// MarshalJSON implements json.Marshaler: the JSON the set was read from, if any.
func (s dnsRecordSet) MarshalJSON() ([]byte, error) {
	if s.raw != nil {
		return s.raw, nil
	}
	return json.Marshal(dnsRecordSetFields(s))
}

// dnsRecordSetList is a page of resourceRecordSets.list's answer.
type dnsRecordSetList struct {
	Rrsets        []dnsRecordSet `json:"rrsets"`
	NextPageToken string         `json:"nextPageToken"`
}

func (l *dnsRecordSetList) nextPage() string { return l.NextPageToken }

// dnsChange is a dns#change: record sets deleted and added, all or nothing.
type dnsChange struct {
	Additions []dnsRecordSet `json:"additions,omitempty"`
	Deletions []dnsRecordSet `json:"deletions,omitempty"`
}

// managedZones is managedZones.list of project's zones named dnsName, every page of it.
func (s *DNSService) managedZones(ctx context.Context, project, dnsName string, each func([]dnsManagedZone)) error {
	return listAll(ctx, s.api, []string{"dns", "v1", "projects", project, "managedZones"}, url.Values{"dnsName": {dnsName}},
		func(l *dnsManagedZoneList) { each(l.ManagedZones) })
}

// recordSets is resourceRecordSets.list of zone's sets named name, of type typ when it
// is not empty, every page of it.
func (s *DNSService) recordSets(ctx context.Context, project, zone, name, typ string, each func([]dnsRecordSet)) error {
	q := url.Values{"name": {name}}
	if typ != "" {
		q.Set("type", typ)
	}
	return listAll(ctx, s.api, []string{"dns", "v1", "projects", project, "managedZones", zone, "rrsets"}, q,
		func(l *dnsRecordSetList) { each(l.Rrsets) })
}

// createChange is changes.create. Another attempt after an answer that was lost is
// refused (the deletions no longer match), not applied twice.
func (s *DNSService) createChange(ctx context.Context, project, zone string, c *dnsChange) error {
	return s.api.call(ctx, http.MethodPost, []string{"dns", "v1", "projects", project, "managedZones", zone, "changes"}, nil, c, nil)
}
