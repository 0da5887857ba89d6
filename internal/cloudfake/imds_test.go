package cloudfake

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials/ec2rolecreds"
	"github.com/aws/aws-sdk-go-v2/feature/ec2/imds"
)

func newIMDSFake() *IMDS {
	return &IMDS{UserData: []byte("#cloud-config\n"), InstanceID: "i-0kiln", AZ: "eu-west-1a", Hostname: "ip-10-0-0-1.eu-west-1.compute.internal",
		Role: "kiln-node", Creds: roleCreds}
}

// TestIMDS drives the IMDS fake with the SDK's IMDSv2 client, as the node does: the user
// data, the instance's metadata, region and role credentials come with a session token.
func TestIMDS(t *testing.T) {
	f := newIMDSFake()
	srv := httptest.NewServer(f)
	defer srv.Close()
	ctx := context.Background()
	c := imds.New(imds.Options{Endpoint: srv.URL, EnableFallback: aws.FalseTernary})
	read := func(rc io.ReadCloser) string {
		defer rc.Close()
		b, _ := io.ReadAll(rc)
		return string(b)
	}
	ud, err := c.GetUserData(ctx, &imds.GetUserDataInput{})
	if err != nil || read(ud.Content) != string(f.UserData) {
		t.Fatalf("GetUserData: %v", err)
	}
	for path, want := range map[string]string{"instance-id": f.InstanceID, "placement/availability-zone": f.AZ, "local-hostname": f.Hostname} {
		out, err := c.GetMetadata(ctx, &imds.GetMetadataInput{Path: path})
		if err != nil || read(out.Content) != want {
			t.Errorf("GetMetadata(%s): %v; want %q", path, err, want)
		}
	}
	if out, err := c.GetRegion(ctx, &imds.GetRegionInput{}); err != nil || out.Region != "eu-west-1" {
		t.Errorf("GetRegion = %+v, %v", out, err)
	}
	if doc, err := c.GetInstanceIdentityDocument(ctx, &imds.GetInstanceIdentityDocumentInput{}); err != nil || doc.InstanceID != f.InstanceID || doc.Region != "eu-west-1" {
		t.Errorf("GetInstanceIdentityDocument = %+v, %v", doc, err)
	}
	creds, err := ec2rolecreds.New(func(o *ec2rolecreds.Options) { o.Client = c }).Retrieve(ctx)
	if err != nil || creds.AccessKeyID != roleCreds.AccessKeyID || creds.SessionToken != roleCreds.SessionToken {
		t.Errorf("role credentials = %+v, %v", creds, err)
	}
	checkRefused(t, f.Refused(), "")
	if calls := f.Calls(); calls[0] != "PUT /latest/api/token" || !slices.Contains(calls, "GET /latest/meta-data/iam/security-credentials/kiln-node") {
		t.Errorf("calls %q", calls)
	}
}

// TestIMDSRefuses: what IMDS with IMDSv2 required refuses is refused and recorded; a
// service without IMDSv2 grants no token, so the SDK's IMDSv2-only client reads nothing.
func TestIMDSRefuses(t *testing.T) {
	tests := []struct {
		name        string
		method      string
		path        string
		header      map[string]string
		want        int
		wantRefused string
	}{
		{"IMDSv1 GET", "GET", "/latest/meta-data/instance-id", nil, http.StatusUnauthorized, "no valid session token"},
		{"made-up token", "GET", "/latest/meta-data/instance-id", map[string]string{"X-aws-ec2-metadata-token": "guess"}, http.StatusUnauthorized, "no valid session token"},
		{"token through a proxy", "PUT", "/latest/api/token", map[string]string{"X-aws-ec2-metadata-token-ttl-seconds": "60", "X-Forwarded-For": "10.0.0.9"}, http.StatusForbidden, "X-Forwarded-For"},
		{"token without a TTL", "PUT", "/latest/api/token", nil, http.StatusBadRequest, "TTL"},
		{"token for a day", "PUT", "/latest/api/token", map[string]string{"X-aws-ec2-metadata-token-ttl-seconds": "86400"}, http.StatusBadRequest, "TTL"},
		{"POST", "POST", "/latest/user-data", nil, http.StatusMethodNotAllowed, "method"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newIMDSFake()
			srv := httptest.NewServer(f)
			defer srv.Close()
			checkStatus(t, srv.URL+tt.path, tt.method, tt.header, tt.want)
			checkRefused(t, f.Refused(), tt.wantRefused)
		})
	}
	t.Run("no IMDSv2", func(t *testing.T) {
		f := newIMDSFake()
		f.V1Only = true
		srv := httptest.NewServer(f)
		defer srv.Close()
		c := imds.New(imds.Options{Endpoint: srv.URL, EnableFallback: aws.FalseTernary})
		if _, err := c.GetUserData(context.Background(), &imds.GetUserDataInput{}); err == nil {
			t.Error("GetUserData without a session token succeeded")
		}
		checkStatus(t, srv.URL+"/latest/meta-data/instance-id", "GET", nil, http.StatusOK)
	})
}

// checkStatus sends a request with header and fails t unless it is answered with want.
func checkStatus(t *testing.T, url, method string, header map[string]string, want int) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != want {
		t.Errorf("%s %s: %s, want %d", method, url, resp.Status, want)
	}
}
