package config

import (
	"errors"
	"strings"
	"testing"
)

// TestAttackUnitNameAsOption: a unit name that starts with "-" would reach systemctl as
// an option (systemctl start --force, say); validation refuses it, naming the field.
func TestAttackUnitNameAsOption(t *testing.T) {
	tests := []struct {
		name      string
		unit      string
		wantField string // "" means valid
	}{
		{name: "dash", unit: "-foo.service", wantField: "systemd.units[1].name"},
		{name: "option lookalike", unit: "--force.service", wantField: "systemd.units[1].name"},
		{name: "dash inside is fine", unit: "kube-proxy.service"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			raw := `{"ignition":{"version":"3.4.0"},"systemd":{"units":[
			 {"name":"ok.service","enabled":true,"contents":"[Service]\nExecStart=/bin/true\n"},
			 {"name":"` + tc.unit + `","enabled":true,"contents":"[Service]\nExecStart=/bin/true\n"}]}}`
			c, err := Parse([]byte(raw))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			err = c.Validate()
			if tc.wantField == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			var fe *FieldError
			if !errors.As(err, &fe) || fe.Path != tc.wantField {
				t.Fatalf("Validate = %v; want an error for %s", err, tc.wantField)
			}
			if !strings.Contains(err.Error(), tc.wantField+": ") || !strings.Contains(err.Error(), "starts with a dash") {
				t.Errorf("error %q does not say that %s starts with a dash", err, tc.wantField)
			}
		})
	}
}
