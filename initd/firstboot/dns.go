package firstboot

import (
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"net/netip"

	"github.com/kilnproject/kiln/initd/config"
	"github.com/kilnproject/kiln/initd/dns"
	"github.com/kilnproject/kiln/initd/firstboot/facts"
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
	p, err := dnsProvider(ctx, n, root)
	if err != nil || p == nil {
		return dns.State{}, err
	}
	return dns.Register(ctx, p, recs, dns.Options{Log: log, OnState: func(s dns.State) {
		if err := status.Write(s); err != nil {
			log.Warn("dns status", "error", err)
		}
	}})
}

// dnsProvider is the provider n's dns.provider names: a cloud's DNS service, else one
// of package dns's (nil for none).
func dnsProvider(ctx context.Context, n *config.Node, root string) (dns.Provider, error) {
	for _, c := range clouds {
		p, err := c.DNS(ctx, n)
		if err != nil || p != nil {
			return p, err
		}
	}
	return dns.FromConfig(n, root)
}
