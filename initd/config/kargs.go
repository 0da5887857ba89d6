package config

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// KernelArgs are a config's kernelArguments. Each entry is one kernel argument or several
// separated by spaces, which then belong together, in that order, as Ignition has them
// ("foo bar"): an entry exists on a command line when its arguments stand there next to each
// other. Double quotes group as the kernel reads them (key="a b" is one argument) and do not
// count when comparing.
type KernelArgs struct {
	ShouldExist, ShouldNotExist []string
}

// KernelArgs returns the config's kernelArguments.
func (c *Config) KernelArgs() KernelArgs {
	var k KernelArgs
	for _, a := range c.Ignition.KernelArguments.ShouldExist {
		k.ShouldExist = append(k.ShouldExist, string(a))
	}
	for _, a := range c.Ignition.KernelArguments.ShouldNotExist {
		k.ShouldNotExist = append(k.ShouldNotExist, string(a))
	}
	return k
}

// Empty reports whether the config asks nothing of the kernel command line.
func (k KernelArgs) Empty() bool { return len(k.ShouldExist) == 0 && len(k.ShouldNotExist) == 0 }

// HeldBy reports whether the kernel command line line already is what k asks: every
// shouldExist entry is on it and no shouldNotExist entry is. What follows a lone "--" is
// init's, not the kernel's, and does not count.
func (k KernelArgs) HeldBy(line string) bool {
	missing, unwanted := k.Unmet(line)
	return len(missing) == 0 && len(unwanted) == 0
}

// Unmet lists the shouldExist entries line lacks and the shouldNotExist entries it has.
func (k KernelArgs) Unmet(line string) (missing, unwanted []string) {
	params, _ := splitInit(argWords(line))
	for _, e := range k.ShouldExist {
		if indexWords(params, argWords(e)) < 0 {
			missing = append(missing, e)
		}
	}
	for _, e := range k.ShouldNotExist {
		if indexWords(params, argWords(e)) >= 0 {
			unwanted = append(unwanted, e)
		}
	}
	return missing, unwanted
}

func (k KernelArgs) holds(params []string) bool {
	return k.HeldBy(strings.Join(params, " "))
}

// Edit applies k to options, a boot entry's kernel command line, as Ignition's kargs helper
// does: each shouldExist entry missing from it is appended (before a lone "--"), then every
// occurrence of each shouldNotExist entry is removed — again, should a removal have taken an
// argument a shouldExist entry needs. added and removed are the entries that changed it; when
// there is none, out is options exactly. Entries that cannot all hold are an error.
func (k KernelArgs) Edit(options string) (out string, added, removed []string, err error) {
	params, init := splitInit(argWords(options))
	for round := 0; round < 3 && !k.holds(params); round++ {
		for _, e := range k.ShouldExist {
			if w := argWords(e); indexWords(params, w) < 0 {
				params = append(params, w...)
				added = appendNew(added, e)
			}
		}
		for _, e := range k.ShouldNotExist {
			w := argWords(e)
			for i := indexWords(params, w); i >= 0; i = indexWords(params, w) {
				params = slices.Delete(params, i, i+len(w))
				removed = appendNew(removed, e)
			}
		}
	}
	if !k.holds(params) {
		return "", nil, nil, fmt.Errorf("kernelArguments: shouldExist %q and shouldNotExist %q cannot all hold on one command line", k.ShouldExist, k.ShouldNotExist)
	}
	if len(added) == 0 && len(removed) == 0 {
		return options, nil, nil, nil
	}
	if init != nil {
		params = append(append(params, "--"), init...)
	}
	return strings.Join(params, " "), added, removed, nil
}

func appendNew(list []string, s string) []string {
	if slices.Contains(list, s) {
		return list
	}
	return append(list, s)
}

// contractArgs are the kernel arguments a kiln image's boot depends on, with why a config may
// not set or remove them: what the bake writes into a slot's boot entry (root=PARTUUID=,
// rootfstype=, ro, kiln.platform= and the other kiln.* arguments, checked apart) and what
// would keep kiln-init's initramfs from running as the first process.
var contractArgs = map[string]string{
	"root":       "kiln sets root= itself: the boot entry names the slot's root partition",
	"rootfstype": "kiln sets rootfstype= itself: the bake chose the root filesystem",
	"ro":         "kiln sets ro itself: the root is always read-only",
	"rw":         "kiln sets ro itself: the root is always read-only",
	"init":       "kiln-init is stage 1's init and starts systemd itself: init= and rdinit= would replace it",
	"rdinit":     "kiln-init is stage 1's init and starts systemd itself: init= and rdinit= would replace it",
	"initrd":     "the boot entry names the slot's initramfs, kiln-init's",
	"noinitrd":   "kiln-init runs from the slot's initramfs: the kernel would boot without it",
}

