package bake

import (
	"bytes"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/base64"
	"encoding/binary"
	"math/big"
	"strings"
)

// pemKey checks for "-----BEGIN <TYPE>PRIVATE KEY-----" ending at the marker at i (the BEGIN on
// the same line, at most 64 bytes before) and reports it only when what follows, up to its
// "-----END", decodes as the key the type names (pemBody, isKey): code and documentation that
// name the header, or show a shortened key, are not keys.
func pemKey(win []byte, i int) (kind string, start int, ok bool) {
	from := max(0, i-64)
	b := bytes.LastIndex(win[from:i], pemBegin)
	if b < 0 {
		return "", 0, false
	}
	b += from
	typ := string(win[b+len(pemBegin) : i])
	if strings.ContainsAny(typ, "\n\r-") || (typ != "" && !strings.HasSuffix(typ, " ")) {
		return "", 0, false
	}
	rest := win[i+len(pemMarker) : min(len(win), i+scanLookahead)]
	e := bytes.Index(rest, pemEnd)
	if e < 0 {
		return "", 0, false
	}
	der, headers, ok := pemBody(rest[:e])
	typ = strings.TrimSpace(typ)
	if !ok || !isKey(typ, der, headers) {
		return "", 0, false
	}
	if typ == "OPENSSH" {
		return "OpenSSH private key", b, true
	}
	if typ == "" {
		return "private key (PRIVATE KEY)", b, true
	}
	return "private key (" + typ + " PRIVATE KEY)", b, true
}

// pemBody decodes the text between a PEM header and its "-----END": optional RFC 1421 headers
// ("Proc-Type: 4,ENCRYPTED") and base64 lines. Lines may be indented, commented ("# "), quoted
// and joined ("…\n" + in code) or escaped into one line ("\n" in a JSON or YAML string): such
// decoration is taken off each line. The base64 may be wrapped at any width, or be one line,
// or be split by spaces (a block whose line ends were turned into spaces); an OpenPGP armor's
// checksum line ("=Ab3D") is dropped. Anything else in a line (an ellipsis, "<key data>")
// means the text is not a key.
func pemBody(text []byte) (der []byte, headers map[string]string, ok bool) {
	text = bytes.ReplaceAll(text, []byte(`\n`), []byte("\n"))
	text = bytes.ReplaceAll(text, []byte(`\r`), []byte("\n"))
	var body []byte
	for line := range bytes.SplitSeq(text, []byte("\n")) {
		l := bytes.TrimLeft(bytes.TrimSpace(line), "\"'#;*> \t")
		if q := bytes.IndexAny(l, "\"'"); q >= 0 {
			l = l[:q]
		}
		l = bytes.TrimRight(l, " \t\\,;")
		if len(l) == 0 {
			continue
		}
		if k, v, found := bytes.Cut(l, []byte(":")); found && len(body) == 0 {
			if headers == nil {
				headers = map[string]string{}
			}
			headers[string(bytes.TrimSpace(k))] = string(bytes.TrimSpace(v))
			continue
		}
		for f := range bytes.FieldsSeq(l) {
			if len(f) == 5 && f[0] == '=' && len(body) > 0 && bytes.IndexByte(f[1:], '=') < 0 {
				continue // an OpenPGP armor checksum
			}
			for _, c := range f {
				if !isBase64(c) {
					return nil, nil, false
				}
			}
			body = append(body, f...)
		}
	}
	der, err := base64.StdEncoding.DecodeString(string(body))
	if err != nil || len(der) == 0 {
		return nil, nil, false
	}
	return der, headers, true
}

