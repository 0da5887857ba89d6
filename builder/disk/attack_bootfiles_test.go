package disk

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The boot files come from the base: a kernel or bootloader that cannot fit the ESP, or
// that is not a regular file, fails Build with an error naming it, before the file is read
// into memory and before any image is written.
func TestBuildRefusesOversizedOrSpecialBootFiles(t *testing.T) {
	base := fixture(t, SquashFS)
	base.ESPSize = 64 * MiB
	dir := t.TempDir()
	huge := filepath.Join(dir, "vmlinuz-huge")
	// Sparse: the test costs no disk, a reader that slurps it costs 64 MiB of memory.
	if err := os.WriteFile(huge, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(huge, 64*MiB+1); err != nil {
		t.Fatal(err)
	}
	efiDir := filepath.Join(dir, "systemd-bootx64.efi")
	if err := os.Mkdir(efiDir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		edit func(*Spec)
		want []string
	}{
		{"kernel bigger than the ESP", func(s *Spec) { s.Kernel = huge }, []string{"kernel", huge, "67108865 bytes", "64 MiB ESP"}},
		{"initrd bigger than the ESP", func(s *Spec) { s.Initrd = huge }, []string{"initrd", huge, "64 MiB ESP"}},
		{"bootloader is a directory", func(s *Spec) { s.Bootloader = efiDir }, []string{"bootloader", efiDir, "not a regular file"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := base
			tc.edit(&spec)
			out := t.TempDir()
			_, err := Build(filepath.Join(out, "disk.raw"), spec)
			if err == nil {
				t.Fatal("Build succeeded, want an error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			if left, _ := os.ReadDir(out); len(left) != 0 {
				t.Errorf("files left behind: %v", left)
			}
		})
	}
}
