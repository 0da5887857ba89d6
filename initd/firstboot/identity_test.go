package firstboot

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	"github.com/kilnproject/kiln/initd/config"
	"github.com/kilnproject/kiln/initd/source"
	"github.com/kilnproject/kiln/internal/cloudfake"
)

// ec2Instance is the EC2 instance the tests run on.
func ec2Instance() *cloudfake.IMDS {
	return &cloudfake.IMDS{InstanceID: "i-0123456789abcdef0", AZ: "eu-west-1b", Hostname: "ip-10-0-1-5.eu-west-1.compute.internal"}
}

// TestPlatformSources: the clouds' config sources follow the URL's for their
// kiln.platform=, and an unknown platform's error names the clouds.
func TestPlatformSources(t *testing.T) {
	for platform, want := range map[string]string{"aws": "cmdline-url,aws-imds", "gce": "cmdline-url,gce-metadata",
		"qemu": "cmdline-url,fw_cfg,cidata", "metal": "cmdline-url,cidata,iso-medium"} {
		ps, err := source.ForPlatform(platform, "ro", cloudSources())
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, p := range ps {
			names = append(names, p.Name())
		}
		if got := strings.Join(names, ","); got != want {
			t.Errorf("ForPlatform(%s) = %s, want %s", platform, got, want)
		}
	}
	_, err := source.ForPlatform("azure", "ro", cloudSources())
	if err == nil || !strings.Contains(err.Error(), "kiln.platform=azure: unknown platform (one of qemu, aws, gce, metal)") {
		t.Errorf("azure: %v", err)
	}
}

// On aws the facts carry the instance's identity and its hostname from IMDS, unless the
// node config names the node.
func TestFactsFromPlatform(t *testing.T) {
	srv := cloudfake.Serve(t, ec2Instance())
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
