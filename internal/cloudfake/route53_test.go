package cloudfake

import (
	"context"
	"net/http/httptest"
	"slices"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/route53"
	"github.com/aws/aws-sdk-go-v2/service/route53/types"
)

func route53Client(srv *httptest.Server, creds AWSCredentials) *route53.Client {
	return route53.New(route53.Options{
		Region:       "us-east-1",
		Credentials:  credentials.NewStaticCredentialsProvider(creds.AccessKeyID, creds.SecretAccessKey, creds.SessionToken),
		BaseEndpoint: aws.String(srv.URL),
		HTTPClient:   srv.Client(),
		Retryer:      aws.NopRetryer{},
	})
}

func aSet(name string, addrs ...string) *types.ResourceRecordSet {
	s := &types.ResourceRecordSet{Name: aws.String(name), Type: types.RRTypeA, TTL: aws.Int64(60)}
	for _, a := range addrs {
		s.ResourceRecords = append(s.ResourceRecords, types.ResourceRecord{Value: aws.String(a)})
	}
	return s
}

// TestRoute53 drives the Route 53 fake with the SDK's client: zones found by name, change
// batches applied all or nothing, record sets listed in Route 53's order a page at a time,
// changes PENDING and then INSYNC; a request signed with another secret is refused.
func TestRoute53(t *testing.T) {
	f := &Route53{Creds: roleCreds, ZoneID: "Z0KILN", Zone: "kiln.test.", PendingPolls: 1}
	srv := httptest.NewServer(f)
	defer srv.Close()
	ctx := context.Background()
	c := route53Client(srv, roleCreds)

	for _, tt := range []struct {
		name  string
		found bool
	}{{"kiln.test.", true}, {"example.org.", true}, {"zzz.test.", false}} {
		out, err := c.ListHostedZonesByName(ctx, &route53.ListHostedZonesByNameInput{DNSName: aws.String(tt.name), MaxItems: aws.Int32(1)})
		if err != nil || (len(out.HostedZones) == 1) != tt.found {
			t.Errorf("ListHostedZonesByName(%s) = %+v, %v; want the zone listed: %v", tt.name, out, err, tt.found)
		}
	}

	change := func(changes ...types.Change) (*route53.ChangeResourceRecordSetsOutput, error) {
		return c.ChangeResourceRecordSets(ctx, &route53.ChangeResourceRecordSetsInput{HostedZoneId: aws.String(f.ZoneID),
			ChangeBatch: &types.ChangeBatch{Changes: changes}})
	}
	out, err := change(types.Change{Action: types.ChangeActionCreate, ResourceRecordSet: aSet("b.kiln.test.", "10.0.0.2", "10.0.0.5")},
		types.Change{Action: types.ChangeActionUpsert, ResourceRecordSet: aSet("a.kiln.test.", "10.0.0.1")},
		types.Change{Action: types.ChangeActionUpsert, ResourceRecordSet: aSet("www.a.kiln.test.", "10.0.0.3")})
	if err != nil {
		t.Fatalf("ChangeResourceRecordSets: %v", err)
	}
	var statuses []types.ChangeStatus
	for range 2 {
		got, err := c.GetChange(ctx, &route53.GetChangeInput{Id: out.ChangeInfo.Id})
		if err != nil {
			t.Fatalf("GetChange: %v", err)
		}
		statuses = append(statuses, got.ChangeInfo.Status)
	}
	if !slices.Equal(statuses, []types.ChangeStatus{types.ChangeStatusPending, types.ChangeStatusInsync}) {
		t.Errorf("change statuses %q, want PENDING, INSYNC", statuses)
	}

	// Route 53's order: a.kiln.test. < www.a.kiln.test. < b.kiln.test. (labels reversed).
	var names, values []string
	in := &route53.ListResourceRecordSetsInput{HostedZoneId: aws.String(f.ZoneID), StartRecordName: aws.String("a.kiln.test."), MaxItems: aws.Int32(2)}
	for {
		page, err := c.ListResourceRecordSets(ctx, in)
		if err != nil {
			t.Fatalf("ListResourceRecordSets: %v", err)
		}
		for _, s := range page.ResourceRecordSets {
			names = append(names, aws.ToString(s.Name))
			for _, r := range s.ResourceRecords {
				values = append(values, aws.ToString(r.Value))
			}
		}
		if !page.IsTruncated {
			break
		}
		in.StartRecordName, in.StartRecordType = page.NextRecordName, page.NextRecordType
	}
	if want := []string{"a.kiln.test.", "www.a.kiln.test.", "b.kiln.test."}; !slices.Equal(names, want) {
		t.Errorf("listed %q, want %q", names, want)
	}
	if want := []string{"10.0.0.1", "10.0.0.3", "10.0.0.2", "10.0.0.5"}; !slices.Equal(values, want) {
		t.Errorf("listed values %q, want %q", values, want)
	}

	// A DELETE that does not match fails the whole batch.
	_, err = change(types.Change{Action: types.ChangeActionUpsert, ResourceRecordSet: aSet("c.kiln.test.", "10.0.0.4")},
		types.Change{Action: types.ChangeActionDelete, ResourceRecordSet: aSet("a.kiln.test.", "10.0.0.9")})
	if errorCode(err) != "InvalidChangeBatch" || f.Records("c.kiln.test.", "A") != nil {
		t.Errorf("a batch with a wrong DELETE: %v, c = %q", err, f.Records("c.kiln.test.", "A"))
	}
	checkRefused(t, f.Refused(), "")

	_, err = route53Client(srv, AWSCredentials{AccessKeyID: roleCreds.AccessKeyID, SecretAccessKey: "guess", SessionToken: roleCreds.SessionToken}).
		ListHostedZonesByName(ctx, &route53.ListHostedZonesByNameInput{})
	if errorCode(err) != "SignatureDoesNotMatch" {
		t.Errorf("signed with another secret: %v", err)
	}
	checkRefused(t, f.Refused(), "signature does not match")
	if got := f.Records("a.kiln.test.", "A"); !slices.Equal(got, []string{"10.0.0.1"}) || len(f.Batches()) != 1 {
		t.Errorf("a = %q after %d batches", got, len(f.Batches()))
	}
}
