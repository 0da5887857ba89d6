package qemutests

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	gdns "google.golang.org/api/dns/v1"

	"github.com/kilnproject/kiln/initd/dns"
	"github.com/kilnproject/kiln/initd/firstboot"
)

// The cloud fakes speak to the node's own clients as the clouds would, without a VM:
// `kiln-init dns` (firstboot.RegisterDNS) on this host takes the instance role's
// credentials from the IMDS fake and writes through the Route 53 fake, or takes the
// service account's token from the metadata fake and writes through the Cloud DNS fake.
// The fakes accept nothing else, so the records landing proves the credential chains.
func TestCloudFakesWithTheNodesClients(t *testing.T) {
	t.Run("route53", func(t *testing.T) {
		creds := roleCreds{key: "ASIAKILNTESTROLE0001", secret: "kiln-role-secret", token: "kiln-session-token"}
		imds := &fakeIMDS{instanceID: "i-0kiln", az: "eu-west-1a", hostname: "ip-10-0-0-1", role: "kiln-node", creds: creds}
		r53 := &fakeRoute53{creds: creds, zoneID: "Z0KILNTEST0001", zone: "kiln.test.", sets: map[string]r53Set{}}
		imdsURL, r53URL := httptest.NewServer(imds), httptest.NewServer(r53)
		defer imdsURL.Close()
		defer r53URL.Close()
		clearAWSEnv(t)
		root := nodeRoot(t, "{provider: route53}", "aws: {route53HostedZoneId: Z0KILNTEST0001, endpoints: {imds: \""+imdsURL.URL+"\", route53: \""+r53URL.URL+"\"}}")
		st := registerDNS(t, root)
		noRefusals(t, "IMDS", imds.refused)
		noRefusals(t, "Route 53", r53.refused)
		if got, want := r53.records("etcd-a.internal.demo.kiln.test.", "A"), registered(st, "etcd-a.", "A"); got != want {
			t.Errorf("Route 53 etcd-a = %q, want %s", got, want)
		}
	})
	t.Run("clouddns", func(t *testing.T) {
		md := &fakeGCEMetadata{project: "kiln-test", zone: "europe-west4-b", name: "cp-a", id: "1", hostname: "cp-a.c.kiln-test.internal", token: "ya29.kiln"}
		cdns := &fakeCloudDNS{project: "kiln-test", zoneName: "kiln-test", dnsName: "kiln.test.", token: "ya29.kiln", sets: map[string]*gdns.ResourceRecordSet{}}
		mdURL, dnsURL := httptest.NewServer(md), httptest.NewServer(cdns)
		defer mdURL.Close()
		defer dnsURL.Close()
		t.Setenv("GCE_METADATA_HOST", mdURL.Listener.Addr().String())
		root := nodeRoot(t, "{provider: clouddns}", "gce: {endpoints: {dns: \""+dnsURL.URL+"/\"}}")
		st := registerDNS(t, root)
		noRefusals(t, "metadata server", md.refused)
		noRefusals(t, "Cloud DNS", cdns.refused)
		if got, want := cdns.records("api.internal.demo.kiln.test.", "A"), registered(st, "api.", "A"); got != want {
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

// The fakes refuse what the clouds refuse: IMDSv1 GETs and proxied token requests,
// metadata requests without Metadata-Flavor, API requests without the instance's
// credentials.
func TestCloudFakesRefuse(t *testing.T) {
	creds := roleCreds{key: "ASIAKILNTESTROLE0001", secret: "kiln-role-secret", token: "kiln-session-token"}
	imds := httptest.NewServer(&fakeIMDS{instanceID: "i-0kiln", role: "r", creds: creds})
	defer imds.Close()
	gce := httptest.NewServer(&fakeGCEMetadata{id: "1", token: "ya29.kiln"})
	defer gce.Close()
	ec2 := httptest.NewServer(&fakeEC2{creds: creds, region: "eu-west-1"})
	defer ec2.Close()
	r53 := httptest.NewServer(&fakeRoute53{creds: creds, zoneID: "Z1", zone: "kiln.test."})
	defer r53.Close()
	comp := httptest.NewServer(&fakeCompute{project: "p", zone: "z", token: "ya29.kiln"})
	defer comp.Close()
	cdns := httptest.NewServer(&fakeCloudDNS{project: "p", zoneName: "z", dnsName: "kiln.test.", token: "ya29.kiln"})
	defer cdns.Close()
	for _, tc := range []struct {
		name, method, url string
		header            map[string]string
		want              int
	}{
		{"IMDSv1 GET", "GET", imds.URL + "/latest/meta-data/instance-id", nil, http.StatusUnauthorized},
		{"IMDSv2 GET with a made-up token", "GET", imds.URL + "/latest/meta-data/instance-id", map[string]string{"X-aws-ec2-metadata-token": "guess"}, http.StatusUnauthorized},
		{"IMDS token through a proxy", "PUT", imds.URL + "/latest/api/token", map[string]string{"X-aws-ec2-metadata-token-ttl-seconds": "60", "X-Forwarded-For": "10.0.0.9"}, http.StatusForbidden},
		{"IMDS token without a TTL", "PUT", imds.URL + "/latest/api/token", nil, http.StatusBadRequest},
		{"GCE metadata without Metadata-Flavor", "GET", gce.URL + "/computeMetadata/v1/instance/id", nil, http.StatusForbidden},
		{"GCE metadata with it", "GET", gce.URL + "/computeMetadata/v1/instance/id", map[string]string{"Metadata-Flavor": "Google"}, http.StatusOK},
		{"EC2 unsigned", "POST", ec2.URL + "/?Action=DescribeVolumes&Version=2016-11-15", nil, http.StatusUnauthorized},
		{"Route 53 signed by someone else", "GET", r53.URL + "/2013-04-01/hostedzone/Z1/rrset", map[string]string{
			"Authorization": "AWS4-HMAC-SHA256 Credential=AKIDOTHER/20260101/us-east-1/route53/aws4_request, SignedHeaders=host;x-amz-date, Signature=" + strings.Repeat("0", 64)}, http.StatusForbidden},
		{"Compute without a token", "GET", comp.URL + "/compute/v1/projects/p/zones/z/disks/d", nil, http.StatusUnauthorized},
		{"Cloud DNS with another token", "GET", cdns.URL + "/dns/v1/projects/p/managedZones", map[string]string{"Authorization": "Bearer ya29.other"}, http.StatusUnauthorized},
	} {
		req, _ := http.NewRequest(tc.method, tc.url, nil)
		for k, v := range tc.header {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("%s: %s, want %d", tc.name, resp.Status, tc.want)
		}
	}
}
