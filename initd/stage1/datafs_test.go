package stage1

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/kilnproject/kiln/initd/blockdev"
	"github.com/kilnproject/kiln/internal/nodeimage"
	"github.com/kilnproject/kiln/internal/testkit"
)

// TestCheckDataFilesystem: stage 1 uses a data partition that is blank or ext4 and refuses
// anything else, naming what it found.
func TestCheckDataFilesystem(t *testing.T) {
	testkit.Tools(t, "mkfs.ext4", "mkfs.vfat")
	tests := []struct {
		name    string
		mkfs    []string // run on the image; none leaves it blank
		want    string
		refusal string
	}{
		{name: "blank", want: blockdev.FSNone},
		{name: "ext4", mkfs: []string{"mkfs.ext4", "-q", "-F", "-L", nodeimage.DataLabel}, want: blockdev.FSExt4},
		{name: "vfat", mkfs: []string{"mkfs.vfat"}, refusal: "holds vfat, not ext4: refusing to format it"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := testkit.SparseFile(t, 64*mib)
			if len(tt.mkfs) > 0 {
				if out, err := exec.Command(tt.mkfs[0], append(tt.mkfs[1:], p)...).CombinedOutput(); err != nil {
					t.Fatalf("%s: %v\n%s", tt.mkfs[0], err, out)
				}
			}
			fs, err := checkDataFilesystem(p)
			if tt.refusal != "" {
				if err == nil || !strings.Contains(err.Error(), tt.refusal) {
					t.Errorf("CheckDataFilesystem = %q, %v; want a refusal naming %q", fs, err, tt.refusal)
				}
				return
			}
			if err != nil || fs != tt.want {
				t.Errorf("CheckDataFilesystem = %q, %v; want %q", fs, err, tt.want)
			}
		})
	}
}
