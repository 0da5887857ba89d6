package aws

import (
	"bytes"
	"context"
	"encoding/xml"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
)

// The Route 53 REST-XML API (version 2013-04-01), of the calls the DNS provider makes:
// ListHostedZonesByName, ListResourceRecordSets, ChangeResourceRecordSets and GetChange.

// route53APIPath is the path of the API version the requests are made in.
const route53APIPath = "/2013-04-01"

// HostedZone is a hosted zone as ListHostedZonesByName lists it.
type HostedZone struct {
	// ID is the zone's id with its /hostedzone/ prefix, Name its name with the final dot.
	ID   string `xml:"Id"`
	Name string `xml:"Name"`
}

// ResourceRecordSet is a record set, as Route 53 lists it and as a change names it. Its
// fields are those a simple-routing set can have: a DELETE must name the set exactly as
// it is. SetIdentifier is "" for a simple-routing set.
type ResourceRecordSet struct {
	Name          string `xml:"Name"`
	Type          string `xml:"Type"`
	SetIdentifier string `xml:"SetIdentifier,omitempty"`
	TTL           *int64 `xml:"TTL,omitempty"`
	// ResourceRecords is written, empty, also when nil (an alias set's): the sets the
	// provider sends always carry addresses.
	ResourceRecords []ResourceRecord `xml:"ResourceRecords>ResourceRecord"`
	AliasTarget     *AliasTarget     `xml:"AliasTarget,omitempty"`
	HealthCheckID   string           `xml:"HealthCheckId,omitempty"`
	// TrafficPolicyInstanceID names the traffic policy instance that made the set.
	TrafficPolicyInstanceID string `xml:"TrafficPolicyInstanceId,omitempty"`
}

// ResourceRecord is a value of a record set.
type ResourceRecord struct {
	Value string `xml:"Value"`
}

// AliasTarget is what an alias record set points to.
type AliasTarget struct {
	HostedZoneID         string `xml:"HostedZoneId"`
	DNSName              string `xml:"DNSName"`
	EvaluateTargetHealth bool   `xml:"EvaluateTargetHealth"`
}

// Change is one change of a change batch: Action (CREATE, DELETE, UPSERT) on Set.
type Change struct {
	Action string            `xml:"Action"`
	Set    ResourceRecordSet `xml:"ResourceRecordSet"`
}

// ChangeInfo is a change batch's state: ID (/change/C…) and Status (PENDING, INSYNC).
type ChangeInfo struct {
	ID     string `xml:"Id"`
	Status string `xml:"Status"`
}

// The status of a change that all of Route 53's servers apply.
const changeInsync = "INSYNC"

// RecordSetPage is a page of ListResourceRecordSets: the sets, and where the next page
// starts when IsTruncated.
type RecordSetPage struct {
	Sets                 []ResourceRecordSet `xml:"ResourceRecordSets>ResourceRecordSet"`
	IsTruncated          bool                `xml:"IsTruncated"`
	NextRecordName       string              `xml:"NextRecordName"`
	NextRecordType       string              `xml:"NextRecordType"`
	NextRecordIdentifier string              `xml:"NextRecordIdentifier"`
}

// RecordSetStart is where ListResourceRecordSets starts: the name, then (when set) the
// type and the set identifier.
type RecordSetStart struct {
	Name, Type, Identifier string
}

// Route53Client calls the Route 53 API.
type Route53Client struct {
	api *apiClient
}

// newRoute53Client returns a client of the Route 53 API at endpoint, signing for region
// with creds.
func newRoute53Client(endpoint, region string, creds credentialSource) (*Route53Client, error) {
	api, err := newAPIClient("Route 53", "route53", region, endpoint, creds, decodeRoute53Error)
	if err != nil {
		return nil, err
	}
	return &Route53Client{api: api}, nil
}

// call sends op and decodes the answer into out.
func (c *Route53Client) call(ctx context.Context, op string, r apiRequest, out any) error {
	r.op, r.path = op, route53APIPath+r.path
	body, err := c.api.do(ctx, r)
	if err != nil {
		return err
	}
	if err := xml.Unmarshal(body, out); err != nil {
		return fmt.Errorf("Route 53 %s: decode answer: %w", op, err)
	}
	return nil
}

// zonePath is the path of hosted zone id, with or without its /hostedzone/ prefix.
func zonePath(id string) string {
	return "/hostedzone/" + url.PathEscape(strings.TrimPrefix(id, "/hostedzone/"))
}

