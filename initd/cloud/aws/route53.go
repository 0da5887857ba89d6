package aws

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kilnproject/kiln/initd/dns"
)

// Route53API is the part of the Route 53 API that Route53 uses (*Route53Client).
type Route53API interface {
	ChangeResourceRecordSets(ctx context.Context, zoneID, comment string, changes []Change) (ChangeInfo, error)
	ListResourceRecordSets(ctx context.Context, zoneID string, start RecordSetStart, maxItems int) (RecordSetPage, error)
	GetChange(ctx context.Context, id string) (ChangeInfo, error)
	ListHostedZonesByName(ctx context.Context, dnsName string, maxItems int) ([]HostedZone, error)
}

// Route53 publishes records in an AWS Route 53 hosted zone. An Upsert is one change
// batch: UPSERT for each record; for a Shared record, DELETE of the current set (as
// read just before) and CREATE of the new one, which Route 53 refuses as a whole if
// another node changed the set in between (the next attempt reads it again).
type Route53 struct {
	Client Route53API
	// HostedZoneID is the hosted zone (Z0123456789ABCDEFGHIJ or /hostedzone/Z…). When
	// empty, the one hosted zone named Zone is used (ListHostedZonesByName).
	HostedZoneID string
	Zone         string
	// Wait, when positive, makes Upsert wait up to that long for the change to be
	// INSYNC on all of Route 53's servers, polling every PollInterval (5 s when 0).
	Wait         time.Duration
	PollInterval time.Duration

	mu     sync.Mutex
	zoneID string // HostedZoneID, or the one found by Zone
}

// Name implements Provider.
func (p *Route53) Name() string {
	if p.HostedZoneID != "" {
		return "route53 hosted zone " + p.HostedZoneID
	}
	return "route53 zone " + dns.HostName(p.Zone)
}

// hostedZone returns the hosted zone's ID, looking it up by name once.
func (p *Route53) hostedZone(ctx context.Context) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.zoneID != "" {
		return p.zoneID, nil
	}
	if p.HostedZoneID != "" {
		p.zoneID = strings.TrimPrefix(p.HostedZoneID, "/hostedzone/")
		return p.zoneID, nil
	}
	if p.Zone == "" {
		return "", fmt.Errorf("route53: neither a hosted zone ID nor a zone name")
	}
	zones, err := p.Client.ListHostedZonesByName(ctx, dns.FQDN(p.Zone), 10)
	if err != nil {
		return "", fmt.Errorf("route53: find hosted zone %s: %w", dns.HostName(p.Zone), err)
	}
	var ids []string
	for _, z := range zones {
		if strings.EqualFold(z.Name, dns.FQDN(p.Zone)) && z.ID != "" {
			ids = append(ids, strings.TrimPrefix(z.ID, "/hostedzone/"))
		}
	}
	switch len(ids) {
	case 0:
		return "", fmt.Errorf("route53: no hosted zone is named %s", dns.HostName(p.Zone))
	case 1:
		p.zoneID = ids[0]
		return p.zoneID, nil
	default:
		return "", fmt.Errorf("route53: %d hosted zones are named %s (%s); name the one to use by its ID", len(ids), dns.HostName(p.Zone), strings.Join(ids, ", "))
	}
}

// Upsert implements Provider.
func (p *Route53) Upsert(ctx context.Context, recs []dns.Record) error {
	if todo, err := dns.CheckUpsert(recs, p.Zone); err != nil || !todo {
		return err
	}
	zone, err := p.hostedZone(ctx)
	if err != nil {
		return err
	}
	var changes []Change
	for _, r := range recs {
		if !r.Shared {
			changes = append(changes, Change{Action: "UPSERT", Set: r53Set(r.Name, r.Type, r.TTL, r.Addrs)})
			continue
		}
		cur, err := p.recordSet(ctx, zone, r.Name, r.Type)
		if err != nil {
			return err
		}
		var have []netip.Addr
		if cur != nil {
			if have, err = r53Addrs(*cur); err != nil {
				return fmt.Errorf("route53: %s %s: %w", dns.HostName(r.Name), r.Type, err)
			}
		}
		want, differs := r.Want(have)
		if cur != nil && !differs && cur.TTL != nil && *cur.TTL == int64(r.TTL) {
			continue
		}
		if cur != nil {
			changes = append(changes, Change{Action: "DELETE", Set: *cur})
		}
		changes = append(changes, Change{Action: "CREATE", Set: r53Set(r.Name, r.Type, r.TTL, want)})
	}
	if len(changes) == 0 {
		return nil
	}
	// A refused batch (InvalidChangeBatch) carries Route 53's reasons in its message.
	info, err := p.Client.ChangeResourceRecordSets(ctx, zone, "kiln-init", changes)
	if err != nil {
		return fmt.Errorf("route53: change record sets in hosted zone %s: %w", zone, err)
	}
	if p.Wait <= 0 || info.ID == "" {
		return nil
	}
	return p.waitInsync(ctx, info.ID, info.Status)
}

