package source

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kilnproject/kiln/internal/nodeimage"
)

// ISOMedium reads kiln/config.ign from the volume labelled KILN_LIVE; a kiln ISO without it, a
// missing volume and a CIDATA-labelled one have no config, and an oversized file is refused.
func TestISOMedium(t *testing.T) {
	iso := isoWith("xorriso", "-R")
	tests := []struct {
		name    string
		label   string // "" for no volume
		files   map[string]string
		present bool
		want    string
		wantErr error
	}{
		{name: "config", label: nodeimage.ISOLabel, files: map[string]string{"kiln/config.ign": ign, "kiln/root.img": "root"}, present: true, want: ign},
		{name: "butane config", label: nodeimage.ISOLabel, files: map[string]string{"kiln/config.ign": butane}, present: true, want: butane},
		{name: "kiln iso without a config", label: nodeimage.ISOLabel, files: map[string]string{"kiln/root.img": "root"}},
		{name: "no volume"},
		{name: "config on another volume", label: "CIDATA", files: map[string]string{"kiln/config.ign": ign}},
		{name: "too large", label: nodeimage.ISOLabel, files: map[string]string{"kiln/config.ign": strings.Repeat("x", MaxConfigSize+1)}, present: true,
			wantErr: &TooLargeError{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := ISOMedium{ByLabel: t.TempDir()}
			if tt.label != "" {
				img := iso(t, tt.label, tt.files)
				m.ByLabel = byLabel(t, tt.label, img)
			}
			if got := m.Probe(context.Background()); got != tt.present {
				t.Fatalf("Probe = %v, want %v", got, tt.present)
			}
			if !tt.present {
				return
			}
			got, err := m.Fetch(context.Background())
			if tt.wantErr != nil {
				var tl *TooLargeError
				if !errors.As(err, &tl) || !strings.Contains(err.Error(), nodeimage.ISOConfigPath+" on "+filepath.Join(m.ByLabel, nodeimage.ISOLabel)) {
					t.Fatalf("Fetch error = %v, want a TooLargeError naming the file and the volume", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tt.want {
				t.Errorf("Fetch = %q, want %q", got, tt.want)
			}
		})
	}
}