// isKey reports whether der is the private key a PEM block of type typ holds: its ASN.1
// structure (PKCS #1 RSA, SEC 1 EC, OpenSSL DSA, PKCS #8 plain or encrypted, any other type a
// whole DER SEQUENCE), the openssh-key-v1 format, or for a block encrypted the legacy way
// (Proc-Type and DEK-Info headers) a non-empty body of whole cipher blocks.
func isKey(typ string, der []byte, headers map[string]string) bool {
	if strings.Contains(headers["Proc-Type"], "ENCRYPTED") {
		return headers["DEK-Info"] != "" && len(der)%8 == 0
	}
	positive := func(ns ...*big.Int) bool {
		for _, n := range ns {
			if n == nil || n.Sign() <= 0 {
				return false
			}
		}
		return true
	}
	full := func(v any) bool {
		rest, err := asn1.Unmarshal(der, v)
		return err == nil && len(rest) == 0
	}
	switch typ {
	case "OPENSSH":
		return isOpenSSHKey(der)
	case "RSA":
		var k struct {
			Version                     int
			N, E, D, P, Q, Dp, Dq, Qinv *big.Int
			AdditionalPrimes            []asn1.RawValue `asn1:"optional,omitempty"`
		}
		return full(&k) && positive(k.N, k.E, k.D, k.P, k.Q)
	case "EC":
		var k struct {
			Version    int
			PrivateKey []byte
			Curve      asn1.ObjectIdentifier `asn1:"optional,explicit,tag:0"`
			PublicKey  asn1.BitString        `asn1:"optional,explicit,tag:1"`
		}
		return full(&k) && k.Version == 1 && len(k.PrivateKey) > 0
	case "DSA":
		var k struct {
			Version       int
			P, Q, G, Y, X *big.Int
		}
		return full(&k) && positive(k.P, k.Q, k.G, k.Y, k.X)
	case "": // PKCS #8; attributes and a public key may follow the private key
		var k struct {
			Version    int
			Algorithm  pkix.AlgorithmIdentifier
			PrivateKey []byte
		}
		return full(&k) && (k.Version == 0 || k.Version == 1) && len(k.Algorithm.Algorithm) > 0 && len(k.PrivateKey) > 0
	case "ENCRYPTED": // PKCS #8 EncryptedPrivateKeyInfo
		var k struct {
			Algorithm pkix.AlgorithmIdentifier
			Data      []byte
		}
		return full(&k) && len(k.Algorithm.Algorithm) > 0 && len(k.Data) > 0
	}
	var v asn1.RawValue
	return full(&v) && v.Class == asn1.ClassUniversal && v.Tag == asn1.TagSequence && v.IsCompound && len(v.Bytes) > 0
}

// isOpenSSHKey reports whether b is an openssh-key-v1 private key (ssh-keygen's format, see
// OpenSSH's PROTOCOL.key): the magic, cipher, KDF and its options, at least one public key and
// the private section, whose two check integers match when it is not encrypted.
func isOpenSSHKey(b []byte) bool {
	const magic = "openssh-key-v1\x00"
	if !bytes.HasPrefix(b, []byte(magic)) {
		return false
	}
	b = b[len(magic):]
	next := func() ([]byte, bool) {
		if len(b) < 4 {
			return nil, false
		}
		n := binary.BigEndian.Uint32(b)
		if uint64(n) > uint64(len(b)-4) {
			return nil, false
		}
		s := b[4 : 4+n]
		b = b[4+n:]
		return s, true
	}
	cipher, ok1 := next()
	kdf, ok2 := next()
	_, ok3 := next() // KDF options
	if !ok1 || !ok2 || !ok3 || len(b) < 4 {
		return false
	}
	keys := binary.BigEndian.Uint32(b)
	b = b[4:]
	if keys == 0 || keys > 64 {
		return false
	}
	for range keys {
		if pub, ok := next(); !ok || len(pub) == 0 {
			return false
		}
	}
	priv, ok := next()
	if !ok || len(priv) < 8 || len(priv)%8 != 0 {
		return false
	}
	if string(cipher) == "none" {
		return string(kdf) == "none" && len(b) == 0 && bytes.Equal(priv[:4], priv[4:8])
	}
	return string(kdf) != "none" // an AEAD cipher's tag may follow the private section
}

