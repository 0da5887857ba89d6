package config

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// qemuOptions is the options line the bake writes into a qemu image's boot entry.
const qemuOptions = "root=PARTUUID=0f8c2a9e-6b1d-4d57-9a43-2c1e5b7d9f10 rootfstype=erofs ro kiln.platform=qemu console=ttyS0,115200 tsc=reliable"

// Edit changes a boot entry's options line as Ignition's kargs helper changes grub's: what is
// missing is appended, every occurrence of what must go is removed, and a line that already
// holds the arguments is left byte for byte.
func TestKernelArgsEdit(t *testing.T) {
	tests := []struct {
		name           string
		options        string
		k              KernelArgs
		want           string
		added, removed []string
	}{
		{name: "FCOS kernel-args page", options: qemuOptions + " mitigations=auto,nosmt",
			k:    KernelArgs{ShouldExist: []string{"mitigations=off"}, ShouldNotExist: []string{"mitigations=auto,nosmt"}},
			want: qemuOptions + " mitigations=off", added: []string{"mitigations=off"}, removed: []string{"mitigations=auto,nosmt"}},
		{name: "Ignition example: an entry of two arguments", options: qemuOptions + " somekarg",
			k:    KernelArgs{ShouldExist: []string{"example", "foo bar"}, ShouldNotExist: []string{"somekarg"}},
			want: qemuOptions + " example foo bar", added: []string{"example", "foo bar"}, removed: []string{"somekarg"}},
		{name: "already there: unchanged, spacing kept", options: "ro  quiet\tfoo bar ",
			k: KernelArgs{ShouldExist: []string{"quiet", "foo bar"}, ShouldNotExist: []string{"splash"}}, want: "ro  quiet\tfoo bar "},
		{name: "two arguments apart are not the entry", options: "foo ro bar",
			k: KernelArgs{ShouldExist: []string{"foo bar"}}, want: "foo ro bar foo bar", added: []string{"foo bar"}},
		{name: "every occurrence removed", options: "quiet ro quiet loglevel=3 quiet",
			k: KernelArgs{ShouldNotExist: []string{"quiet"}}, want: "ro loglevel=3", removed: []string{"quiet"}},
		{name: "quotes do not count", options: `ro acpi_osi="!Windows 2020"`,
			k: KernelArgs{ShouldExist: []string{`"acpi_osi=!Windows 2020"`}}, want: `ro acpi_osi="!Windows 2020"`},
		{name: "appended before init's arguments", options: "ro -- single",
			k: KernelArgs{ShouldExist: []string{"quiet"}}, want: "ro quiet -- single", added: []string{"quiet"}},
		{name: "a removal that breaks an entry is made up for", options: "ro a b c",
			k:    KernelArgs{ShouldExist: []string{"a b"}, ShouldNotExist: []string{"b c"}},
			want: "ro a a b", added: []string{"a b"}, removed: []string{"b c"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, added, removed, err := tc.k.Edit(tc.options)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want || fmt.Sprint(added) != fmt.Sprint(tc.added) || fmt.Sprint(removed) != fmt.Sprint(tc.removed) {
				t.Errorf("Edit = %q +%q -%q\nwant %q +%q -%q", got, added, removed, tc.want, tc.added, tc.removed)
			}
			if !tc.k.HeldBy(got) {
				t.Errorf("HeldBy(%q) = false after Edit", got)
			}
			if again, a, r, _ := tc.k.Edit(got); again != got || a != nil || r != nil {
				t.Errorf("a second Edit changed %q to %q", got, again)
			}
		})
	}
	// Entries that can never all hold are an error, not an endless round of edits and reboots.
	if _, _, _, err := (KernelArgs{ShouldExist: []string{"x", "y"}, ShouldNotExist: []string{"x y"}}).Edit("ro"); err == nil {
		t.Error("Edit made x y hold and not hold")
	}
}

