package gce

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"sync"

	"github.com/kilnproject/kiln/initd/dns"
)

// CloudDNS publishes records in a Google Cloud DNS managed zone. An Upsert is one
// change (changes.create): for each record set that differs, the current set as a
// deletion and the new one as an addition — Cloud DNS's way to replace a set, refused
// as a whole if the set changed since it was read (the next attempt reads it again).
type CloudDNS struct {
	Service *DNSService
	Project string
	// ManagedZone is the managed zone's name (prod-zone). When empty, the one managed
	// zone of Project whose DNS name is Zone is used.
	ManagedZone string
	Zone        string

	mu       sync.Mutex
	zoneName string
}

// Name implements Provider.
func (p *CloudDNS) Name() string {
	if p.ManagedZone != "" {
		return fmt.Sprintf("clouddns %s/%s", p.Project, p.ManagedZone)
	}
	return fmt.Sprintf("clouddns %s zone %s", p.Project, dns.HostName(p.Zone))
}

func (p *CloudDNS) managedZone(ctx context.Context) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.zoneName != "":
		return p.zoneName, nil
	case p.Project == "":
		return "", fmt.Errorf("clouddns: no project")
	case p.ManagedZone != "":
		p.zoneName = p.ManagedZone
		return p.zoneName, nil
	case p.Zone == "":
		return "", fmt.Errorf("clouddns: neither a managed zone nor a zone name")
	}
	var names []string
	err := p.Service.managedZones(ctx, p.Project, dns.FQDN(p.Zone), func(zones []dnsManagedZone) {
		for _, z := range zones {
			if strings.EqualFold(z.DNSName, dns.FQDN(p.Zone)) {
				names = append(names, z.Name)
			}
		}
	})
	if err != nil {
		return "", fmt.Errorf("clouddns: find managed zone for %s in project %s: %w", dns.HostName(p.Zone), p.Project, err)
	}
	switch len(names) {
	case 0:
		return "", fmt.Errorf("clouddns: project %s has no managed zone for %s", p.Project, dns.HostName(p.Zone))
	case 1:
		p.zoneName = names[0]
		return p.zoneName, nil
	default:
		return "", fmt.Errorf("clouddns: project %s has %d managed zones for %s (%s); name the one to use", p.Project, len(names), dns.HostName(p.Zone), strings.Join(names, ", "))
	}
}

// Upsert implements Provider.
func (p *CloudDNS) Upsert(ctx context.Context, recs []dns.Record) error {
	if todo, err := dns.CheckUpsert(recs, p.Zone); err != nil || !todo {
		return err
	}
	zone, err := p.managedZone(ctx)
	if err != nil {
		return err
	}
	change := &dnsChange{}
	for _, r := range recs {
		cur, err := p.recordSets(ctx, zone, r.Name, r.Type)
		if err != nil {
			return err
		}
		var have []netip.Addr
		if len(cur) > 0 {
			if have, err = dns.ParseAddrs(r.Type, cur[0].Rrdatas); err != nil {
				return fmt.Errorf("clouddns: %s: %w", dns.HostName(r.Name), err)
			}
		}
		want, differs := r.Want(have)
		if len(cur) > 0 && !differs && cur[0].TTL == int64(r.TTL) {
			continue
		}
		change.Deletions = append(change.Deletions, cur...)
		add := dnsRecordSet{Name: dns.FQDN(r.Name), Type: r.Type, TTL: int64(r.TTL)}
		for _, a := range want {
			add.Rrdatas = append(add.Rrdatas, a.String())
		}
		change.Additions = append(change.Additions, add)
	}
	if len(change.Additions) == 0 {
		return nil
	}
	if err := p.Service.createChange(ctx, p.Project, zone, change); err != nil {
		return fmt.Errorf("clouddns: change %s/%s: %w", p.Project, zone, err)
	}
	return nil
}

func (p *CloudDNS) recordSets(ctx context.Context, zone, name, typ string) ([]dnsRecordSet, error) {
	var sets []dnsRecordSet
	err := p.Service.recordSets(ctx, p.Project, zone, dns.FQDN(name), typ, func(page []dnsRecordSet) {
		for _, s := range page {
			if strings.EqualFold(s.Name, dns.FQDN(name)) && (typ == "" || s.Type == typ) {
				sets = append(sets, s)
			}
		}
	})
	if err != nil {
		return nil, fmt.Errorf("clouddns: list record sets of %s in %s/%s: %w", dns.HostName(name), p.Project, zone, err)
	}
	return sets, nil
}

// Lookup implements Provider.
func (p *CloudDNS) Lookup(ctx context.Context, name string) ([]netip.Addr, error) {
	zone, err := p.managedZone(ctx)
	if err != nil {
		return nil, err
	}
	sets, err := p.recordSets(ctx, zone, name, "")
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, s := range sets {
		if s.Type != dns.TypeA && s.Type != dns.TypeAAAA {
			continue
		}
		addrs, err := dns.ParseAddrs(s.Type, s.Rrdatas)
		if err != nil {
			return nil, fmt.Errorf("clouddns: %s: %w", dns.HostName(name), err)
		}
		out = append(out, addrs...)
	}
	return out, nil
}
