// Package percent percent-encodes strings as RFC 3986 does: every byte but the unreserved
// characters (letters, digits, "-", ".", "_" and "~") becomes "%XX" with upper-case hex
// digits. AWS's SigV4 canonical URIs, Google's REST path segments and package URLs' versions
// all use it, each keeping a few more characters as they are.
package percent

import "strings"

// Encode percent-encodes every byte of s but the unreserved characters and the bytes in keep.
func Encode(s, keep string) string {
	const hexDigits = "0123456789ABCDEF"
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case 'A' <= c && c <= 'Z', 'a' <= c && c <= 'z', '0' <= c && c <= '9', c == '-', c == '.', c == '_', c == '~',
			strings.IndexByte(keep, c) >= 0:
			b.WriteByte(c)
		default:
			b.WriteByte('%')
			b.WriteByte(hexDigits[c>>4])
			b.WriteByte(hexDigits[c&15])
		}
	}
	return b.String()
}
