package blockdev

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// Signature is what blkid finds on a device.
type Signature struct {
	// Blank: blkid found nothing. Ambiguous: it found conflicting signatures.
	Blank, Ambiguous bool
	// Type is the filesystem (or other content: crypto_LUKS, linux_raid_member, swap);
	// PTType a partition table's type.
	Type, PTType, Label, UUID string
}

// String describes the signature as an error message names it: `an ext4 filesystem
// (label "data", UUID …)`, `a partition table (gpt)`, `nothing`.
func (s Signature) String() string {
	switch {
	case s.Blank:
		return "nothing"
	case s.Ambiguous:
		return "conflicting signatures (blkid -p reports an ambivalent result)"
	case s.PTType != "" && s.Type == "":
		return fmt.Sprintf("a partition table (%s)", s.PTType)
	case s.Type == "":
		return "an unrecognised signature"
	}
	what := "filesystem"
	switch s.Type {
	case "crypto_LUKS":
		what = "volume"
	case "linux_raid_member":
		what = "signature"
	case "swap":
		what = "area"
	}
	article := "a "
	if strings.ContainsRune("aeiouxAEIOUX", rune(s.Type[0])) { // an ext4, an xfs
		article = "an "
	}
	return article + s.Type + " " + what + s.naming()
}

// naming is ` (label "data", UUID …)`, or "" when the signature has neither.
func (s Signature) naming() string {
	var parts []string
	if s.Label != "" {
		parts = append(parts, fmt.Sprintf("label %q", s.Label))
	}
	if s.UUID != "" {
		parts = append(parts, "UUID "+s.UUID)
	}
	if len(parts) == 0 {
		return ""
	}
	return " (" + strings.Join(parts, ", ") + ")"
}

// Probe asks blkid, in low-level probing mode (no cache), what dev carries. A partition
// whose only finding is its own partition entry (blkid -p reports PART_ENTRY_* and exits
// 0) is blank.
func Probe(ctx context.Context, dev string) (Signature, error) {
	s, err := ProbeExact(ctx, dev)
	if err != nil {
		return Signature{}, err
	}
	s.Blank = s.Blank || !s.Ambiguous && s.Type == "" && s.PTType == "" && s.Label == "" && s.UUID == ""
	return s, nil
}

// ProbeExact is Probe without its leniency: Blank only when blkid found nothing at all (it
// exits 2), so a partition's own entry is an unrecognised signature — what a check that must
// never take a partition for an empty disk wants.
func ProbeExact(ctx context.Context, dev string) (Signature, error) {
	out, err := RunTool(ctx, "blkid", "-p", "-s", "TYPE", "-s", "PTTYPE", "-s", "LABEL", "-s", "UUID", "-o", "export", dev)
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		switch exit.ExitCode() {
		case 2:
			return Signature{Blank: true}, nil
		case 8:
			return Signature{Ambiguous: true}, nil
		}
	}
	if err != nil {
		return Signature{}, fmt.Errorf("probe: %w", err)
	}
	var sig Signature
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), "=")
		if !ok {
			continue
		}
		v = unescapeExport(v)
		switch k {
		case "TYPE":
			sig.Type = v
		case "PTTYPE":
			sig.PTType = v
		case "LABEL":
			sig.Label = v
		case "UUID":
			sig.UUID = v
		}
	}
	return sig, nil
}

// unescapeExport undoes the shell quoting of blkid -o export (a backslash before
// spaces and other special characters).
func unescapeExport(v string) string {
	if !strings.Contains(v, `\`) {
		return v
	}
	var b strings.Builder
	for i := 0; i < len(v); i++ {
		if v[i] == '\\' && i+1 < len(v) {
			i++
		}
		b.WriteByte(v[i])
	}
	return b.String()
}

// RunTool runs a tool with LC_ALL=C and returns its standard output. A failure includes
// the tool's standard error; an *exec.ExitError stays reachable through errors.As.
func RunTool(ctx context.Context, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		msg := strings.TrimSpace(stderr.String())
		if msg == "" {
			msg = strings.TrimSpace(string(out))
		}
		if msg != "" {
			return out, fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, msg)
		}
		return out, fmt.Errorf("%s %s: %w", name, strings.Join(args, " "), err)
	}
	return out, nil
}