// checkKernelArgs checks kernelArguments: entries the boot entry's one options line can hold,
// none that would break the image's boot, and no shouldNotExist entry that undoes a
// shouldExist one (first boot would never converge).
func checkKernelArgs(k KernelArgs) []error {
	var errs []error
	for i, e := range k.ShouldExist {
		if err := checkKernelArg(e); err != nil {
			errs = append(errs, &FieldError{Path: fmt.Sprintf("kernelArguments.shouldExist[%d]", i), Err: err})
		}
	}
	for i, e := range k.ShouldNotExist {
		if err := checkKernelArg(e); err != nil {
			errs = append(errs, &FieldError{Path: fmt.Sprintf("kernelArguments.shouldNotExist[%d]", i), Err: err})
		}
	}
	for j, n := range k.ShouldNotExist {
		for i, e := range k.ShouldExist {
			if indexWords(argWords(e), argWords(n)) >= 0 {
				errs = append(errs, &FieldError{Path: fmt.Sprintf("kernelArguments.shouldNotExist[%d]", j),
					Err: fmt.Errorf("%q would remove what shouldExist[%d] (%q) adds", n, i, e)})
			}
		}
	}
	return errs
}

// checkKernelArg checks one kernelArguments entry.
func checkKernelArg(e string) error {
	if strings.ContainsFunc(e, func(r rune) bool { return r < ' ' && r != '\t' || r == 0x7f }) {
		return fmt.Errorf("%q holds a control character: a boot entry's options are one line", e)
	}
	if strings.Count(e, `"`)%2 != 0 {
		return fmt.Errorf("%q has an unbalanced double quote", e)
	}
	words := argWords(e)
	if len(words) == 0 {
		return errors.New("is empty")
	}
	for _, w := range words {
		key, _, _ := strings.Cut(unquote(w), "=")
		switch {
		case w == "--":
			return fmt.Errorf("%q: a lone -- ends the kernel's arguments (what follows is init's)", e)
		case strings.HasPrefix(key, "kiln."):
			return fmt.Errorf("%q: kiln.* arguments steer stage 1 and first boot, which read this config: set them where the boot is set up (the image definition's kernel.args, kiln serve, kiln run --append)", e)
		case contractArgs[key] != "":
			return fmt.Errorf("%q: %s", e, contractArgs[key])
		}
	}
	return nil
}

// argWords splits a kernel command line (or a kernelArguments entry) into its arguments as
// written: at white space outside double quotes, quotes kept.
func argWords(s string) []string {
	var words []string
	var cur strings.Builder
	quoted := false
	for _, r := range s {
		switch {
		case r == '"':
			quoted = !quoted
			cur.WriteRune(r)
		case !quoted && (r == ' ' || r == '\t' || r == '\n' || r == '\r' || r == '\v' || r == '\f'):
			if cur.Len() > 0 {
				words = append(words, cur.String())
				cur.Reset()
			}
		default:
			cur.WriteRune(r)
		}
	}
	if cur.Len() > 0 {
		words = append(words, cur.String())
	}
	return words
}

// splitInit cuts words at a lone "--": the kernel's arguments, and init's after it (nil
// when there is no "--").
func splitInit(words []string) (params, init []string) {
	if i := slices.Index(words, "--"); i >= 0 {
		return words[:i:i], append([]string{}, words[i+1:]...)
	}
	return words, nil
}

// indexWords is where seq starts in words, comparing arguments as the kernel reads them
// (without their quotes); -1 when it is not there or empty.
func indexWords(words, seq []string) int {
	if len(seq) == 0 {
		return -1
	}
	for i := 0; i+len(seq) <= len(words); i++ {
		match := true
		for j, s := range seq {
			if unquote(words[i+j]) != unquote(s) {
				match = false
				break
			}
		}
		if match {
			return i
		}
	}
	return -1
}

// unquote is an argument as the kernel reads it: its double quotes dropped.
func unquote(w string) string { return strings.ReplaceAll(w, `"`, "") }
