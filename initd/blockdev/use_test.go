package blockdev

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestOnBootDiskRefusesNonBlock: a device the config's storage names must be a block
// device: /dev/fd/N (here a pipe), /dev/null, a file or a directory is refused, naming what it is.
func TestOnBootDiskRefusesNonBlock(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	file := filepath.Join(t.TempDir(), "disk.img")
	if err := os.WriteFile(file, make([]byte, 4096), 0o644); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	tests := []struct{ dev, want string }{
		{fmt.Sprintf("/dev/fd/%d", r.Fd()), "is a pipe, not a block device"},
		{"/dev/null", "/dev/null is a character device, not a block device"},
		{file, file + " is a regular file, not a block device"},
		{dir, dir + " is a directory, not a block device"},
	}
	for _, tt := range tests {
		t.Run(tt.dev, func(t *testing.T) {
			why, err := OnBootDisk("", tt.dev, nil)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("OnBootDisk(%s) = %q, %v; want an error saying %q", tt.dev, why, err, tt.want)
			}
		})
	}
}
