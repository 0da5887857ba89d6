package source

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"unicode/utf8"

	"github.com/kilnproject/kiln/internal/decompress"
)

// Decode undoes the encodings that cloud user data commonly carries, so every source may
// hold a config as written, gzip'd, base64'd, or base64 of gzip. It applies at most one
// base64 step and then at most one gzip step:
//
//  1. Base64 is assumed only when all of these hold: the payload, with ASCII white space
//     removed (line-wrapped base64 is common), is non-empty and consists solely of the
//     standard or the URL-safe base64 alphabet plus '=' padding; it decodes (padded or
//     unpadded); and the decoded bytes look like a config: they start with the gzip magic,
//     or they are UTF-8 text whose first non-blank character is '{' (JSON) or which
//     contains ':' (a YAML mapping). A plain JSON or YAML config always contains '{' or
//     ':' and spaces, none of which is in the base64 alphabet, so it is never misread as
//     base64. A payload that merely happens to decode to binary noise is kept as is.
//  2. Gzip is assumed when the bytes start with the gzip magic 1f 8b; they are gunzipped,
//     reading at most MaxConfigSize bytes. A corrupt gzip stream is an error.
//
// Anything else is returned unchanged, for the config parser to accept or reject.
func Decode(data []byte) ([]byte, error) {
	if decoded, ok := decodeBase64(data); ok {
		data = decoded
	}
	if decompress.ByMagic(data) == decompress.Gzip {
		out, err := gunzip(data)
		if err != nil {
			return nil, fmt.Errorf("decode gzip user data: %w", err)
		}
		return out, nil
	}
	return data, nil
}

func gunzip(data []byte) ([]byte, error) {
	zr, err := decompress.Open(bytes.NewReader(data), decompress.Gzip)
	if err != nil {
		return nil, err
	}
	defer zr.Close()
	return ReadLimited(zr, MaxConfigSize, "the gunzipped user data")
}

// decodeBase64 returns the decoded payload and true when data is base64 by the rule in
// Decode's documentation.
func decodeBase64(data []byte) ([]byte, bool) {
	compact := make([]byte, 0, len(data))
	for _, c := range data {
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v':
			continue
		case isBase64Char(c):
			compact = append(compact, c)
		default:
			return nil, false
		}
	}
	if len(compact) == 0 {
		return nil, false
	}
	for _, enc := range []*base64.Encoding{
		base64.StdEncoding, base64.URLEncoding, base64.RawStdEncoding, base64.RawURLEncoding,
	} {
		out := make([]byte, enc.DecodedLen(len(compact)))
		n, err := enc.Strict().Decode(out, compact)
		if err != nil {
			continue
		}
		out = out[:n]
		if looksLikeConfig(out) {
			return out, true
		}
		return nil, false
	}
	return nil, false
}

func isBase64Char(c byte) bool {
	return c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' ||
		c == '+' || c == '/' || c == '-' || c == '_' || c == '='
}

// looksLikeConfig reports whether decoded base64 is plausibly a config: gzip, or UTF-8
// text that starts like JSON or contains a YAML mapping's ':'.
func looksLikeConfig(b []byte) bool {
	if decompress.ByMagic(b) == decompress.Gzip {
		return true
	}
	if len(b) == 0 || !utf8.Valid(b) {
		return false
	}
	trimmed := bytes.TrimLeft(b, " \t\r\n\ufeff")
	if len(trimmed) > 0 && trimmed[0] == '{' {
		return true
	}
	return bytes.IndexByte(b, ':') >= 0
}
