// Package dns publishes a node's cluster names — etcd-<member>.internal.<cluster>.<zone>
// and api.internal.<cluster>.<zone> — through a Provider: an authoritative server
// updated with RFC 2136 (TSIG-signed), AWS Route 53, Google Cloud DNS, or a guarded
// block in the node's /etc/hosts.
//
// Names computes the records from the node config. Register publishes them, checking
// first (a provider's Lookup already answering the desired addresses means nothing is
// done) and retrying with exponential backoff and jitter while the provider fails;
// Start runs Register in the background so a DNS server that is down does not block
// boot, and StatusFile records the state ("pending: <last error>" or "registered") for
// `kiln-init status`.
//
// Every provider replaces the whole A or AAAA record set of a name, so a node whose
// address changed replaces its old record at its next boot.
package dns

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// Provider publishes DNS records.
type Provider interface {
	// Name says which provider this is and where it publishes, for logs and status,
	// e.g. "rfc2136 10.0.0.53:53 zone k8s.example.com".
	Name() string
	// Upsert makes each record's name answer exactly the record's addresses for the
	// record's type, replacing whatever record set of that name and type was there;
	// for a Shared record it adds the addresses to the set and removes the Stale ones,
	// keeping the other nodes' addresses. Records of other names and types are left
	// alone.
	Upsert(ctx context.Context, recs []Record) error
	// Lookup returns the A and AAAA addresses the provider publishes for name (none,
	// and no error, when the name does not exist). Providers that cannot look up
	// return an error wrapping errNoLookup.
	Lookup(ctx context.Context, name string) ([]netip.Addr, error)
}

// errNoLookup is wrapped by Lookup errors of providers that cannot read records back.
var errNoLookup = errors.New("lookup not supported")

// Record types: TypeA for IPv4 addresses, TypeAAAA for IPv6.
const (
	TypeA    = "A"
	TypeAAAA = "AAAA"
)

// Record is one record set: every address name answers for type.
type Record struct {
	// Name is an absolute name, with or without the final dot
	// (api.internal.prod.k8s.example.com).
	Name string `json:"name"`
	// Type is TypeA or TypeAAAA.
	Type string `json:"type"`
	// Addrs are IPv4 addresses for A, IPv6 for AAAA.
	Addrs []netip.Addr `json:"addrs"`
	// TTL in seconds.
	TTL int `json:"ttl"`
	// Shared names are published by several nodes (api.internal.<cluster>: one
	// address per control-plane node): Upsert adds Addrs to the record set instead of
	// replacing it and removes Stale, this node's former addresses (see WithStale).
	Shared bool         `json:"shared,omitempty"`
	Stale  []netip.Addr `json:"stale,omitempty"`
}

// String is e.g. "api.internal.prod.example.com A 10.0.0.5 (ttl 60)".
func (r Record) String() string {
	addrs := make([]string, len(r.Addrs))
	for i, a := range r.Addrs {
		addrs[i] = a.String()
	}
	return fmt.Sprintf("%s %s %s (ttl %d)", HostName(r.Name), r.Type, strings.Join(addrs, ","), r.TTL)
}

// check validates r; every provider calls it before acting.
func (r Record) check() error {
	name := HostName(r.Name)
	if name == "" || strings.ContainsAny(name, " \t\n") {
		return fmt.Errorf("record %q: name is not a DNS name", r.Name)
	}
	switch r.Type {
	case TypeA, TypeAAAA:
	default:
		return fmt.Errorf("record %s: type %q is not A or AAAA", name, r.Type)
	}
	if r.TTL < 1 || r.TTL > 2147483647 {
		return fmt.Errorf("record %s: ttl %d is not positive", name, r.TTL)
	}
	if len(r.Addrs) == 0 {
		return fmt.Errorf("record %s %s: no addresses", name, r.Type)
	}
	if len(r.Stale) > 0 && !r.Shared {
		return fmt.Errorf("record %s %s: stale addresses are only for shared records", name, r.Type)
	}
	for _, a := range slices.Concat(r.Addrs, r.Stale) {
		if !a.IsValid() || a.Is4() != (r.Type == TypeA) || a.Is4In6() || a.Zone() != "" {
			return fmt.Errorf("record %s %s: %v is not an address for this type", name, r.Type, a)
		}
	}
	return nil
}

