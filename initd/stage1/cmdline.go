package stage1

import (
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
)

// DefaultRootWait bounds how long stage 1 waits for the root disk to appear when the command line
// does not set kiln.rootwait=.
const DefaultRootWait = 30 * time.Second

// Cmdline is the part of the kernel command line stage 1 acts on.
type Cmdline struct {
	// Raw is the command line as read from /proc/cmdline, trimmed.
	Raw string
	// RootPARTUUID is the lowercase partition GUID from root=PARTUUID=….
	RootPARTUUID string
	// RootFSType is the value of rootfstype=, empty when absent (stage 1 then probes squashfs, erofs).
	RootFSType string
	// ReadWrite is true when the last of ro/rw on the line is rw. The root is mounted read-only
	// regardless; the flag only lets stage 1 warn.
	ReadWrite bool
	// RootWait is kiln.rootwait= (a Go duration or whole seconds), DefaultRootWait when absent.
	RootWait time.Duration
	// Kiln holds every kiln.* parameter, keyed without the "kiln." prefix (kiln.platform=qemu is
	// Kiln["platform"] == "qemu"). A key without a value maps to "".
	Kiln map[string]string
}

// Platform returns kiln.platform= (qemu, aws, gce, metal), empty when absent.
func (c Cmdline) Platform() string { return c.Kiln["platform"] }

// ParseCmdline parses a kernel command line. It splits it like the kernel does (spaces separate
// parameters, double quotes group), stops at "--" (what follows is for init), and requires
// root=PARTUUID=<guid>.
func ParseCmdline(s string) (Cmdline, error) {
	c := Cmdline{Raw: strings.TrimSpace(s), RootWait: DefaultRootWait, Kiln: map[string]string{}}
	var root string
	for _, p := range splitCmdline(s) {
		if p == "--" {
			break
		}
		key, val, hasVal := strings.Cut(p, "=")
		switch {
		case key == "root":
			root = val
		case key == "rootfstype":
			c.RootFSType = val
		case key == "ro" && !hasVal:
			c.ReadWrite = false
		case key == "rw" && !hasVal:
			c.ReadWrite = true
		case strings.HasPrefix(key, "kiln."):
			name := strings.TrimPrefix(key, "kiln.")
			if name == "" {
				return Cmdline{}, fmt.Errorf("kernel cmdline: parameter %q has an empty kiln.* key", p)
			}
			c.Kiln[name] = val
		}
	}
	if root == "" {
		return Cmdline{}, fmt.Errorf("kernel cmdline: root= is missing (want root=PARTUUID=<guid>) in %q", c.Raw)
	}
	id, ok := strings.CutPrefix(root, "PARTUUID=")
	if !ok {
		return Cmdline{}, fmt.Errorf("kernel cmdline: root=%s is not supported (want root=PARTUUID=<guid>)", root)
	}
	if _, err := uuid.Parse(id); err != nil || len(id) != 36 {
		return Cmdline{}, fmt.Errorf("kernel cmdline: root=%s: %q is not a partition GUID", root, id)
	}
	c.RootPARTUUID = strings.ToLower(id)
	if w, ok := c.Kiln["rootwait"]; ok {
		d, err := parseWait(w)
		if err != nil {
			return Cmdline{}, fmt.Errorf("kernel cmdline: kiln.rootwait=%s: %w", w, err)
		}
		c.RootWait = d
	}
	return c, nil
}

func parseWait(s string) (time.Duration, error) {
	var secs uint
	if _, err := fmt.Sscanf(s, "%d", &secs); err == nil && fmt.Sprint(secs) == s {
		return time.Duration(secs) * time.Second, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("want whole seconds or a duration like 90s")
	}
	return d, nil
}

// splitCmdline splits on unquoted whitespace and removes the double quotes, like the kernel's
// next_arg.
func splitCmdline(s string) []string {
	var out []string
	var cur strings.Builder
	inQuote, inWord := false, false
	for _, r := range s {
		switch {
		case r == '"':
			inQuote = !inQuote
			inWord = true
		case !inQuote && (r == ' ' || r == '\t' || r == '\n'):
			if inWord {
				out = append(out, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if inWord {
		out = append(out, cur.String())
	}
	return out
}
