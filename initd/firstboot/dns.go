package firstboot

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/netip"

	"github.com/kilnproject/kiln/initd/config"
	"github.com/kilnproject/kiln/initd/dns"
	"github.com/kilnproject/kiln/initd/firstboot/facts"
	"github.com/kilnproject/kiln/initd/source"
)

// RegisterDNS publishes this node's cluster names (etcd-<member>.internal…, api.internal…)
// with the provider node.yaml names, and is `kiln-init dns`, run by kiln-dns.service at every
// boot: it checks before it writes, so an unchanged node sends nothing and a node whose
// address changed replaces its old one. It retries with backoff until ctx ends, recording
// pending/registered in /var/lib/kiln/dns.json for `kiln-init status`; a DNS server that is
// down never holds up the boot, because this runs in its own service.
func RegisterDNS(ctx context.Context, root string, log *slog.Logger) (dns.State, error) {
	n, err := config.LoadNodeIn(root)
	if errors.Is(err, fs.ErrNotExist) {
		log.Info("no node config; nothing to publish")
		return dns.State{}, nil
	}
	if err != nil {
		return dns.State{}, err
	}
	f, err := facts.Gather(ctx, facts.Options{Root: root, Hostname: n.Hostname})
	if err != nil {
		return dns.State{}, err
	}
	var addrs []netip.Addr
	for _, s := range []string{f.IPv4, f.IPv6} {
		if a, err := netip.ParseAddr(s); err == nil {
			addrs = append(addrs, a)
		}
	}
	recs, err := dns.Names(n, addrs...)
	if err != nil || len(recs) == 0 {
		return dns.State{}, err
	}
	status := dns.StatusFile{Root: root}
	if prev, err := status.Read(); err == nil {
		recs = dns.WithStale(recs, prev.Records)
	}
	clouds, err := cloudClients(ctx, n)
	if err != nil {
		return dns.State{}, err
	}
	p, err := dns.FromConfig(n, root, clouds)
	if err != nil || p == nil {
		return dns.State{}, err
	}
	return dns.Register(ctx, p, recs, dns.Options{Log: log, OnState: func(s dns.State) {
		if err := status.Write(s); err != nil {
			log.Warn("dns status", "error", err)
		}
	}})
}

// cloudClients builds the SDK client the node's DNS provider needs, from the instance's
// own credentials.
func cloudClients(ctx context.Context, n *config.Node) (dns.Clouds, error) {
	switch n.DNS.Provider {
	case config.DNSRoute53:
		cfg, err := awsConfig(ctx, n)
		if err != nil {
			return dns.Clouds{}, fmt.Errorf("route53: %w", err)
		}
		return dns.Clouds{Route53: route53Client(cfg, n)}, nil
	case config.DNSCloudDNS:
		project, err := source.GCEMetadataClient().ProjectIDWithContext(ctx)
		if err != nil {
			return dns.Clouds{}, fmt.Errorf("clouddns: GCE metadata: %w", err)
		}
		svc, err := cloudDNSService(ctx, n)
		if err != nil {
			return dns.Clouds{}, fmt.Errorf("clouddns: %w", err)
		}
		return dns.Clouds{CloudDNS: svc, GCPProject: project}, nil
	}
	return dns.Clouds{}, nil
}