func checkRecords(recs []Record) error {
	var errs []error
	for _, r := range recs {
		errs = append(errs, r.check())
	}
	return invalid(errors.Join(errs...))
}

// FQDN is name in lower case with the final dot, as DNS messages and the clouds want it.
func FQDN(name string) string {
	return strings.ToLower(strings.TrimSuffix(name, ".")) + "."
}

// HostName is name in lower case without the final dot, as /etc/hosts wants it.
func HostName(name string) string {
	return strings.ToLower(strings.TrimSuffix(name, "."))
}

// inZone reports whether name is zone or below it.
func inZone(name, zone string) bool {
	n, z := FQDN(name), FQDN(zone)
	return n == z || strings.HasSuffix(n, "."+z)
}

func checkInZone(recs []Record, zone string) error {
	for _, r := range recs {
		if !inZone(r.Name, zone) {
			return invalid(fmt.Errorf("record %s is not inside zone %s", HostName(r.Name), HostName(zone)))
		}
	}
	return nil
}

// Want is the record set a provider should hold for r when it holds have now, and
// whether that differs from have.
func (r Record) Want(have []netip.Addr) ([]netip.Addr, bool) {
	if !r.Shared {
		return SortedAddrs(r.Addrs), !sameAddrs(have, r.Addrs)
	}
	var out []netip.Addr
	for _, a := range have {
		if !slices.Contains(r.Stale, a) {
			out = append(out, a)
		}
	}
	out = SortedAddrs(append(out, r.Addrs...))
	return out, !sameAddrs(have, out)
}

// WithStale returns recs with the Stale addresses of each shared record set: those
// the same record in previous (what this node published before, from its StatusFile)
// held (or still had to remove) and recs no longer does. An address change then removes the node's old
// address from a shared name.
func WithStale(recs, previous []Record) []Record {
	out := slices.Clone(recs)
	for i, r := range out {
		if !r.Shared {
			continue
		}
		r.Stale = nil
		for _, p := range previous {
			if FQDN(p.Name) != FQDN(r.Name) || p.Type != r.Type {
				continue
			}
			for _, a := range slices.Concat(p.Addrs, p.Stale) {
				if !slices.Contains(r.Addrs, a) && !slices.Contains(r.Stale, a) {
					r.Stale = append(r.Stale, a)
				}
			}
		}
		out[i] = r
	}
	return out
}

// SortedAddrs returns a sorted copy of addrs without duplicates.
func SortedAddrs(addrs []netip.Addr) []netip.Addr {
	out := slices.Clone(addrs)
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

// sameAddrs reports whether a and b hold the same addresses, in any order.
func sameAddrs(a, b []netip.Addr) bool {
	return slices.Equal(SortedAddrs(a), SortedAddrs(b))
}

// ParseAddrs parses record data (rrdatas) of type typ.
func ParseAddrs(typ string, data []string) ([]netip.Addr, error) {
	var out []netip.Addr
	for _, d := range data {
		a, err := netip.ParseAddr(strings.TrimSpace(d))
		if err != nil || a.Is4() != (typ == TypeA) {
			return nil, fmt.Errorf("%s record data %q is not an address", typ, d)
		}
		out = append(out, a)
	}
	return out, nil
}

// CheckUpsert is every provider's check before an update: the records are well formed and,
// when the zone is known, inside it. It reports whether there is anything to send.
func CheckUpsert(recs []Record, zone string) (bool, error) {
	if err := checkRecords(recs); err != nil {
		return false, err
	}
	if zone != "" {
		if err := checkInZone(recs, zone); err != nil {
			return false, err
		}
	}
	return len(recs) > 0, nil
}
