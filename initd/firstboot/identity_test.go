package firstboot

import (
	"context"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/kilnproject/kiln/initd/config"
	"github.com/kilnproject/kiln/initd/source"
	"github.com/kilnproject/kiln/internal/cloudfake"
)

// imdsV2 serves f, the metadata service of an instance that requires IMDSv2, for the test,
// and fails the test at its end if f refused a request.
func imdsV2(t *testing.T, f *cloudfake.IMDS) *httptest.Server {
	srv := httptest.NewServer(f)
	t.Cleanup(func() {
		srv.Close()
		if refused := f.Refused(); len(refused) > 0 {
			t.Errorf("requests IMDS refuses: %q", refused)
		}
	})
	return srv
}

// ec2Instance is the EC2 instance the tests run on.
func ec2Instance() *cloudfake.IMDS {
	return &cloudfake.IMDS{InstanceID: "i-0123456789abcdef0", AZ: "eu-west-1b", Hostname: "ip-10-0-1-5.eu-west-1.compute.internal"}
}

func TestReadEC2Instance(t *testing.T) {
	srv := imdsV2(t, ec2Instance())
	in, err := readEC2Instance(context.Background(), srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	if in.Platform.Name != "aws" || in.InstanceID != "i-0123456789abcdef0" || in.Zone != "eu-west-1b" || in.Hostname != "ip-10-0-1-5" {
		t.Errorf("instance = %+v", in)
	}
	// No local-hostname (resource-name hostnames, IPv6-only subnets): no platform hostname.
	noName := imdsV2(t, &cloudfake.IMDS{InstanceID: "i-1", AZ: "eu-west-1b"})
	if in, err := readEC2Instance(context.Background(), noName.URL); err != nil || in.Hostname != "" || in.InstanceID != "i-1" {
		t.Errorf("without local-hostname: %+v, %v", in, err)
	}
	noZone := imdsV2(t, &cloudfake.IMDS{InstanceID: "i-1"})
	if _, err := readEC2Instance(context.Background(), noZone.URL); err == nil || !strings.Contains(err.Error(), "placement/availability-zone") {
		t.Errorf("without a zone: %v", err)
	}
}

// gceMetadata serves f, a GCE metadata server, as the one the metadata client asks for the
// test, and fails the test at its end if f refused a request.
func gceMetadata(t *testing.T, f *cloudfake.GCEMetadata) {
	srv := httptest.NewServer(f)
	t.Cleanup(func() {
		srv.Close()
		if refused := f.Refused(); len(refused) > 0 {
			t.Errorf("requests the metadata server refuses: %q", refused)
		}
	})
	t.Setenv("GCE_METADATA_HOST", srv.Listener.Addr().String())
}

func TestReadGCEInstance(t *testing.T) {
	gceMetadata(t, &cloudfake.GCEMetadata{ID: "4520031799277581759", Name: "cp-a", Zone: "europe-west4-b", Project: "kiln-prod",
		Hostname: "cp-a.europe-west4-b.c.kiln-prod.internal", Token: "ya29.kiln"})
	in, err := readGCEInstance(context.Background(), source.GCEMetadataClient())
	if err != nil {
		t.Fatal(err)
	}
	want := instance{InstanceName: "cp-a", Project: "kiln-prod"}
	want.Platform.Name, want.InstanceID, want.Zone, want.Hostname = "gce", "4520031799277581759", "europe-west4-b", "cp-a"
	if in != want {
		t.Errorf("instance = %+v, want %+v", in, want)
	}
	tok, err := metadataToken{source.GCEMetadataClient()}.Token()
	if err != nil || tok.AccessToken != "ya29.kiln" || tok.Type() != "Bearer" {
		t.Errorf("token = %+v, %v", tok, err)
	}
}

// On aws the facts carry the instance's identity and its hostname from IMDS, unless the
// node config names the node.
func TestFactsFromPlatform(t *testing.T) {
	srv := imdsV2(t, ec2Instance())
	for _, tc := range []struct{ hostname, want, source string }{
		{"", "ip-10-0-1-5", "platform"},
		{"cp-1", "cp-1", "config"},
	} {
		n := &config.Node{Role: config.RoleWorker, Hostname: tc.hostname}
		n.AWS.Endpoints.IMDS = srv.URL
		p := &plan{opts: withDefaults(Options{Root: t.TempDir(), Facts: fakeMachine(t, func() []netip.Prefix {
			return []netip.Prefix{netip.MustParsePrefix("10.0.1.5/24")}
		})}), node: n, platform: "aws"}
		if _, err := p.gatherFacts(context.Background()); err != nil {
			t.Fatal(err)
		}
		f := p.facts
		if f.Hostname != tc.want || f.HostnameSource != tc.source || f.Platform != "aws" ||
			f.InstanceID != "i-0123456789abcdef0" || f.Zone != "eu-west-1b" || f.Region != "eu-west-1" {
			t.Errorf("hostname %q: facts = %+v", tc.hostname, f)
		}
	}
}
