package nodeimage

import "testing"

// An entry's options lines are one command line, as systemd-boot reads them; rewriting them
// leaves one options line where the first was and every other line as it is.
func TestEntryOptions(t *testing.T) {
	for _, tc := range []struct {
		name, text, options string
		ok                  bool
		with, want          string
	}{
		{"one line", "title kiln\nlinux /vmlinuz\noptions root=PARTUUID=x ro\n", "root=PARTUUID=x ro", true,
			"root=PARTUUID=x ro quiet", "title kiln\nlinux /vmlinuz\noptions root=PARTUUID=x ro quiet\n"},
		{"two lines joined, tabs", "title kiln\noptions\troot=PARTUUID=x\nlinux /vmlinuz\n  options ro\n", "root=PARTUUID=x ro", true,
			"root=PARTUUID=x rw", "title kiln\noptions root=PARTUUID=x rw\nlinux /vmlinuz\n"},
		{"none", "title kiln\nlinux /vmlinuz\n", "", false,
			"quiet", "title kiln\nlinux /vmlinuz\noptions quiet\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			options, ok := EntryOptions(tc.text)
			if options != tc.options || ok != tc.ok {
				t.Errorf("EntryOptions = %q, %v; want %q, %v", options, ok, tc.options, tc.ok)
			}
			if got := WithEntryOptions(tc.text, tc.with); got != tc.want {
				t.Errorf("WithEntryOptions = %q, want %q", got, tc.want)
			}
		})
	}
}