func TestKernelArgsHeldBy(t *testing.T) {
	k := KernelArgs{ShouldExist: []string{"mitigations=off"}, ShouldNotExist: []string{"mitigations=auto,nosmt"}}
	tests := []struct {
		line string
		want bool
	}{
		{qemuOptions + " mitigations=off\n", true}, // /proc/cmdline ends in a newline
		{qemuOptions, false},
		{qemuOptions + " mitigations=off mitigations=auto,nosmt", false},
		{"initrd=\\kiln\\a\\initrd.img " + qemuOptions + " mitigations=off", true},
		{qemuOptions + " -- mitigations=off", false}, // init's, not the kernel's
	}
	for _, tc := range tests {
		if got := k.HeldBy(tc.line); got != tc.want {
			t.Errorf("HeldBy(%q) = %v, want %v", tc.line, got, tc.want)
		}
	}
}

// Validate refuses, by JSON path, the kernel arguments a kiln image's boot depends on and
// entries a boot entry cannot hold; console= and the like pass.
func TestValidateKernelArgs(t *testing.T) {
	tests := []struct {
		name  string
		kargs string
		want  []string
	}{
		{name: "console and mitigations", kargs: `"shouldExist":["console=ttyS1,115200n8","mitigations=off"],"shouldNotExist":["console=ttyS0,115200","quiet"]`},
		{name: "root", kargs: `"shouldExist":["root=/dev/sda2"]`,
			want: []string{`kernelArguments.shouldExist[0]: "root=/dev/sda2": kiln sets root= itself: the boot entry names the slot's root partition`}},
		{name: "removing ro", kargs: `"shouldNotExist":["ro"]`,
			want: []string{`kernelArguments.shouldNotExist[0]: "ro": kiln sets ro itself: the root is always read-only`}},
		{name: "kiln parameters", kargs: `"shouldExist":["quiet kiln.config.url=https://h/x.ign"],"shouldNotExist":["kiln.platform=qemu"]`,
			want: []string{`kernelArguments.shouldExist[0]: "quiet kiln.config.url=https://h/x.ign": kiln.* arguments steer stage 1 and first boot`,
				`kernelArguments.shouldNotExist[0]: "kiln.platform=qemu": kiln.* arguments`}},
		{name: "by index", kargs: `"shouldExist":["quiet","console=ttyS1","kiln.platform=aws","noinitrd"]`,
			want: []string{`kernelArguments.shouldExist[2]: "kiln.platform=aws": kiln.* arguments steer stage 1 and first boot`,
				`kernelArguments.shouldExist[3]: "noinitrd": kiln-init runs from the slot's initramfs`}},
		{name: "another init", kargs: `"shouldExist":["init=/bin/sh","rdinit=/bin/sh"]`,
			want: []string{`kernelArguments.shouldExist[0]: "init=/bin/sh": kiln-init is stage 1's init`, `kernelArguments.shouldExist[1]: "rdinit=/bin/sh"`}},
		{name: "init's arguments", kargs: `"shouldExist":["-- single"]`,
			want: []string{`kernelArguments.shouldExist[0]: "-- single": a lone -- ends the kernel's arguments`}},
		{name: "a second line", kargs: `"shouldExist":["quiet\ninitrd /evil"]`,
			want: []string{`kernelArguments.shouldExist[0]: "quiet\ninitrd /evil" holds a control character: a boot entry's options are one line`}},
		{name: "blank and unbalanced", kargs: `"shouldExist":[" ","acpi_osi=\"Linux"]`,
			want: []string{"kernelArguments.shouldExist[0]: is empty", `kernelArguments.shouldExist[1]: "acpi_osi=\"Linux" has an unbalanced double quote`}},
		{name: "one undoes the other", kargs: `"shouldExist":["foo bar"],"shouldNotExist":["bar"]`,
			want: []string{`kernelArguments.shouldNotExist[0]: "bar" would remove what shouldExist[0] ("foo bar") adds`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := Parse([]byte(`{"ignition":{"version":"3.3.0"},"kernelArguments":{` + tc.kargs + `}}`))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			err = cfg.Validate()
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate accepted %s", tc.kargs)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Validate = %q\nwant it to say %q", err, w)
				}
			}
			if lines := strings.Count(err.Error(), "\n") + 1; lines != len(tc.want) {
				t.Errorf("Validate gave %d errors, want %d: %v", lines, len(tc.want), err)
			}
			if errors.Is(err, errUnsupported) {
				t.Error("a refused argument reads as a feature kiln lacks")
			}
		})
	}
}
