package firstboot

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/kilnproject/kiln/initd/config"
	"github.com/kilnproject/kiln/initd/source"
)

// imdsV2 is an IMDSv2-only metadata service: a GET without the session token a PUT
// handed out is refused with 401, as on an instance that requires IMDSv2.
func imdsV2(t *testing.T, meta map[string]string) *httptest.Server {
	const token = "kiln-imds-token"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut && r.URL.Path == "/latest/api/token" {
			ttl := r.Header.Get("X-aws-ec2-metadata-token-ttl-seconds")
			if ttl == "" {
				http.Error(w, "", http.StatusBadRequest)
				return
			}
			w.Header().Set("X-aws-ec2-metadata-token-ttl-seconds", ttl)
			w.Write([]byte(token))
			return
		}
		if r.Header.Get("X-aws-ec2-metadata-token") != token {
			http.Error(w, "", http.StatusUnauthorized)
			return
		}
		v, ok := meta[strings.TrimPrefix(r.URL.Path, "/latest/meta-data/")]
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Write([]byte(v))
	}))
	t.Cleanup(srv.Close)
	return srv
}

var ec2Meta = map[string]string{
	"instance-id":                 "i-0123456789abcdef0",
	"placement/availability-zone": "eu-west-1b",
	"local-hostname":              "ip-10-0-1-5.eu-west-1.compute.internal",
}

func TestReadEC2Instance(t *testing.T) {
	srv := imdsV2(t, ec2Meta)
	in, err := readEC2Instance(context.Background(), srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	if in.Platform.Name != "aws" || in.InstanceID != "i-0123456789abcdef0" || in.Zone != "eu-west-1b" || in.Hostname != "ip-10-0-1-5" {
		t.Errorf("instance = %+v", in)
	}
	// No local-hostname (resource-name hostnames, IPv6-only subnets): no platform hostname.
	noName := imdsV2(t, map[string]string{"instance-id": "i-1", "placement/availability-zone": "eu-west-1b"})
	if in, err := readEC2Instance(context.Background(), noName.URL); err != nil || in.Hostname != "" || in.InstanceID != "i-1" {
		t.Errorf("without local-hostname: %+v, %v", in, err)
	}
	noZone := imdsV2(t, map[string]string{"instance-id": "i-1"})
	if _, err := readEC2Instance(context.Background(), noZone.URL); err == nil || !strings.Contains(err.Error(), "placement/availability-zone") {
		t.Errorf("without a zone: %v", err)
	}
}

// gceMetadata is a GCE metadata server: requests without Metadata-Flavor: Google are
// refused with 403, answers carry the header.
func gceMetadata(t *testing.T, meta map[string]string) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Metadata-Flavor", "Google")
		if r.Header.Get("Metadata-Flavor") != "Google" {
			http.Error(w, "Missing Metadata-Flavor:Google header.", http.StatusForbidden)
			return
		}
		v, ok := meta[strings.TrimPrefix(r.URL.Path, "/computeMetadata/v1/")]
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Write([]byte(v))
	}))
	t.Cleanup(srv.Close)
	t.Setenv("GCE_METADATA_HOST", srv.Listener.Addr().String())
}

func TestReadGCEInstance(t *testing.T) {
	gceMetadata(t, map[string]string{
		"instance/id":        "4520031799277581759",
		"instance/name":      "cp-a",
		"instance/zone":      "projects/123456789/zones/europe-west4-b",
		"project/project-id": "kiln-prod",
		"instance/hostname":  "cp-a.europe-west4-b.c.kiln-prod.internal",
		"instance/service-accounts/default/token": `{"access_token":"ya29.kiln","expires_in":3599,"token_type":"Bearer"}`,
	})
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
	srv := imdsV2(t, ec2Meta)
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
