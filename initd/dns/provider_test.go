package dns

import (
	"context"
	"slices"
	"strings"
	"testing"
)

// The names the provider tests register.
const (
	testAPI  = "api.internal.prod.example.test"
	testEtcd = "etcd-a.internal.prod.example.test"
)

// providerStep is one registration of a provider test and the change it sends.
type providerStep struct {
	name string
	recs []Record
	want []string // the change, one line per record set as the fake shows it; nil: none sent
}

// runProviderSteps registers each step's records with upsert, in order, and checks the
// change a fake provider saw: sent counts the changes so far, last shows the latest.
func runProviderSteps(t *testing.T, steps []providerStep, upsert func([]Record) error, sent func() int, last func() []string) {
	t.Helper()
	for _, s := range steps {
		before := sent()
		if err := upsert(s.recs); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if s.want == nil {
			if sent() != before {
				t.Errorf("%s: a change was sent: %v", s.name, last())
			}
			continue
		}
		if got := last(); !slices.Equal(got, s.want) {
			t.Errorf("%s: change\n%s\nwant\n%s", s.name, strings.Join(got, "\n"), strings.Join(s.want, "\n"))
		}
	}
}

// checkUpsertRefused checks that p refuses to publish one record, in zone when the provider
// finds its zone by name, with an error containing want.
func checkUpsertRefused(t *testing.T, ctx context.Context, p Provider, zone, want string) {
	t.Helper()
	name := "x.example.test"
	if zone != "" {
		name = "x." + zone
	}
	err := p.Upsert(ctx, []Record{{Name: name, Type: TypeA, Addrs: addrs("10.0.0.1"), TTL: 60}})
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("err = %v, want %q", err, want)
	}
}
