package qemutests

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kilnproject/kiln/initd/dns"
	"github.com/kilnproject/kiln/initd/firstboot"
	"github.com/kilnproject/kiln/internal/cloudfake"
)

// The cloud fakes the cloud boots use (internal/cloudfake, whose own tests cover what each
// refuses) speak to the node's own clients as the clouds would, without a VM: `kiln-init
// dns` (firstboot.RegisterDNS) on this host takes the instance role's credentials from the
// IMDS fake and writes through the Route 53 fake, or takes the service account's token
// from the metadata fake and writes through the Cloud DNS fake. The fakes accept nothing
// else, so the records landing proves the credential chains.
func TestCloudFakesWithTheNodesClients(t *testing.T) {
	t.Run("route53", func(t *testing.T) {
		imds := &cloudfake.IMDS{InstanceID: "i-0kiln", AZ: "eu-west-1a", Hostname: "ip-10-0-0-1", Role: "kiln-node", Creds: roleCreds}
		r53 := &cloudfake.Route53{Creds: roleCreds, ZoneID: "Z0KILNTEST0001", Zone: "kiln.test."}
		imdsURL, r53URL := httptest.NewServer(imds), httptest.NewServer(r53)
		defer imdsURL.Close()
		defer r53URL.Close()
		clearAWSEnv(t)
		root := nodeRoot(t, "{provider: route53}", "aws: {route53HostedZoneId: Z0KILNTEST0001, endpoints: {imds: \""+imdsURL.URL+"\", route53: \""+r53URL.URL+"\"}}")
		st := registerDNS(t, root)
		noRefusals(t, "IMDS", imds.Refused())
		noRefusals(t, "Route 53", r53.Refused())
		if got, want := strings.Join(r53.Records("etcd-a.internal.demo.kiln.test.", "A"), " "), registered(st, "etcd-a.", "A"); got != want {
			t.Errorf("Route 53 etcd-a = %q, want %s", got, want)
		}
	})
	t.Run("clouddns", func(t *testing.T) {
		md := &cloudfake.GCEMetadata{Project: "kiln-test", Zone: "europe-west4-b", Name: "cp-a", ID: "1", Hostname: "cp-a.c.kiln-test.internal", Token: "ya29.kiln"}
		cdns := &cloudfake.CloudDNS{Token: "ya29.kiln", Project: "kiln-test", ZoneName: "kiln-test", DNSName: "kiln.test."}
		mdURL, dnsURL := httptest.NewServer(md), httptest.NewServer(cdns)
		defer mdURL.Close()
		defer dnsURL.Close()
		t.Setenv("GCE_METADATA_HOST", mdURL.Listener.Addr().String())
		root := nodeRoot(t, "{provider: clouddns}", "gce: {endpoints: {dns: \""+dnsURL.URL+"/\"}}")
		st := registerDNS(t, root)
		noRefusals(t, "metadata server", md.Refused())
		noRefusals(t, "Cloud DNS", cdns.Refused())
		if got, want := strings.Join(cdns.Records("api.internal.demo.kiln.test.", "A"), " "), registered(st, "api.", "A"); got != want {
			t.Errorf("Cloud DNS api = %q, want %s", got, want)
		}
	})
}

// nodeRoot is a node root holding node.yaml for member a of cluster demo.
func nodeRoot(t *testing.T, dns, cloud string) string {
	root := t.TempDir()
	node := "cluster: {name: demo, dnsZone: kiln.test}\nrole: control-plane\ndns: " + dns + "\netcd: {member: a, members: [a]}\n" + cloud + "\n"
	os.MkdirAll(filepath.Join(root, "etc/kiln"), 0o755)
	if err := os.WriteFile(filepath.Join(root, "etc/kiln/node.yaml"), []byte(node), 0o644); err != nil {
		t.Fatal(err)
	}
	return root
}

// registerDNS runs `kiln-init dns` on root and returns what it registered.
func registerDNS(t *testing.T, root string) dns.State {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := firstboot.RegisterDNS(ctx, root, slog.New(slog.DiscardHandler))
	if err != nil || st.State != "registered" || len(st.Records) < 2 {
		t.Fatalf("RegisterDNS = %+v, %v", st, err)
	}
	return st
}

// clearAWSEnv keeps this host's AWS settings out of the SDK's default chain.
func clearAWSEnv(t *testing.T) {
	dir := t.TempDir()
	for _, k := range []string{"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_REGION",
		"AWS_DEFAULT_REGION", "AWS_EC2_METADATA_SERVICE_ENDPOINT", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
		"AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_WEB_IDENTITY_TOKEN_FILE"} {
		t.Setenv(k, "")
	}
	t.Setenv("AWS_CONFIG_FILE", filepath.Join(dir, "config"))
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", filepath.Join(dir, "credentials"))
}

// registered is the address st registered for the name starting with prefix, of type typ.
func registered(st dns.State, prefix, typ string) string {
	for _, r := range st.Records {
		if strings.HasPrefix(r.Name, prefix) && r.Type == typ && len(r.Addrs) > 0 {
			return r.Addrs[0].String()
		}
	}
	return "none"
}
