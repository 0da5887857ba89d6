package gce

import (
	"context"
	"testing"

	"github.com/kilnproject/kiln/initd/cloud"
	"github.com/kilnproject/kiln/internal/cloudfake"
)

// gceMetadata serves f, a GCE metadata server, as the one the metadata client asks for the
// test, and fails the test at its end if f refused a request.
func gceMetadata(t *testing.T, f *cloudfake.GCEMetadata) {
	srv := cloudfake.Serve(t, f)
	t.Setenv("GCE_METADATA_HOST", srv.Listener.Addr().String())
}

// TestIdentify: the instance's identity from the metadata server, the hostname without
// GCE's domain, and the service account's token.
func TestIdentify(t *testing.T) {
	gceMetadata(t, &cloudfake.GCEMetadata{ID: "4520031799277581759", Name: "cp-a", Zone: "europe-west4-b", Project: "kiln-prod",
		Hostname: "cp-a.europe-west4-b.c.kiln-prod.internal", Token: "ya29.kiln"})
	in, err := (Cloud{}).Identify(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	want := cloud.Instance{Cloud: "gce", InstanceID: "4520031799277581759", Zone: "europe-west4-b", Hostname: "cp-a",
		InstanceName: "cp-a", Project: "kiln-prod"}
	if in != want {
		t.Errorf("instance = %+v, want %+v", in, want)
	}
	tok, err := metadataToken{MetadataClient()}.Token()
	if err != nil || tok.AccessToken != "ya29.kiln" || tok.Type() != "Bearer" {
		t.Errorf("token = %+v, %v", tok, err)
	}
}
