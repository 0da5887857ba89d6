package nodeimage

import (
	"slices"
	"strings"
)

// EntryOptions is the kernel command line of a systemd-boot entry: its options lines,
// joined as systemd-boot joins them; ok is false when it has none.
func EntryOptions(text string) (options string, ok bool) {
	options, lines := entryOptions(text)
	return options, len(lines) > 0
}

// entryOptions is EntryOptions and the indexes of the options lines.
func entryOptions(text string) (options string, lines []int) {
	var parts []string
	for i, l := range strings.Split(text, "\n") {
		key, value := strings.TrimSpace(l), ""
		if j := strings.IndexAny(key, " \t"); j >= 0 {
			key, value = key[:j], strings.TrimSpace(key[j+1:])
		}
		if key == "options" {
			parts = append(parts, value)
			lines = append(lines, i)
		}
	}
	return strings.Join(parts, " "), lines
}

// WithEntryOptions is the entry text with options as its one options line, where the first
// was (or appended when it had none); its other lines stay as they are.
func WithEntryOptions(text, options string) string {
	_, lines := entryOptions(text)
	all := strings.Split(text, "\n")
	if len(lines) == 0 {
		return strings.TrimRight(text, "\n") + "\noptions " + options + "\n"
	}
	all[lines[0]] = "options " + options
	for _, i := range slices.Backward(lines[1:]) {
		all = slices.Delete(all, i, i+1)
	}
	return strings.Join(all, "\n")
}