// ListHostedZonesByName lists up to maxItems hosted zones from dnsName on, in Route 53's
// order.
func (c *Route53Client) ListHostedZonesByName(ctx context.Context, dnsName string, maxItems int) ([]HostedZone, error) {
	var out struct {
		HostedZones []HostedZone `xml:"HostedZones>HostedZone"`
	}
	q := url.Values{"dnsname": {dnsName}, "maxitems": {strconv.Itoa(maxItems)}}
	err := c.call(ctx, "ListHostedZonesByName", apiRequest{method: http.MethodGet, path: "/hostedzonesbyname", query: q}, &out)
	return out.HostedZones, err
}

// ListResourceRecordSets lists up to maxItems record sets of hosted zone zoneID from
// start on, in Route 53's order.
func (c *Route53Client) ListResourceRecordSets(ctx context.Context, zoneID string, start RecordSetStart, maxItems int) (RecordSetPage, error) {
	q := url.Values{"maxitems": {strconv.Itoa(maxItems)}}
	for k, v := range map[string]string{"name": start.Name, "type": start.Type, "identifier": start.Identifier} {
		if v != "" {
			q.Set(k, v)
		}
	}
	var out RecordSetPage
	err := c.call(ctx, "ListResourceRecordSets", apiRequest{method: http.MethodGet, path: zonePath(zoneID) + "/rrset", query: q}, &out)
	return out, err
}

// ChangeResourceRecordSets applies changes to hosted zone zoneID as one batch, all or
// nothing.
func (c *Route53Client) ChangeResourceRecordSets(ctx context.Context, zoneID, comment string, changes []Change) (ChangeInfo, error) {
	in := struct {
		XMLName xml.Name `xml:"https://route53.amazonaws.com/doc/2013-04-01/ ChangeResourceRecordSetsRequest"`
		Comment string   `xml:"ChangeBatch>Comment,omitempty"`
		Changes []Change `xml:"ChangeBatch>Changes>Change"`
	}{Comment: comment, Changes: changes}
	var body bytes.Buffer
	body.WriteString(xml.Header)
	if err := xml.NewEncoder(&body).Encode(in); err != nil {
		return ChangeInfo{}, fmt.Errorf("Route 53 ChangeResourceRecordSets: %w", err)
	}
	var out struct {
		ChangeInfo ChangeInfo `xml:"ChangeInfo"`
	}
	err := c.call(ctx, "ChangeResourceRecordSets", apiRequest{method: http.MethodPost, path: zonePath(zoneID) + "/rrset",
		contentType: "application/xml", body: body.Bytes()}, &out)
	return out.ChangeInfo, err
}

// GetChange returns the state of change id, with or without its /change/ prefix.
func (c *Route53Client) GetChange(ctx context.Context, id string) (ChangeInfo, error) {
	var out struct {
		ChangeInfo ChangeInfo `xml:"ChangeInfo"`
	}
	path := "/change/" + url.PathEscape(strings.TrimPrefix(id, "/change/"))
	err := c.call(ctx, "GetChange", apiRequest{method: http.MethodGet, path: path}, &out)
	return out.ChangeInfo, err
}

// decodeRoute53Error reads Route 53's error answer:
// <ErrorResponse><Error><Type>…</Type><Code>…</Code><Message>…</Message></Error><RequestId>…,
// or, for a refused change batch, <InvalidChangeBatch><Messages><Message>…, whose code is
// its root element's name and whose message is its messages.
func decodeRoute53Error(body []byte, e *APIError) {
	var doc struct {
		XMLName xml.Name
		Error   struct {
			Code    string `xml:"Code"`
			Message string `xml:"Message"`
		} `xml:"Error"`
		Messages  []string `xml:"Messages>Message"`
		Message   string   `xml:"Message"`
		RequestID string   `xml:"RequestId"`
	}
	if xml.Unmarshal(body, &doc) != nil {
		return
	}
	e.RequestID = doc.RequestID
	if doc.XMLName.Local == "ErrorResponse" {
		e.Code, e.Message = doc.Error.Code, doc.Error.Message
		return
	}
	e.Code = doc.XMLName.Local
	msgs := doc.Messages
	if doc.Message != "" {
		msgs = append(msgs, doc.Message)
	}
	e.Message = strings.Join(msgs, "; ")
}
