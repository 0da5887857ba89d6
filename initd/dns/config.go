package dns

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/kilnproject/kiln/initd/config"
)

// FromConfig returns the Provider node config n names (nil for dns.provider none) among
// those that need no cloud: hosts and rfc2136. A cloud's DNS service (route53, clouddns)
// is that cloud's to give (cloud.Cloud's DNS, in initd/cloud/<cloud>); FromConfig says
// it is not supported. root is the node's "/": the TSIG secret file and /etc/hosts are
// read below it. The TSIG algorithm is dns.tsigAlgorithm, else the secret file's, else
// hmac-sha256.
func FromConfig(n *config.Node, root string) (Provider, error) {
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
	default:
		return nil, fmt.Errorf("dns.provider %q is not supported", d.Provider)
	}
}