func isBase64(c byte) bool {
	return c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '+' || c == '/' || c == '='
}

// pgpKey checks for an ASCII-armored "-----BEGIN PGP PRIVATE KEY BLOCK-----" ending at the
// marker at i, and reports it when its body decodes to an OpenPGP secret-key packet.
func pgpKey(win []byte, i int) (start int, ok bool) {
	b := i - len(pemBegin)
	if b < 0 || !bytes.Equal(win[b:i], pemBegin) {
		return 0, false
	}
	rest := win[i+len(pgpMarker) : min(len(win), i+scanLookahead)]
	e := bytes.Index(rest, pemEnd)
	if e < 0 {
		return 0, false
	}
	der, _, ok := pemBody(rest[:e])
	return b, ok && isPGPSecretKey(der)
}

// isPGPSecretKey reports whether b starts with an OpenPGP secret-key packet (RFC 9580 tag 5)
// that fits in b: a known version and, for versions 4 to 6, a known public-key algorithm.
func isPGPSecretKey(b []byte) bool {
	if len(b) < 2 || b[0]&0x80 == 0 {
		return false
	}
	var tag byte
	var n, hdr int
	if b[0]&0x40 != 0 { // new format
		tag = b[0] & 0x3f
		switch l := int(b[1]); {
		case l < 192:
			n, hdr = l, 2
		case l < 224 && len(b) >= 3:
			n, hdr = (l-192)<<8+int(b[2])+192, 3
		case l == 255 && len(b) >= 6:
			n, hdr = int(binary.BigEndian.Uint32(b[2:6])), 6
		default:
			return false
		}
	} else { // old format
		tag = (b[0] >> 2) & 0x0f
		switch b[0] & 3 {
		case 0:
			n, hdr = int(b[1]), 2
		case 1:
			if len(b) < 3 {
				return false
			}
			n, hdr = int(binary.BigEndian.Uint16(b[1:3])), 3
		case 2:
			if len(b) < 5 {
				return false
			}
			n, hdr = int(binary.BigEndian.Uint32(b[1:5])), 5
		default:
			return false
		}
	}
	if tag != 5 || n < 6 || n > len(b)-hdr {
		return false
	}
	body := b[hdr : hdr+n]
	switch body[0] {
	case 3:
		return true
	case 4, 5, 6:
		algo := body[5]
		if body[0] != 4 {
			if len(body) < 11 {
				return false
			}
		}
		switch algo {
		case 1, 2, 3, 16, 17, 18, 19, 20, 22, 25, 26, 27, 28:
			return true
		}
	}
	return false
}

var (
	oidPKCS7Data      = asn1.ObjectIdentifier{1, 2, 840, 113549, 1, 7, 1}
	oidKeyBag         = asn1.ObjectIdentifier{1, 2, 840, 113549, 1, 12, 10, 1, 1}
	oidShroudedKeyBag = asn1.ObjectIdentifier{1, 2, 840, 113549, 1, 12, 10, 1, 2}
	oidSafeContents   = asn1.ObjectIdentifier{1, 2, 840, 113549, 1, 12, 10, 1, 6}
	oidPKCS5          = asn1.ObjectIdentifier{1, 2, 840, 113549, 1, 5}     // PBES1, PBES2
	oidPKCS12PBE      = asn1.ObjectIdentifier{1, 2, 840, 113549, 1, 12, 1} // pbeWithSHAAnd…
)

