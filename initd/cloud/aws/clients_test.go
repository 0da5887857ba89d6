package aws

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/kilnproject/kiln/initd/cloud"
	"github.com/kilnproject/kiln/initd/config"
	"github.com/kilnproject/kiln/initd/dns"
	"github.com/kilnproject/kiln/initd/dns/dnstest"
	"github.com/kilnproject/kiln/initd/etcdvolume/etcdvolumetest"
	"github.com/kilnproject/kiln/internal/cloudfake"
)

// TestCloudClients: the clients Cloud builds from node.yaml take the region and the
// instance role's credentials (session token included) from IMDS at aws.endpoints.imds,
// and call EC2 and Route 53 at aws.endpoints.ec2 and .route53; the fakes, which accept
// only the role's credentials and EC2 requests signed for the instance's region, find
// nothing to refuse.
func TestCloudClients(t *testing.T) {
	md := roleIMDS()
	role := md.Creds
	dev := etcdvolumetest.NewDev(t)
	ec2 := newFakeEC2(dev, etcdVolumes())
	ec2.Creds, ec2.Instances = role, map[string]string{"i-0kiln": testAZ}
	r53 := &cloudfake.Route53{Creds: role, ZoneID: r53ZoneID, Zone: "example.test."}
	mdSrv, ec2Srv, r53Srv := cloudfake.Serve(t, md), cloudfake.Serve(t, ec2), cloudfake.Serve(t, r53)

	n, err := config.ParseNode([]byte(fmt.Sprintf(`cluster: {name: prod, dnsZone: example.test}
role: control-plane
dns: {provider: route53}
etcd: {member: b, members: [a, b, c], volume: {awsTags: {k8s.io/role/control-plane: "1"}}}
aws: {route53HostedZoneId: %s, endpoints: {imds: %q, ec2: %q, route53: %q}}
`, r53ZoneID, mdSrv.URL, ec2Srv.URL, r53Srv.URL)), "node.yaml")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	in := cloud.Instance{Cloud: "aws", InstanceID: "i-0kiln", Zone: testAZ}
	finder, err := (Cloud{}).EtcdVolume(ctx, n, n.Etcd.Volume, in, quiet)
	if err != nil {
		t.Fatal(err)
	}
	ebs := finder.(EBS)
	ebs.DevDir, ebs.Poll = dev.ByID, 10*time.Millisecond
	if got, err := ebs.Find(ctx); err != nil || got != dev.Devs+"/nvme1n1" {
		t.Errorf("Find = %q, %v", got, err)
	}
	if attaches, _ := ec2Calls(ec2); !slices.Equal(attaches, []string{"vol-0b i-0kiln /dev/xvdu"}) {
		t.Errorf("attaches %q", attaches)
	}

	p, err := (Cloud{}).DNS(ctx, n)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Upsert(ctx, []dns.Record{{Name: dnstest.Etcd, Type: dns.TypeA, Addrs: dnstest.Addrs("10.0.0.5"), TTL: 60}}); err != nil {
		t.Fatal(err)
	}
	if got := r53.Records(dnstest.Etcd+".", dns.TypeA); !slices.Equal(got, []string{"10.0.0.5"}) {
		t.Errorf("Route 53 holds %q", got)
	}
	// One read of the role's credentials for each client.
	if n := count(md.Calls(), "GET /latest/meta-data/iam/security-credentials/kiln-node"); n != 2 {
		t.Errorf("credentials read %d times, want 2: %q", n, md.Calls())
	}
}
