package storage

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/golden from the code")

// The mount and swap units later boots read, as kiln writes them.
func TestUnitsGolden(t *testing.T) {
	for _, tc := range []struct {
		name string
		got  []byte
	}{
		{"var-lib-containerd.mount", mountUnit("storage.filesystems[0]", "/dev/disk/by-uuid/"+fsUUID, "/var/lib/containerd", "xfs", "noatime,discard")},
		{"srv-fat.mount", mountUnit("storage.filesystems[2]", "/dev/disk/by-uuid/1234-ABCD", "/srv/fat", "vfat", "defaults")},
		{"by-uuid.swap", swapUnit("storage.filesystems[1]", "/dev/disk/by-uuid/"+fsUUID)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			golden := filepath.Join("testdata/golden", tc.name)
			if *update {
				if err := os.MkdirAll(filepath.Dir(golden), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(golden, tc.got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (go test -run TestUnitsGolden -update writes it)", err)
			}
			if !bytes.Equal(tc.got, want) {
				t.Errorf("%s:\n%s\nwant:\n%s", tc.name, tc.got, want)
			}
		})
	}
}
