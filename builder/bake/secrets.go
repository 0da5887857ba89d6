package bake

import (
	"bytes"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/big"
	"runtime"
	"sort"
	"strings"
	"sync"
)

// Finding is a secret found in a tree.
type Finding struct {
	// Path is the file's absolute path in the image, "/etc/ssh/ssh_host_ed25519_key".
	Path string
	// Line is the 1-based line of the first occurrence in the file.
	Line int
	// Kind says what it is: "private key (RSA PRIVATE KEY)", "OpenSSH private key",
	// "Kubernetes bootstrap token".
	Kind string
}

func (f Finding) String() string { return fmt.Sprintf("%s:%d: %s", f.Path, f.Line, f.Kind) }

// tokenDirs are where a bootstrap token would be configuration; elsewhere (binaries, data) the
// pattern is too common to mean anything.
var tokenDirs = []string{"etc/", "usr/lib/kiln/"}

const (
	scanChunk = 1 << 20
	// scanLookahead is how many bytes after a match start a check may read: a whole PEM key
	// (an 8192-bit RSA key takes 6.3 KiB; indented or quoted lines take more).
	scanLookahead = 32 << 10
	// scanLookbehind is how many bytes before a match a check may read.
	scanLookbehind = 72
)

var (
	pemMarker   = []byte("PRIVATE KEY-----")
	pemBegin    = []byte("-----BEGIN ")
	pemEnd      = []byte("-----END ")
	tokenMarker = byte('.')
)

// ScanSecrets reads every regular file of fsys (symlinks are not followed) and reports private
// keys anywhere, and Kubernetes bootstrap tokens (<6 of [a-z0-9]>.<16 of [a-z0-9]> as a whole
// word) in /etc and /usr/lib/kiln. Each file is reported at most once per kind, at its first
// occurrence.
//
// A private key is a PEM "… PRIVATE KEY" block whose body decodes and parses as the key its
// type names: RSA, EC, DSA, PKCS #8, OpenSSH, or one of them encrypted. The block may be
// indented, commented, quoted or escaped into a string (a key in a YAML or JSON config is
// found). A header alone, or a body that is not a key — an example shortened with "...",
// a placeholder — is not reported: cloud-init's Python sources and their .pyc files
// carry such examples in their documentation strings.
//
// Two kinds of file are judged by their first bytes: gzip, zstd and xz data is skipped (it
// holds no plaintext; image layers are such blobs), and programs and libraries (ELF) are not
// searched for keys, because some carry public self-test keys (Debian's libgnutls has four
// PEM private keys for its FIPS self-tests); a node's keys are files, not compiled in.
// Findings are sorted by path. The bake refuses an image with findings: secrets come with
// the node's config at first boot, never in the image.
func ScanSecrets(fsys fs.FS) ([]Finding, error) {
	paths := make(chan string, 64)
	var (
		mu       sync.Mutex
		findings []Finding
		errs     []error
		wg       sync.WaitGroup
	)
	workers := max(1, runtime.GOMAXPROCS(0))
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, scanChunk+scanLookahead+scanLookbehind)
			for p := range paths {
				fs, err := scanFile(fsys, p, buf)
				mu.Lock()
				if err != nil {
					errs = append(errs, err)
				}
				findings = append(findings, fs...)
				mu.Unlock()
			}
		}()
	}
	walkErr := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			paths <- p
		}
		return nil
	})
	close(paths)
	wg.Wait()
	if walkErr != nil {
		errs = append(errs, walkErr)
	}
	sort.Slice(findings, func(i, j int) bool {
		if findings[i].Path != findings[j].Path {
			return findings[i].Path < findings[j].Path
		}
		return findings[i].Kind < findings[j].Kind
	})
	if err := errors.Join(errs...); err != nil {
		return findings, fmt.Errorf("scan for secrets: %w", err)
	}
	return findings, nil
}

