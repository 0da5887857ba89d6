package cloudfake

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"cloud.google.com/go/compute/metadata"
)

func newGCEMetadataFake() *GCEMetadata {
	return &GCEMetadata{Attributes: map[string]string{"user-data": "{}"}, Project: "kiln-test", Zone: "europe-west4-b", Name: "cp-a",
		ID: "4520031799277581759", Hostname: "cp-a.europe-west4-b.c.kiln-test.internal", ServiceAccount: "cp@kiln-test.iam.gserviceaccount.com", Token: "ya29.kiln"}
}

// TestGCEMetadata drives the metadata fake with Google's metadata client, as the node
// does, and checks that a request without Metadata-Flavor: Google is refused.
func TestGCEMetadata(t *testing.T) {
	f := newGCEMetadataFake()
	srv := httptest.NewServer(f)
	defer srv.Close()
	t.Setenv("GCE_METADATA_HOST", srv.Listener.Addr().String())
	ctx := context.Background()
	c := metadata.NewClient(srv.Client())
	for path, want := range map[string]string{
		"instance/attributes/user-data": "{}", "instance/id": f.ID, "instance/name": "cp-a",
		"instance/zone": "projects/123456789012/zones/europe-west4-b", "project/project-id": "kiln-test",
		"instance/service-accounts/default/email": f.ServiceAccount,
	} {
		if got, err := c.GetWithContext(ctx, path); err != nil || got != want {
			t.Errorf("Get(%s) = %q, %v; want %q", path, got, err, want)
		}
	}
	raw, err := c.GetWithContext(ctx, "instance/service-accounts/default/token")
	var tok struct {
		AccessToken string `json:"access_token"`
	}
	if err != nil || json.Unmarshal([]byte(raw), &tok) != nil || tok.AccessToken != f.Token {
		t.Errorf("token = %q, %v", raw, err)
	}
	if _, err := c.InstanceAttributeValueWithContext(ctx, "ssh-keys"); err == nil {
		t.Error("an attribute the instance does not have was answered")
	}
	checkRefused(t, f.Refused(), "")

	checkStatus(t, srv.URL+"/computeMetadata/v1/instance/id", "GET", nil, http.StatusForbidden)
	checkRefused(t, f.Refused(), "no Metadata-Flavor")
}

// TestGCEMetadataRefuses: what the metadata server refuses is refused and recorded.
func TestGCEMetadataRefuses(t *testing.T) {
	tests := []struct {
		name        string
		method      string
		header      map[string]string
		want        int
		wantRefused string
	}{
		{"without Metadata-Flavor", "GET", nil, http.StatusForbidden, "Metadata-Flavor"},
		{"through a proxy", "GET", map[string]string{"Metadata-Flavor": "Google", "X-Forwarded-For": "10.0.0.9"}, http.StatusForbidden, "X-Forwarded-For"},
		{"POST", "POST", map[string]string{"Metadata-Flavor": "Google"}, http.StatusMethodNotAllowed, "method"},
		{"with Metadata-Flavor", "GET", map[string]string{"Metadata-Flavor": "Google"}, http.StatusOK, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newGCEMetadataFake()
			srv := httptest.NewServer(f)
			defer srv.Close()
			checkStatus(t, srv.URL+"/computeMetadata/v1/instance/id", tt.method, tt.header, tt.want)
			checkRefused(t, f.Refused(), tt.wantRefused)
		})
	}
}
