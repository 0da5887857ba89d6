package cloudfake

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/smithy-go"
)

// roleCreds are an instance role's temporary credentials, which the AWS fakes of these
// tests accept.
var roleCreds = AWSCredentials{AccessKeyID: "ASIAKILNTESTROLE0001", SecretAccessKey: "kiln-role-secret", SessionToken: "kiln-session-token"}

// newEC2Fake is an EC2 fake in eu-west-1 with instance i-0me in eu-west-1a and two
// volumes there, one tagged for etcd member a.
func newEC2Fake() *EC2 {
	return &EC2{Creds: roleCreds, Region: "eu-west-1", Instances: map[string]string{"i-0me": "eu-west-1a"}, Volumes: []*EC2Volume{
		{ID: "vol-0a", AZ: "eu-west-1a", State: "available", Tags: map[string]string{"k8s.io/etcd/main": "a/a", "kubernetes.io/cluster/demo": "owned"}},
		{ID: "vol-0data", AZ: "eu-west-1a", State: "available", Tags: map[string]string{"team": "infra"}},
	}}
}

// ec2Client is an SDK client of srv signed with creds for region, which does not retry.
func ec2Client(srv *httptest.Server, creds AWSCredentials, region string) *ec2.Client {
	return ec2.New(ec2.Options{
		Region:       region,
		Credentials:  credentials.NewStaticCredentialsProvider(creds.AccessKeyID, creds.SecretAccessKey, creds.SessionToken),
		BaseEndpoint: aws.String(srv.URL),
		HTTPClient:   srv.Client(),
		Retryer:      aws.NopRetryer{},
	})
}

// errorCode is the AWS error code of err, "" for none.
func errorCode(err error) string {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		return ae.ErrorCode()
	}
	return ""
}

// TestEC2 drives the EC2 fake with the SDK's client: requests EC2 takes are answered, and
// requests it refuses are refused with EC2's error code and recorded.
func TestEC2(t *testing.T) {
	etcd := &ec2.DescribeVolumesInput{Filters: []types.Filter{
		{Name: aws.String("availability-zone"), Values: []string{"eu-west-1a"}},
		{Name: aws.String("tag:kubernetes.io/cluster/demo"), Values: []string{"owned"}},
		{Name: aws.String("tag-key"), Values: []string{"k8s.io/etcd/main"}},
	}}
	tests := []struct {
		name        string
		creds       AWSCredentials
		region      string
		in          *ec2.DescribeVolumesInput
		wantVolumes []string
		wantCode    string // the error's code; "" for none
		wantRefused string // what the refusal names; "" for no refusal
	}{
		{name: "filtered on zone and tags", in: etcd, wantVolumes: []string{"vol-0a"}},
		{name: "by id", in: &ec2.DescribeVolumesInput{VolumeIds: []string{"vol-0data"}}, wantVolumes: []string{"vol-0data"}},
		{name: "another secret", creds: AWSCredentials{AccessKeyID: roleCreds.AccessKeyID, SecretAccessKey: "guess", SessionToken: roleCreds.SessionToken},
			in: etcd, wantCode: "AuthFailure", wantRefused: "signature does not match"},
		{name: "no session token", creds: AWSCredentials{AccessKeyID: roleCreds.AccessKeyID, SecretAccessKey: roleCreds.SecretAccessKey},
			in: etcd, wantCode: "AuthFailure", wantRefused: "X-Amz-Security-Token"},
		{name: "another region", region: "us-east-1", in: etcd, wantCode: "AuthFailure", wantRefused: "signed for region us-east-1"},
		{name: "a filter EC2 does not know", in: &ec2.DescribeVolumesInput{Filters: []types.Filter{{Name: aws.String("colour"), Values: []string{"red"}}}},
			wantCode: "InvalidParameterValue", wantRefused: "The filter 'colour' is invalid"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newEC2Fake()
			srv := httptest.NewServer(f)
			defer srv.Close()
			creds, region := tt.creds, tt.region
			if creds == (AWSCredentials{}) {
				creds = roleCreds
			}
			if region == "" {
				region = f.Region
			}
			out, err := ec2Client(srv, creds, region).DescribeVolumes(context.Background(), tt.in)
			if errorCode(err) != tt.wantCode || (tt.wantCode == "") != (err == nil) {
				t.Fatalf("DescribeVolumes: %v; want error code %q", err, tt.wantCode)
			}
			if err == nil {
				var got []string
				for _, v := range out.Volumes {
					got = append(got, aws.ToString(v.VolumeId))
				}
				if !slices.Equal(got, tt.wantVolumes) {
					t.Errorf("volumes %q, want %q", got, tt.wantVolumes)
				}
			}
			checkRefused(t, f.Refused(), tt.wantRefused)
		})
	}
	t.Run("unsigned", func(t *testing.T) {
		f := newEC2Fake()
		srv := httptest.NewServer(f)
		defer srv.Close()
		checkStatus(t, srv.URL+"/?Action=DescribeVolumes&Version=2016-11-15", "POST", nil, http.StatusUnauthorized)
		checkRefused(t, f.Refused(), "is not SigV4")
	})
}

