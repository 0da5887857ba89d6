package gce

import (
	"fmt"
	"regexp"
	"strings"
	"unicode"
	"unicode/utf8"
)

// DigestLabel is the label kiln publish gce puts on an image: the first 63 hex digits of the
// SHA-256 of the tarball it was made from (a GCE label value holds at most 63 characters). The
// image's description carries the whole digest as "sha256:<hex>".
const DigestLabel = "kiln-sha256"

// ProvenanceLabel is the label kiln publish gce --key adds: the first 63 hex digits of the
// SHA-256 of the signed provenance the tarball was checked against; the description carries
// the whole digest as "provenance sha256:<hex>".
const ProvenanceLabel = "kiln-provenance"

// gceMaxLabels is how many labels GCE allows on a resource.
const gceMaxLabels = 64

// gceImageName is the syntax of a GCE resource name (RFC 1035, at most 63 characters).
var gceImageName = regexp.MustCompile(`^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$`)

// CheckImageName reports whether name is a valid GCE image or family name.
func CheckImageName(name string) error {
	if !gceImageName.MatchString(name) {
		return fmt.Errorf("%q is not a GCE resource name: 1-63 characters, lowercase letters, digits and '-', starting with a letter and not ending with '-'", name)
	}
	return nil
}

// ParseLabels parses K=V pairs into labels, checked with GCE's rules: keys of 1-63
// characters starting with a lowercase letter, values of 0-63 characters, both of lowercase
// letters (international ones too), digits, '_' and '-'; at most 62 labels, as kiln adds its
// own DigestLabel and, with --key, ProvenanceLabel, which may not be given.
func ParseLabels(pairs []string) (map[string]string, error) {
	labels := make(map[string]string, len(pairs))
	for _, p := range pairs {
		k, v, ok := strings.Cut(p, "=")
		if !ok {
			return nil, fmt.Errorf("%q: want KEY=VALUE", p)
		}
		if err := checkGCELabelPart(k, true); err != nil {
			return nil, fmt.Errorf("%q: key %w", p, err)
		}
		if err := checkGCELabelPart(v, false); err != nil {
			return nil, fmt.Errorf("%q: value %w", p, err)
		}
		if k == DigestLabel || k == ProvenanceLabel {
			return nil, fmt.Errorf("%q: %s is set by kiln", p, k)
		}
		if _, dup := labels[k]; dup {
			return nil, fmt.Errorf("%q: key %s given twice", p, k)
		}
		labels[k] = v
	}
	if len(labels) > gceMaxLabels-2 {
		return nil, fmt.Errorf("%d labels: GCE allows %d, and kiln adds %s and %s", len(labels), gceMaxLabels, DigestLabel, ProvenanceLabel)
	}
	return labels, nil
}

// checkGCELabelPart checks a label key (key true) or value against GCE's rules.
func checkGCELabelPart(s string, key bool) error {
	n := utf8.RuneCountInString(s)
	switch {
	case key && n == 0:
		return fmt.Errorf("is empty")
	case n > 63:
		return fmt.Errorf("has %d characters, at most 63 allowed", n)
	case key && !unicode.IsLower([]rune(s)[0]):
		return fmt.Errorf("must start with a lowercase letter")
	}
	for _, r := range s {
		if !unicode.IsLower(r) && !unicode.IsDigit(r) && r != '_' && r != '-' {
			return fmt.Errorf("has %q: only lowercase letters, digits, '_' and '-' are allowed", r)
		}
	}
	return nil
}

// gceDigestLabelValue is the value of DigestLabel for the hex SHA-256 digest.
func gceDigestLabelValue(digest string) string { return digest[:63] }

// gceDescriptionDigest is how the image's description records the whole digest.
func gceDescriptionDigest(digest string) string { return "sha256:" + digest }
