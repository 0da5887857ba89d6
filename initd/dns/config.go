package dns

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	gdns "google.golang.org/api/dns/v1"

	"github.com/kilnproject/kiln/initd/config"
)

// Clouds are the API clients FromConfig gives the cloud providers; only the one the
// node config names is needed.
type Clouds struct {
	Route53    Route53API    // for dns.provider route53
	CloudDNS   *gdns.Service // for dns.provider clouddns
	GCPProject string        // the project of the Cloud DNS managed zone
}

// FromConfig returns the Provider node config n names (nil for dns.provider none).
// root is the node's "/": the TSIG secret file and /etc/hosts are read below it. The
// hosted zone (Route 53) is aws.route53HostedZoneId, else the one named dns.zone; the
// managed zone (Cloud DNS) is the one named dns.zone. The TSIG algorithm is
// dns.tsigAlgorithm, else the secret file's, else hmac-sha256.
func FromConfig(n *config.Node, root string, c Clouds) (Provider, error) {
	d := n.DNS
	switch d.Provider {
	case config.DNSNone, "":
		return nil, nil
	case config.DNSHosts:
		return &Hosts{Root: root}, nil
	case config.DNSRFC2136:
		p := &RFC2136{Server: d.Server, Zone: d.Zone, KeyName: d.TSIGKeyName}
		if d.TSIGKeyName != "" {
			secret, alg, err := loadTSIGSecret(filepath.Join(root, d.TSIGSecretFile))
			if err != nil {
				return nil, fmt.Errorf("dns.tsigSecretFile: %w", err)
			}
			p.Secret, p.Algorithm = secret, alg
			if want := d.TSIGAlgorithm; want != "" {
				if alg != "" && !strings.EqualFold(strings.TrimSuffix(alg, "."), want) {
					return nil, fmt.Errorf("dns.tsigAlgorithm is %s, but the key clause in %s says %s", want, d.TSIGSecretFile, alg)
				}
				p.Algorithm = want
			}
		}
		return p, nil
	case config.DNSRoute53:
		if c.Route53 == nil {
			return nil, errors.New("dns.provider route53: no Route 53 client")
		}
		return &Route53{Client: c.Route53, Zone: d.Zone, HostedZoneID: n.AWS.Route53HostedZoneID}, nil
	case config.DNSCloudDNS:
		if c.CloudDNS == nil || c.GCPProject == "" {
			return nil, errors.New("dns.provider clouddns: no Cloud DNS service or project")
		}
		return &CloudDNS{Service: c.CloudDNS, Project: c.GCPProject, Zone: d.Zone}, nil
	default:
		return nil, fmt.Errorf("dns.provider %q is not supported", d.Provider)
	}
}
