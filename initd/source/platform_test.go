package source

import (
	"strings"
	"testing"
)

// cloudy is a cloud platform for the test; its source is an Embedded one.
type cloudy struct{}

func (cloudy) Name() string     { return "cloudy" }
func (cloudy) Source() Provider { return Embedded{Path: "cloudy-metadata"} }

// TestForPlatform: qemu and metal have their lists, a cloud its Source after the URL;
// firstboot's TestPlatformSources checks the real clouds.
func TestForPlatform(t *testing.T) {
	tests := []struct {
		platform string
		want     []string
		wantErr  string
	}{
		{platform: "qemu", want: []string{"cmdline-url", "fw_cfg", "cidata"}},
		{platform: "cloudy", want: []string{"cmdline-url", "embedded"}},
		{platform: "metal", want: []string{"cmdline-url", "cidata", "iso-medium"}},
		{platform: "azure", wantErr: "kiln.platform=azure: unknown platform (one of qemu, cloudy, metal)"},
		{platform: "", wantErr: "no kiln.platform= on the kernel command line"},
	}
	for _, tc := range tests {
		t.Run(tc.platform, func(t *testing.T) {
			ps, err := ForPlatform(tc.platform, "ro kiln.config.url=http://h/c.ign", []Cloud{cloudy{}})
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, p := range ps {
				names = append(names, p.Name())
			}
			if strings.Join(names, ",") != strings.Join(tc.want, ",") {
				t.Errorf("ForPlatform(%s) = %v, want %v", tc.platform, names, tc.want)
			}
			// The command line given is the one the URL source reads.
			if !ps[0].Probe(t.Context()) {
				t.Error("cmdline-url does not see kiln.config.url= in the given command line")
			}
		})
	}
}
