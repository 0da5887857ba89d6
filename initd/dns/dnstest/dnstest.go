// Package dnstest is what the tests of DNS providers outside package dns (the clouds'
// in initd/cloud/...) share: registration steps checked against a fake's changes, and
// the names they register. It is for tests only.
package dnstest

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/kilnproject/kiln/initd/dns"
)

// The names the provider tests register.
const (
	API  = "api.internal.prod.example.test"
	Etcd = "etcd-a.internal.prod.example.test"
)

// Step is one registration of a provider test and the change it sends.
type Step struct {
	Name string
	Recs []dns.Record
	Want []string // the change, one line per record set as the fake shows it; nil: none sent
}

// RunSteps registers each step's records with upsert, in order, and checks the change a
// fake provider saw: sent counts the changes so far, last shows the latest.
func RunSteps(t *testing.T, steps []Step, upsert func([]dns.Record) error, sent func() int, last func() []string) {
	t.Helper()
	for _, s := range steps {
		before := sent()
		if err := upsert(s.Recs); err != nil {
			t.Fatalf("%s: %v", s.Name, err)
		}
		if s.Want == nil {
			if sent() != before {
				t.Errorf("%s: a change was sent: %v", s.Name, last())
			}
			continue
		}
		if got := last(); !slices.Equal(got, s.Want) {
			t.Errorf("%s: change\n%s\nwant\n%s", s.Name, strings.Join(got, "\n"), strings.Join(s.Want, "\n"))
		}
	}
}

// CheckUpsertRefused checks that p refuses to publish one record, in zone when the
// provider finds its zone by name, with an error containing want.
func CheckUpsertRefused(t *testing.T, ctx context.Context, p dns.Provider, zone, want string) {
	t.Helper()
	name := "x.example.test"
	if zone != "" {
		name = "x." + zone
	}
	err := p.Upsert(ctx, []dns.Record{{Name: name, Type: dns.TypeA, Addrs: Addrs("10.0.0.1"), TTL: 60}})
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("err = %v, want %q", err, want)
	}
}

// Addrs parses addresses, panicking on a bad one.
func Addrs(s ...string) []netip.Addr {
	var out []netip.Addr
	for _, a := range s {
		out = append(out, netip.MustParseAddr(a))
	}
	return out
}

// SameAddrs reports whether a and b hold the same addresses, in any order.
func SameAddrs(a, b []netip.Addr) bool {
	return slices.Equal(dns.SortedAddrs(a), dns.SortedAddrs(b))
}