// checkRefused fails t unless refused is empty (want "") or holds one refusal naming want.
func checkRefused(t *testing.T, refused []string, want string) {
	t.Helper()
	if want == "" && len(refused) > 0 || want != "" && (len(refused) != 1 || !strings.Contains(refused[0], want)) {
		t.Errorf("refused %q, want %q", refused, want)
	}
}

// TestEC2Attach: AttachVolume answers attaching, runs Attach, and DescribeVolumes reports
// the attachment attached once Attach is done and SettleLooks answers have shown it
// attaching; what EC2 refuses to attach, it refuses with EC2's code.
func TestEC2Attach(t *testing.T) {
	f := newEC2Fake()
	f.SettleLooks = 1
	plugged := make(chan string, 1)
	f.Attach = func(id, device string) error { plugged <- id + " " + device; return nil }
	srv := httptest.NewServer(f)
	defer srv.Close()
	ctx := context.Background()
	c := ec2Client(srv, roleCreds, f.Region)
	attach := func(vol, instance, device string) error {
		_, err := c.AttachVolume(ctx, &ec2.AttachVolumeInput{VolumeId: aws.String(vol), InstanceId: aws.String(instance), Device: aws.String(device)})
		return err
	}
	if err := attach("vol-0a", "i-0me", "/dev/xvdu"); err != nil {
		t.Fatalf("AttachVolume: %v", err)
	}
	if got := <-plugged; got != "vol-0a /dev/xvdu" {
		t.Errorf("Attach(%s)", got)
	}
	var states []string
	for range 2 {
		out, err := c.DescribeVolumes(ctx, &ec2.DescribeVolumesInput{Filters: []types.Filter{
			{Name: aws.String("attachment.instance-id"), Values: []string{"i-0me"}}}})
		if err != nil || len(out.Volumes) != 1 || len(out.Volumes[0].Attachments) != 1 {
			t.Fatalf("DescribeVolumes = %+v, %v", out, err)
		}
		states = append(states, string(out.Volumes[0].Attachments[0].State))
	}
	if !slices.Equal(states, []string{"attaching", "attached"}) {
		t.Errorf("attachment states %q, want attaching, attached", states)
	}
	for _, tt := range []struct{ vol, instance, device, wantCode string }{
		{"vol-0a", "i-0me", "/dev/xvdv", "VolumeInUse"},
		{"vol-0data", "i-0me", "/dev/xvdu", "InvalidParameterValue"}, // the device name is taken
		{"vol-0data", "i-0other", "/dev/xvdv", "InvalidInstanceID.NotFound"},
		{"vol-0none", "i-0me", "/dev/xvdv", "InvalidVolume.NotFound"},
	} {
		if err := attach(tt.vol, tt.instance, tt.device); errorCode(err) != tt.wantCode {
			t.Errorf("AttachVolume(%s, %s, %s) = %v, want %s", tt.vol, tt.instance, tt.device, err, tt.wantCode)
		}
	}
	checkRefused(t, f.Refused(), "")
	if calls := f.Calls(); len(calls) != 7 || calls[0].Action != "AttachVolume" || calls[0].Instance != "i-0me" ||
		!slices.Equal(calls[1].Filters, []string{"attachment.instance-id=i-0me"}) {
		t.Errorf("calls %+v", calls)
	}
}