// waitInsync waits up to p.Wait for change id to be INSYNC, asking GetChange at once and
// then every p.PollInterval.
func (p *Route53) waitInsync(ctx context.Context, id, status string) error {
	if status == changeInsync {
		return nil
	}
	every := p.PollInterval
	if every <= 0 {
		every = 5 * time.Second
	}
	wctx, cancel := context.WithTimeout(ctx, p.Wait)
	defer cancel()
	for {
		info, err := p.Client.GetChange(wctx, id)
		switch {
		case err == nil:
			if status = info.Status; status == changeInsync {
				return nil
			}
		case wctx.Err() == nil:
			return fmt.Errorf("route53: get change %s: %w", id, err)
		}
		if sleepCtx(wctx, every) != nil {
			break
		}
	}
	if ctx.Err() != nil {
		return fmt.Errorf("route53: change %s: %w", id, ctx.Err())
	}
	return fmt.Errorf("route53: change %s still %s after %s: %w", id, status, p.Wait, context.DeadlineExceeded)
}

// recordSet returns the simple-routing record set of name and type, nil if none.
func (p *Route53) recordSet(ctx context.Context, zone, name, typ string) (*ResourceRecordSet, error) {
	sets, err := p.list(ctx, zone, name, typ)
	if err != nil {
		return nil, err
	}
	for _, s := range sets {
		if s.Type == typ && s.SetIdentifier == "" {
			return &s, nil
		}
	}
	return nil, nil
}

// list returns name's record sets from type typ on (A, then AAAA, …).
func (p *Route53) list(ctx context.Context, zone, name, typ string) ([]ResourceRecordSet, error) {
	start := RecordSetStart{Name: dns.FQDN(name), Type: typ}
	var sets []ResourceRecordSet
	for {
		page, err := p.Client.ListResourceRecordSets(ctx, zone, start, 10)
		if err != nil {
			return nil, fmt.Errorf("route53: list record sets of %s in hosted zone %s: %w", dns.HostName(name), zone, err)
		}
		for _, s := range page.Sets {
			if !strings.EqualFold(dns.FQDN(s.Name), dns.FQDN(name)) {
				return sets, nil
			}
			sets = append(sets, s)
		}
		if !page.IsTruncated || !strings.EqualFold(dns.FQDN(page.NextRecordName), dns.FQDN(name)) {
			return sets, nil
		}
		start.Type, start.Identifier = page.NextRecordType, page.NextRecordIdentifier
	}
}

// Lookup implements Provider.
func (p *Route53) Lookup(ctx context.Context, name string) ([]netip.Addr, error) {
	zone, err := p.hostedZone(ctx)
	if err != nil {
		return nil, err
	}
	sets, err := p.list(ctx, zone, name, dns.TypeA)
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, s := range sets {
		if s.Type != dns.TypeA && s.Type != dns.TypeAAAA {
			continue
		}
		addrs, err := r53Addrs(s)
		if err != nil {
			return nil, fmt.Errorf("route53: %s: %w", dns.HostName(name), err)
		}
		out = append(out, addrs...)
	}
	return out, nil
}

func r53Set(name, typ string, ttl int, addrs []netip.Addr) ResourceRecordSet {
	ttl64 := int64(ttl)
	s := ResourceRecordSet{Name: dns.FQDN(name), Type: typ, TTL: &ttl64}
	for _, a := range dns.SortedAddrs(addrs) {
		s.ResourceRecords = append(s.ResourceRecords, ResourceRecord{Value: a.String()})
	}
	return s
}

func r53Addrs(s ResourceRecordSet) ([]netip.Addr, error) {
	if s.AliasTarget != nil {
		return nil, fmt.Errorf("%s record is an alias to %s, not addresses", s.Type, s.AliasTarget.DNSName)
	}
	vals := make([]string, 0, len(s.ResourceRecords))
	for _, rr := range s.ResourceRecords {
		vals = append(vals, rr.Value)
	}
	return dns.ParseAddrs(s.Type, slices.Clip(vals))
}
