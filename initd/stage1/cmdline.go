package stage1

import (
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/kilnproject/kiln/internal/cmdline"
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

// ParseCmdline parses a kernel command line (see package cmdline for how it is split; what
// follows "--" is for init) and requires root=PARTUUID=<guid>.
func ParseCmdline(s string) (Cmdline, error) {
	line := cmdline.Parse(s)
	c := Cmdline{Raw: line.Raw, RootWait: DefaultRootWait, Kiln: map[string]string{}}
	var root string
	for _, p := range line.Params {
		switch {
		case p.Key == "root":
			root = p.Value
		case p.Key == "rootfstype":
			c.RootFSType = p.Value
		case p.Key == "ro" && !p.HasValue:
			c.ReadWrite = false
		case p.Key == "rw" && !p.HasValue:
			c.ReadWrite = true
		case strings.HasPrefix(p.Key, "kiln."):
			name := strings.TrimPrefix(p.Key, "kiln.")
			if name == "" {
				return Cmdline{}, fmt.Errorf("kernel cmdline: parameter %q has an empty kiln.* key", p)
			}
			c.Kiln[name] = p.Value
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
		d, err := cmdline.Duration(w)
		if err != nil {
			return Cmdline{}, fmt.Errorf("kernel cmdline: kiln.rootwait=%s: %w", w, err)
		}
		c.RootWait = d
	}
	return c, nil
}
