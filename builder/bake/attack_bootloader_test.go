package bake

import (
	"path/filepath"
	"strings"
	"testing"
)

// The systemd-boot EFI binary the ESP gets is read inside the base tree only: one that is
// a symlink to a host file (absolute or climbing out), or in a directory symlinked out of
// the tree, fails the bake with an error naming it and its bytes reach no output. A
// symlink that stays inside the tree still works.
func TestBakeBootloaderStaysInTree(t *testing.T) {
	const efiDir = "usr/lib/systemd/boot/efi"
	const efi = efiDir + "/systemd-bootx64.efi"
	const loader = "MZ systemd-boot from inside the tree"
	for _, tc := range []struct {
		name string
		base func(s *hostSentinel) []tarEntry
		want []string // error parts; none: the bake succeeds
	}{
		{
			name: "absolute symlink to a host file",
			base: func(s *hostSentinel) []tarEntry {
				return withEntries(fakeBase(true), nil, tarEntry{name: efi, link: s.path})
			},
			want: []string{"systemd-boot /" + efi, `a symlink to "` + atSentinel + `"`, "refused"},
		},
		{
			name: "relative symlink climbing out",
			base: func(s *hostSentinel) []tarEntry {
				return withEntries(fakeBase(true), nil, tarEntry{name: efi, link: s.climbing()})
			},
			want: []string{"systemd-boot /" + efi, "a symlink to", "refused"},
		},
		{
			name: "EFI directory symlinked to the host",
			base: func(s *hostSentinel) []tarEntry {
				return withEntries(fakeBase(true), []string{efi}, tarEntry{name: efiDir, link: s.dir})
			},
			want: []string{"systemd-boot /" + efi, "refused"},
		},
		{
			name: "relative symlink inside the tree",
			base: func(s *hostSentinel) []tarEntry {
				return withEntries(fakeBase(true), nil,
					tarEntry{name: "usr/share/sd/systemd-bootx64.efi", body: loader},
					tarEntry{name: efi, link: "../../../../../usr/share/sd/systemd-bootx64.efi"})
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newHostSentinel(t, "systemd-bootx64.efi")
			r := newRepo(t, tc.base(s), "role: worker\n")
			r.lock(t)
			_, err := r.bake(t)
			msg := ""
			if err != nil {
				msg = err.Error()
			}
			s.check(t, r.dir, msg)
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("bake: %v", err)
				}
				if got := espFileSize(t, filepath.Join(r.out, "test-worker.raw"), "/EFI/BOOT/BOOTX64.EFI"); got != int64(len(loader)) {
					t.Errorf("ESP /EFI/BOOT/BOOTX64.EFI has %d bytes, want the %d of the tree's systemd-boot", got, len(loader))
				}
				return
			}
			if err == nil {
				t.Fatal("bake succeeded; want an error naming systemd-boot")
			}
			for _, w := range tc.want {
				w = strings.ReplaceAll(w, atSentinel, s.path)
				if !strings.Contains(msg, w) {
					t.Errorf("error %q does not mention %q", msg, w)
				}
			}
			r.assertNoOutput(t)
		})
	}
}
