package pki

import (
	"crypto/rand"
	"fmt"
	"regexp"
	"strings"
)

// Token is a Kubernetes bootstrap token, <id>.<secret>: the ID is 6 and the secret 16
// characters of [a-z0-9]. The API server knows it as the Secret
// kube-system/bootstrap-token-<id>; a kubelet presents it as a bearer token.
type Token struct{ ID, Secret string }

var tokenRE = regexp.MustCompile(`^([a-z0-9]{6})\.([a-z0-9]{16})$`)

const tokenChars = "abcdefghijklmnopqrstuvwxyz0123456789"

// NewToken makes a random bootstrap token.
func NewToken() (Token, error) {
	s, err := randomString(6 + 16)
	if err != nil {
		return Token{}, fmt.Errorf("new bootstrap token: %w", err)
	}
	return Token{ID: s[:6], Secret: s[6:]}, nil
}

// randomString draws n characters of tokenChars uniformly (rejection sampling).
func randomString(n int) (string, error) {
	var b strings.Builder
	buf := make([]byte, 64)
	for b.Len() < n {
		if _, err := rand.Read(buf); err != nil {
			return "", err
		}
		for _, c := range buf {
			// 252 = 7*36: values above would bias the draw.
			if c < 252 && b.Len() < n {
				b.WriteByte(tokenChars[int(c)%len(tokenChars)])
			}
		}
	}
	return b.String(), nil
}

// ParseToken parses "<id>.<secret>"; surrounding white space (a file's newline) is
// ignored.
func ParseToken(s string) (Token, error) {
	m := tokenRE.FindStringSubmatch(strings.TrimSpace(s))
	if m == nil {
		return Token{}, fmt.Errorf("bootstrap token %q is not <6 of [a-z0-9]>.<16 of [a-z0-9]>", redact(strings.TrimSpace(s)))
	}
	return Token{ID: m[1], Secret: m[2]}, nil
}

// redact keeps what an error may show of a malformed token: the part before the dot.
func redact(s string) string {
	if id, _, ok := strings.Cut(s, "."); ok {
		return id + ".<redacted>"
	}
	if len(s) > 6 {
		return s[:6] + "…"
	}
	return s
}

// String is "<id>.<secret>".
func (t Token) String() string { return t.ID + "." + t.Secret }
