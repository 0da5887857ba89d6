package gce

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kilnproject/kiln/initd/cloud"
	"github.com/kilnproject/kiln/initd/config"
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
	tok, err := newMetadataToken(newMetadataClient("", nil)).token(context.Background())
	if err != nil || tok != "ya29.kiln" {
		t.Errorf("token = %q, %v", tok, err)
	}
}

// TestCloudClients: the clients Cloud gives call node.yaml's endpoints with the service
// account's token from the metadata server as a bearer token (the fakes take nothing
// else), in the project the metadata server names.
func TestCloudClients(t *testing.T) {
	md := &cloudfake.GCEMetadata{ID: "1", Name: gceMe, Zone: gceZone, Project: gceProject, Token: gceToken}
	gceMetadata(t, md)
	cdns := &cloudfake.CloudDNS{Token: gceToken, Project: gceProject, ZoneName: "prod-zone", DNSName: "example.test."}
	comp := newFakeCompute(nil, map[string]*cloudfake.GCEDisk{"prod-etcd-b": {Users: []string{"cp-old"}}})
	dnsSrv, compSrv := cloudfake.Serve(t, cdns), cloudfake.Serve(t, comp)
	n := &config.Node{
		DNS: config.DNS{Provider: config.DNSCloudDNS, Zone: "example.test"},
		GCE: config.GCE{Endpoints: config.GCEEndpoints{Compute: compSrv.URL + "/compute/v1/", DNS: dnsSrv.URL + "/"}},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	p, err := (Cloud{}).DNS(ctx, n)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := p.Lookup(ctx, "api.example.test"); err != nil || len(got) != 0 {
		t.Errorf("Lookup = %v, %v", got, err)
	}
	if name := p.Name(); name != "clouddns "+gceProject+" zone example.test" {
		t.Errorf("provider %q; want the metadata server's project", name)
	}

	v := &config.Volume{GCEName: "prod-etcd-b"}
	in := cloud.Instance{Cloud: "gce", Project: gceProject, Zone: gceZone, InstanceName: gceMe}
	finder, err := (Cloud{}).EtcdVolume(ctx, n, v, in, quiet)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := finder.Find(ctx); err == nil || !strings.Contains(err.Error(), "instances/cp-old") {
		t.Errorf("Find = %v; want the disk found attached to cp-old", err)
	}
	if calls := comp.Calls(); len(calls) != 1 || calls[0].Path != "disks/prod-etcd-b" {
		t.Errorf("compute calls %+v; want disks.get", calls)
	}
	// Each client asks for the token once and keeps it for its later calls.
	tokens := 0
	for _, c := range md.Calls() {
		if strings.HasSuffix(c, "/"+tokenPath) {
			tokens++
		}
	}
	if tokens != 2 {
		t.Errorf("token asked %d times; want once for each of the two clients", tokens)
	}
}

// TestCloudNoDNS: another dns.provider is not Cloud DNS's.
func TestCloudNoDNS(t *testing.T) {
	p, err := (Cloud{}).DNS(context.Background(), &config.Node{DNS: config.DNS{Provider: config.DNSRoute53}})
	if p != nil || err != nil {
		t.Errorf("DNS = %v, %v; want none", p, err)
	}
}