// scanFile streams one file through buf. Each window is the tail of the previous one plus a
// chunk: positions before from were judged already (they are kept as context for checks that
// look back), and a match is judged only once scanLookahead bytes after it are in the window
// or the file has ended, so each match is seen once, with its context, wherever chunks split.
func scanFile(fsys fs.FS, p string, buf []byte) ([]Finding, error) {
	f, err := fsys.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	tokens := false
	for _, d := range tokenDirs {
		tokens = tokens || strings.HasPrefix(p, d)
	}
	var out []Finding
	seen := map[string]bool{}
	add := func(line int, kind string) {
		if !seen[kind] {
			seen[kind] = true
			out = append(out, Finding{Path: "/" + p, Line: line, Kind: kind})
		}
	}
	have, from, lines := 0, 0, 0 // lines: newlines before the window
	keys := true
	for first := true; ; first = false {
		n, rerr := io.ReadFull(f, buf[have:])
		have += n
		eof := rerr == io.EOF || rerr == io.ErrUnexpectedEOF
		if rerr != nil && !eof {
			return out, fmt.Errorf("/%s: %w", p, rerr)
		}
		win := buf[:have]
		if first {
			switch sniff(win) {
			case "compressed":
				return nil, nil // no plaintext in there
			case "elf":
				keys = false
				if !tokens {
					return nil, nil
				}
			}
		}
		limit := have - scanLookahead
		if eof {
			limit = have
		}
		lineAt := func(i int) int { return lines + bytes.Count(win[:i], []byte{'\n'}) + 1 }
		for off := from; keys && off < limit; {
			i := bytes.Index(win[off:], pemMarker)
			if i < 0 || off+i >= limit {
				break
			}
			i += off
			if kind, start, ok := pemKey(win, i); ok {
				add(lineAt(start), kind)
			}
			off = i + len(pemMarker)
		}
		if tokens {
			for off := from; off < limit; {
				i := bytes.IndexByte(win[off:], tokenMarker)
				if i < 0 || off+i >= limit {
					break
				}
				i += off
				if isToken(win, i) {
					add(lineAt(i-6), "Kubernetes bootstrap token")
				}
				off = i + 1
			}
		}
		if eof {
			return out, nil
		}
		start := max(0, limit-scanLookbehind)
		lines += bytes.Count(win[:start], []byte{'\n'})
		have = copy(buf, win[start:])
		from = limit - start
	}
}

var magics = []struct {
	magic []byte
	kind  string
}{
	{[]byte("\x7fELF"), "elf"},
	{[]byte{0x1f, 0x8b}, "compressed"},             // gzip
	{[]byte{0x28, 0xb5, 0x2f, 0xfd}, "compressed"}, // zstd
	{[]byte("\xfd7zXZ\x00"), "compressed"},         // xz
}

// sniff tells programs and compressed data from other files by their first bytes.
func sniff(b []byte) string {
	for _, m := range magics {
		if bytes.HasPrefix(b, m.magic) {
			return m.kind
		}
	}
	return ""
}

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
// decoration is taken off each line. Anything else in a line (an ellipsis, "<key data>") means
// the text is not a key.
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
		for _, c := range l {
			if !isBase64(c) {
				return nil, nil, false
			}
		}
		body = append(body, l...)
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

// isToken reports whether the '.' at i splits a bootstrap token: 6 of [a-z0-9] before it and
// 16 after, as whole words (no letter, digit or '_' on either side).
func isToken(win []byte, i int) bool {
	if i < 6 || i+17 > len(win) {
		return false
	}
	for _, c := range win[i-6 : i] {
		if !isTokenChar(c) {
			return false
		}
	}
	for _, c := range win[i+1 : i+17] {
		if !isTokenChar(c) {
			return false
		}
	}
	if i > 6 && isWordChar(win[i-7]) {
		return false
	}
	if i+17 < len(win) && isWordChar(win[i+17]) {
		return false
	}
	return true
}

func isTokenChar(c byte) bool { return c >= 'a' && c <= 'z' || c >= '0' && c <= '9' }

func isWordChar(c byte) bool {
	return isTokenChar(c) || c >= 'A' && c <= 'Z' || c == '_'
}
