package bake

import (
	"testing"

	"github.com/kilnproject/kiln/builder/spec"
)

func mustLoad(t *testing.T, def string) (*spec.Definition, []*spec.Profile) {
	t.Helper()
	d, err := spec.LoadDefinition(def)
	if err != nil {
		t.Fatal(err)
	}
	ps, err := spec.LoadProfiles(d.ProfilesDir)
	if err != nil {
		t.Fatal(err)
	}
	return d, ps
}
