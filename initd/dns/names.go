package dns

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/kilnproject/kiln/initd/config"
)

// Names returns the records node n publishes with its addresses addrs (the primary
// IPv4 and, when it has one, IPv6 from facts; invalid addresses are skipped):
// etcd-<member>.internal.<cluster>.<zone> for an etcd member and
// api.internal.<cluster>.<zone> for a control-plane node (config.Node.InternalName),
// an A record for the IPv4 addresses and an AAAA record for the IPv6 ones, with TTL
// dns.ttl (config.DefaultDNSTTL when unset). The api records are Shared: every
// control-plane node adds its address. A worker publishes nothing.
func Names(n *config.Node, addrs ...netip.Addr) ([]Record, error) {
	var hosts []string
	if n.Role == config.RoleControlPlane {
		hosts = append(hosts, "api")
	}
	if (n.Role == config.RoleControlPlane || n.Role == config.RoleEtcd) && n.Etcd != nil && n.Etcd.Member != "" {
		hosts = append(hosts, "etcd-"+n.Etcd.Member)
	}
	if len(hosts) == 0 {
		return nil, nil
	}
	if n.Cluster.Name == "" || n.Cluster.DNSZone == "" {
		return nil, errors.New("node config: cluster.name and cluster.dnsZone are needed to name the cluster's hosts")
	}
	var v4, v6 []netip.Addr
	for _, a := range addrs {
		a = a.Unmap()
		switch {
		case !a.IsValid():
		case a.Is4():
			v4 = append(v4, a)
		default:
			v6 = append(v6, a.WithZone(""))
		}
	}
	if len(v4)+len(v6) == 0 {
		return nil, fmt.Errorf("no address to publish for %s", n.InternalName(hosts[0]))
	}
	ttl := n.DNS.TTL
	if ttl == 0 {
		ttl = config.DefaultDNSTTL
	}
	var recs []Record
	for _, h := range hosts {
		name := n.InternalName(h)
		if len(v4) > 0 {
			recs = append(recs, Record{Name: name, Type: TypeA, Addrs: SortedAddrs(v4), TTL: ttl, Shared: h == "api"})
		}
		if len(v6) > 0 {
			recs = append(recs, Record{Name: name, Type: TypeAAAA, Addrs: SortedAddrs(v6), TTL: ttl, Shared: h == "api"})
		}
	}
	return recs, nil
}
