package aws

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	sdkaws "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/route53"
	"github.com/aws/aws-sdk-go-v2/service/route53/types"

	"github.com/kilnproject/kiln/initd/dns"
)

// Route53API is the part of *route53.Client that Route53 uses.
type Route53API interface {
	ChangeResourceRecordSets(context.Context, *route53.ChangeResourceRecordSetsInput, ...func(*route53.Options)) (*route53.ChangeResourceRecordSetsOutput, error)
	ListResourceRecordSets(context.Context, *route53.ListResourceRecordSetsInput, ...func(*route53.Options)) (*route53.ListResourceRecordSetsOutput, error)
	GetChange(context.Context, *route53.GetChangeInput, ...func(*route53.Options)) (*route53.GetChangeOutput, error)
	ListHostedZonesByName(context.Context, *route53.ListHostedZonesByNameInput, ...func(*route53.Options)) (*route53.ListHostedZonesByNameOutput, error)
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
	out, err := p.Client.ListHostedZonesByName(ctx, &route53.ListHostedZonesByNameInput{DNSName: sdkaws.String(dns.FQDN(p.Zone)), MaxItems: sdkaws.Int32(10)})
	if err != nil {
		return "", fmt.Errorf("route53: find hosted zone %s: %w", dns.HostName(p.Zone), err)
	}
	var ids []string
	for _, z := range out.HostedZones {
		if z.Name != nil && strings.EqualFold(*z.Name, dns.FQDN(p.Zone)) && z.Id != nil {
			ids = append(ids, strings.TrimPrefix(*z.Id, "/hostedzone/"))
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
	var changes []types.Change
	for _, r := range recs {
		if !r.Shared {
			changes = append(changes, types.Change{Action: types.ChangeActionUpsert, ResourceRecordSet: r53Set(r.Name, r.Type, r.TTL, r.Addrs)})
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
		if cur != nil && !differs && sdkaws.ToInt64(cur.TTL) == int64(r.TTL) {
			continue
		}
		if cur != nil {
			changes = append(changes, types.Change{Action: types.ChangeActionDelete, ResourceRecordSet: cur})
		}
		changes = append(changes, types.Change{Action: types.ChangeActionCreate, ResourceRecordSet: r53Set(r.Name, r.Type, r.TTL, want)})
	}
	if len(changes) == 0 {
		return nil
	}
	out, err := p.Client.ChangeResourceRecordSets(ctx, &route53.ChangeResourceRecordSetsInput{
		HostedZoneId: sdkaws.String(zone),
		ChangeBatch:  &types.ChangeBatch{Comment: sdkaws.String("kiln-init"), Changes: changes},
	})
	if err != nil {
		var bad *types.InvalidChangeBatch
		if errors.As(err, &bad) && len(bad.Messages) > 0 {
			return fmt.Errorf("route53: change record sets in hosted zone %s: %w (%s)", zone, err, strings.Join(bad.Messages, "; "))
		}
		return fmt.Errorf("route53: change record sets in hosted zone %s: %w", zone, err)
	}
	if p.Wait <= 0 || out.ChangeInfo == nil || out.ChangeInfo.Id == nil {
		return nil
	}
	return p.waitInsync(ctx, *out.ChangeInfo.Id, out.ChangeInfo.Status)
}

// waitInsync waits up to p.Wait for change id to be INSYNC, with the SDK's waiter polling
// every p.PollInterval.
func (p *Route53) waitInsync(ctx context.Context, id string, status types.ChangeStatus) error {
	if status == types.ChangeStatusInsync {
		return nil
	}
	every := p.PollInterval
	if every <= 0 {
		every = 5 * time.Second
	}
	wctx, cancel := context.WithTimeout(ctx, p.Wait)
	defer cancel()
	var getErr error // GetChange's own failure, not the end of the wait
	w := route53.NewResourceRecordSetsChangedWaiter(p.Client, func(o *route53.ResourceRecordSetsChangedWaiterOptions) {
		o.MinDelay, o.MaxDelay = every, every
		insync := o.Retryable
		o.Retryable = func(ctx context.Context, in *route53.GetChangeInput, out *route53.GetChangeOutput, err error) (bool, error) {
			if err != nil && wctx.Err() == nil {
				getErr = fmt.Errorf("route53: get change %s: %w", id, err)
				return false, getErr
			}
			if out != nil && out.ChangeInfo != nil {
				status = out.ChangeInfo.Status
			}
			return insync(ctx, in, out, err)
		}
	})
	err := w.Wait(wctx, &route53.GetChangeInput{Id: sdkaws.String(id)}, p.Wait)
	switch {
	case err == nil:
		return nil
	case getErr != nil:
		return getErr
	case ctx.Err() != nil:
		return fmt.Errorf("route53: change %s: %w", id, ctx.Err())
	}
	return fmt.Errorf("route53: change %s still %s after %s: %w", id, status, p.Wait, context.DeadlineExceeded)
}

// recordSet returns the simple-routing record set of name and type, nil if none.
func (p *Route53) recordSet(ctx context.Context, zone, name, typ string) (*types.ResourceRecordSet, error) {
	sets, err := p.list(ctx, zone, name, typ)
	if err != nil {
		return nil, err
	}
	for _, s := range sets {
		if string(s.Type) == typ && s.SetIdentifier == nil {
			return &s, nil
		}
	}
	return nil, nil
}

// list returns name's record sets from type typ on (A, then AAAA, …).
func (p *Route53) list(ctx context.Context, zone, name, typ string) ([]types.ResourceRecordSet, error) {
	in := &route53.ListResourceRecordSetsInput{
		HostedZoneId:    sdkaws.String(zone),
		StartRecordName: sdkaws.String(dns.FQDN(name)),
		StartRecordType: types.RRType(typ),
		MaxItems:        sdkaws.Int32(10),
	}
	var sets []types.ResourceRecordSet
	for {
		out, err := p.Client.ListResourceRecordSets(ctx, in)
		if err != nil {
			return nil, fmt.Errorf("route53: list record sets of %s in hosted zone %s: %w", dns.HostName(name), zone, err)
		}
		for _, s := range out.ResourceRecordSets {
			if !strings.EqualFold(dns.FQDN(sdkaws.ToString(s.Name)), dns.FQDN(name)) {
				return sets, nil
			}
			sets = append(sets, s)
		}
		if !out.IsTruncated || !strings.EqualFold(dns.FQDN(sdkaws.ToString(out.NextRecordName)), dns.FQDN(name)) {
			return sets, nil
		}
		in.StartRecordType, in.StartRecordIdentifier = out.NextRecordType, out.NextRecordIdentifier
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
		if s.Type != types.RRTypeA && s.Type != types.RRTypeAaaa {
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

func r53Set(name, typ string, ttl int, addrs []netip.Addr) *types.ResourceRecordSet {
	s := &types.ResourceRecordSet{Name: sdkaws.String(dns.FQDN(name)), Type: types.RRType(typ), TTL: sdkaws.Int64(int64(ttl))}
	for _, a := range dns.SortedAddrs(addrs) {
		s.ResourceRecords = append(s.ResourceRecords, types.ResourceRecord{Value: sdkaws.String(a.String())})
	}
	return s
}

func r53Addrs(s types.ResourceRecordSet) ([]netip.Addr, error) {
	if s.AliasTarget != nil {
		return nil, fmt.Errorf("%s record is an alias to %s, not addresses", s.Type, sdkaws.ToString(s.AliasTarget.DNSName))
	}
	vals := make([]string, 0, len(s.ResourceRecords))
	for _, rr := range s.ResourceRecords {
		vals = append(vals, sdkaws.ToString(rr.Value))
	}
	return dns.ParseAddrs(string(s.Type), slices.Clip(vals))
}
