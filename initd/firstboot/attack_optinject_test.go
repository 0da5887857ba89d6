package firstboot

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/kilnproject/kiln/initd/source"
)

// TestAttackUnitNameAsOption: the names of the config's units reach `systemctl start`
// after "--", so that no name can be read as an option. (Names starting with "-" are
// refused by config validation; this is the second line.)
func TestAttackUnitNameAsOption(t *testing.T) {
	cfg := `{"ignition":{"version":"3.4.0"},"systemd":{"units":[
	 {"name":"demo.service","enabled":true,"contents":"[Service]\nExecStart=/bin/true\n[Install]\nWantedBy=multi-user.target\n"}]}}`
	var calls [][]string
	_, err := Run(context.Background(), Options{
		Root:      t.TempDir(),
		Providers: []source.Provider{fwcfg(t, cfg)},
		Systemctl: func(_ context.Context, args ...string) error {
			calls = append(calls, args)
			return nil
		},
	})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	var start []string
	for _, c := range calls {
		if len(c) > 0 && c[0] == "start" {
			start = c
		}
	}
	if start == nil {
		t.Fatalf("systemctl calls %q: the enabled unit was not started", calls)
	}
	dash := slices.Index(start, "--")
	name := slices.Index(start, "demo.service")
	if dash < 0 || name < dash {
		t.Errorf("systemctl %s: want \"--\" before the unit names", strings.Join(start, " "))
	}
}
