package facts

import (
	"fmt"
	"strings"
)

// maxHostname is the longest DNS name (RFC 1123 §2.1, and Kubernetes' limit for a
// DNS-1123 subdomain); maxLabel is the longest label between dots.
const (
	maxHostname = 253
	maxLabel    = 63
)

// ValidateHostname reports whether name is an RFC 1123 subdomain as Kubernetes requires
// for node names: at most 253 characters of dot-separated labels, each 1 to 63 characters
// of lower-case letters, digits and '-', starting and ending with a letter or digit.
func ValidateHostname(name string) error {
	if name == "" {
		return fmt.Errorf("hostname is empty")
	}
	if len(name) > maxHostname {
		return fmt.Errorf("hostname %q is %d characters long; at most %d are allowed", name, len(name), maxHostname)
	}
	for i, label := range strings.Split(name, ".") {
		if err := validLabel(label); err != nil {
			return fmt.Errorf("hostname %q: label %d %w", name, i+1, err)
		}
	}
	return nil
}

func validLabel(l string) error {
	switch {
	case l == "":
		return fmt.Errorf("is empty")
	case len(l) > maxLabel:
		return fmt.Errorf("%q is %d characters long; at most %d are allowed", l, len(l), maxLabel)
	case l[0] == '-' || l[len(l)-1] == '-':
		return fmt.Errorf("%q must start and end with a lower-case letter or digit", l)
	}
	for _, c := range l {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return fmt.Errorf("%q contains %q; only lower-case letters, digits and '-' are allowed", l, c)
		}
	}
	return nil
}

// placeholder reports whether name is what a machine calls itself before anyone named
// it: the kernel's "(none)", systemd's and Debian's "localhost" variants.
func placeholder(name string) bool {
	switch name {
	case "", "(none)", "localhost", "localhost.localdomain", "localhost6", "localhost6.localdomain6":
		return true
	}
	return false
}

// normalize lower-cases a hostname and drops one trailing dot (an absolute DNS name).
func normalize(name string) string {
	return strings.TrimSuffix(strings.ToLower(strings.TrimSpace(name)), ".")
}

// Hostname sources, recorded in Facts.HostnameSource.
const (
	FromConfig    = "config"
	fromPlatform  = "platform"
	fromKernel    = "kernel"
	fromGenerated = "generated"
)

// chooseHostname applies the precedence config > platform > kernel > generated.
//
// Every candidate is lower-cased (as kubeadm does for node names) and must then be an RFC
// 1123 subdomain; an invalid candidate is an error naming its source, never skipped.
// A placeholder ("localhost", "(none)") in the config is an error too: the user asked for
// it and every node would get the same name. From the platform or the kernel a
// placeholder just means "unknown" and the next source is asked. When nothing names the
// machine, the name is generated from the primary MAC address ("kiln-525400123456") or,
// without one, from the machine id ("kiln-" + its first 12 hex digits), so it is stable
// across boots of the same machine; without either it is an error.
func chooseHostname(config, platform, kernel, mac, machineID string) (name, source string, err error) {
	if c := normalize(config); c != "" {
		if placeholder(c) {
			return "", "", fmt.Errorf("hostname %q from the config is a placeholder; give the node a real name", config)
		}
		if err := ValidateHostname(c); err != nil {
			return "", "", fmt.Errorf("hostname from the config: %w", err)
		}
		return c, FromConfig, nil
	}
	for _, cand := range []struct{ value, source string }{{platform, fromPlatform}, {kernel, fromKernel}} {
		c := normalize(cand.value)
		if placeholder(c) {
			continue
		}
		if err := ValidateHostname(c); err != nil {
			return "", "", fmt.Errorf("hostname from the %s: %w", cand.source, err)
		}
		return c, cand.source, nil
	}
	switch {
	case mac != "":
		return "kiln-" + strings.ReplaceAll(mac, ":", ""), fromGenerated, nil
	case len(machineID) >= 12:
		return "kiln-" + machineID[:12], fromGenerated, nil
	}
	return "", "", fmt.Errorf("no hostname: none in the config, from the platform or the kernel, and no MAC address or machine id to derive one from")
}