// derKey names the key a file is when all of it (but trailing white space) is one DER
// structure: a private key that crypto/x509 parses (PKCS #1, PKCS #8, SEC 1), an OpenSSL DSA
// key, a PKCS #8 key of another algorithm, an encrypted PKCS #8 key (a password-based
// encryption scheme of PKCS #5 or #12), or a PKCS #12 file with a private key. "" otherwise:
// a certificate, a public key or other DER data.
func derKey(b []byte) string {
	var v asn1.RawValue
	rest, err := asn1.Unmarshal(b, &v)
	if err != nil || len(bytes.TrimSpace(rest)) != 0 || v.Class != asn1.ClassUniversal || v.Tag != asn1.TagSequence {
		return ""
	}
	der := v.FullBytes
	switch {
	case isKey("RSA", der, nil):
		return "private key (RSA, DER)"
	case isKey("EC", der, nil):
		return "private key (EC, DER)"
	case isKey("DSA", der, nil):
		return "private key (DSA, DER)"
	}
	if _, err := x509.ParsePKCS8PrivateKey(der); err == nil || isKey("", der, nil) {
		return "private key (PKCS #8, DER)"
	}
	var enc struct {
		Algorithm pkix.AlgorithmIdentifier
		Data      []byte
	}
	if r, err := asn1.Unmarshal(der, &enc); err == nil && len(r) == 0 && len(enc.Data) > 0 &&
		(hasPrefixOID(enc.Algorithm.Algorithm, oidPKCS5) || hasPrefixOID(enc.Algorithm.Algorithm, oidPKCS12PBE)) {
		return "private key (ENCRYPTED PRIVATE KEY, DER)"
	}
	if pkcs12HasKey(der) {
		return "PKCS #12 file with a private key"
	}
	return ""
}

func hasPrefixOID(oid, prefix asn1.ObjectIdentifier) bool {
	return len(oid) > len(prefix) && oid[:len(prefix)].Equal(prefix)
}

type contentInfo struct {
	ContentType asn1.ObjectIdentifier
	Content     asn1.RawValue `asn1:"tag:0,explicit,optional"`
}

type safeBag struct {
	ID         asn1.ObjectIdentifier
	Value      asn1.RawValue `asn1:"tag:0,explicit"`
	Attributes asn1.RawValue `asn1:"optional"`
}

// pkcs12HasKey reports whether der is a PKCS #12 PFX (RFC 7292: version 3, data or signed
// content) holding a key bag or a shrouded (encrypted) key bag in its unencrypted safe
// contents, where OpenSSL, Java's keytool and Windows put a key. A PFX of certificates only (a
// trust store) has none; a key inside encrypted safe contents cannot be seen without the
// password and is not reported.
func pkcs12HasKey(der []byte) bool {
	var pfx struct {
		Version  int
		AuthSafe contentInfo
		MacData  asn1.RawValue `asn1:"optional"`
	}
	if r, err := asn1.Unmarshal(der, &pfx); err != nil || len(r) != 0 || pfx.Version != 3 || !pfx.AuthSafe.ContentType.Equal(oidPKCS7Data) {
		return false
	}
	// Data content is an OCTET STRING of DER in the [0] (a RawValue keeps the [0]).
	var authSafe []byte
	if _, err := asn1.Unmarshal(pfx.AuthSafe.Content.Bytes, &authSafe); err != nil {
		return false
	}
	var infos []contentInfo
	if _, err := asn1.Unmarshal(authSafe, &infos); err != nil {
		return false
	}
	for _, ci := range infos {
		var bags []byte
		if ci.ContentType.Equal(oidPKCS7Data) {
			if _, err := asn1.Unmarshal(ci.Content.Bytes, &bags); err == nil && bagsHaveKey(bags, 0) {
				return true
			}
		}
	}
	return false
}

func bagsHaveKey(der []byte, depth int) bool {
	var bags []safeBag
	if _, err := asn1.Unmarshal(der, &bags); err != nil || depth > 4 {
		return false
	}
	for _, b := range bags {
		switch {
		case b.ID.Equal(oidKeyBag), b.ID.Equal(oidShroudedKeyBag):
			return true
		case b.ID.Equal(oidSafeContents) && bagsHaveKey(b.Value.Bytes, depth+1):
			return true
		}
	}
	return false
}
