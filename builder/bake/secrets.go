package bake

import (
	"archive/tar"
	"bytes"
	"crypto/md5"
	"crypto/x509"
	"crypto/x509/pkix"
	"debug/elf"
	"encoding/asn1"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/big"
	"os"
	"path"
	"runtime"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
	"github.com/ulikunitz/xz"
	"gopkg.in/yaml.v3"

	"github.com/kilnproject/kiln/builder/rootfs"
)

// scanSecrets refuses a tree with secrets in it (ScanSecrets): they come with a node's config
// at first boot; one baked into the image would be shared by every node made from it.
func (b *baker) scanSecrets(tree *rootfs.Tree) error {
	t := time.Now()
	found, err := ScanSecrets(os.DirFS(tree.Dir))
	if err != nil {
		return err
	}
	if len(found) > 0 {
		return secretsError(found)
	}
	b.step("secrets scanned", t)
	return nil
}

// Finding is a secret found in a tree.
type Finding struct {
	// Path is the file's absolute path in the image, "/etc/ssh/ssh_host_ed25519_key".
	Path string
	// Line is the 1-based line of the first occurrence in the file, or in the data In names.
	Line int
	// Kind says what it is: "private key (RSA PRIVATE KEY)", "OpenSSH private key",
	// "Kubernetes bootstrap token".
	Kind string
	// In says where inside the file the secret is when it is not in the file's own bytes:
	// "gzip data", "zstd data, tar entry etc/ssl/private/node.key". Empty for plain files.
	In string
}

func (f Finding) String() string {
	if f.In != "" {
		return fmt.Sprintf("%s (%s):%d: %s", f.Path, f.In, f.Line, f.Kind)
	}
	return fmt.Sprintf("%s:%d: %s", f.Path, f.Line, f.Kind)
}

// tokenDirs are where a bootstrap token is configuration wherever it stands in a file;
// elsewhere a token counts only in a token context (search).
var tokenDirs = []string{"etc/", "usr/lib/kiln/"}

const (
	scanChunk = 1 << 20
	// scanLookahead is how many bytes after a match start a check may read: a whole PEM key
	// (an 8192-bit RSA key takes 6.3 KiB; indented or quoted lines take more).
	scanLookahead = 32 << 10
	// scanLookbehind is how many bytes before a match a check may read.
	scanLookbehind = 72
	// maxDecompressed bounds what is read out of one compressed file: its first 16 MiB
	// (all nested levels together) are searched, the rest is not read. An image layer or a
	// compressed kernel module is read up to there, a compression bomb no further.
	maxDecompressed = 16 << 20
	// maxNesting is how deep compressed data within compressed data is opened.
	maxNesting = 2
	// maxWhole is the largest file (or tar entry, or decompressed data) that is read whole to be
	// judged as a DER key, a PKCS #12 file, a kubeconfig or a Secret manifest. Such files are a
	// few KiB; a larger file is still searched for PEM keys and tokens.
	maxWhole = 1 << 20
)

var (
	pemMarker   = []byte("PRIVATE KEY-----")
	pgpMarker   = []byte("PGP PRIVATE KEY BLOCK-----")
	pemBegin    = []byte("-----BEGIN ")
	pemEnd      = []byte("-----END ")
	tokenMarker = byte('.')
	elfMagic    = []byte("\x7fELF")
)

// ScanSecrets reads every regular file of fsys (symlinks are not followed) and reports the
// private keys and Kubernetes credentials in it, each file at most once per kind, at its
// first occurrence:
//
//   - PEM private keys: "… PRIVATE KEY" blocks (RSA, EC, DSA, PKCS #8, OpenSSH, or one of them
//     encrypted: ENCRYPTED PRIVATE KEY, Proc-Type: 4,ENCRYPTED, an OpenSSH key with a
//     passphrase) and OpenPGP "PGP PRIVATE KEY BLOCK"s, at any line width, with CRLF line
//     ends, indented, commented, quoted or escaped into a string (a key in a YAML or JSON
//     config is found);
//   - a file that is a DER private key (PKCS #1, SEC 1, PKCS #8 plain or encrypted, DSA) or a
//     PKCS #12 (.p12, .pfx) file with a private key in it;
//   - in a kubeconfig (any file that parses as one), a user's client-key-data that decodes to
//     a private key and a token that is one (a bootstrap token, a JWT, or an opaque token of
//     20 or more characters); a Secret manifest (YAML or JSON) of type
//     bootstrap.kubernetes.io/token whose token-id and token-secret are a token;
//   - Kubernetes bootstrap tokens (<6 of [a-z0-9]>.<16 of [a-z0-9]> as a whole word): anywhere
//     in /etc and /usr/lib/kiln, elsewhere in a token context — the word "token" or "bearer"
//     earlier on its line, or a file whose name says token.
//
// Only what parses as a key or token is reported: a PEM header in code or documentation, a key
// shortened with "...", a placeholder, a public key or a certificate is not. cloud-init's
// Python sources and their .pyc files carry such examples in their documentation strings.
//
// gzip, zstd and xz data is decompressed — at most maxDecompressed bytes of each file, two
// levels deep — and searched like a file, a tar archive in it entry by entry (image layers).
// Programs and libraries (files that debug/elf parses as ELF with segments or sections) are
// not searched for keys: some carry public self-test keys (Debian's libgnutls has four PEM
// private keys for its FIPS self-tests), and a node's keys are files, not compiled in. Plain
// files are searched whole, whatever their size (about 1 GiB/s).
//
// A file that the image's package database (dpkg's md5sums and conffiles) records with the
// same content is not reported: a key a distribution package ships is published to everyone
// with the package (cloud-init's documentation ships example keys that parse), it is not a
// secret of the image. A file whose content differs from the package's is judged like any
// other.
//
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
			small := make([]byte, maxWhole)
			var dec [maxNesting]bytes.Buffer
			for p := range paths {
				fs, err := scanFile(fsys, p, buf, small, &dec)
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
	if len(findings) > 0 {
		findings = dropPackaged(fsys, findings)
	}
	sort.Slice(findings, func(i, j int) bool {
		a, b := findings[i], findings[j]
		if a.Path != b.Path {
			return a.Path < b.Path
		}
		if a.In != b.In {
			return a.In < b.In
		}
		return a.Kind < b.Kind
	})
	if err := errors.Join(errs...); err != nil {
		return findings, fmt.Errorf("scan for secrets: %w", err)
	}
	return findings, nil
}

// fileScan collects the findings of one file.
type fileScan struct {
	path string // "/etc/x"
	// buf is the window of a large file; small holds a small file whole.
	buf, small []byte
	// tokenName: the file's name says it holds a token ("bootstrap-token", "tokens.csv").
	tokenName bool
	// budget is what is left of maxDecompressed for this file.
	budget int64
	// dec holds decompressed data, one buffer per level, reused from file to file.
	dec  *[maxNesting]bytes.Buffer
	out  []Finding
	seen map[string]bool
}

func (s *fileScan) add(in string, line int, kind string) {
	if k := in + "\x00" + kind; !s.seen[k] {
		s.seen[k] = true
		s.out = append(s.out, Finding{Path: s.path, Line: line, Kind: kind, In: in})
	}
}

// scanFile judges the file p: a file of at most maxWhole bytes is read once, whole, into small;
// a larger one is read through buf.
func scanFile(fsys fs.FS, p string, buf, small []byte, dec *[maxNesting]bytes.Buffer) ([]Finding, error) {
	f, err := fsys.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("/%s: %w", p, err)
	}
	tokens := false
	for _, d := range tokenDirs {
		tokens = tokens || strings.HasPrefix(p, d)
	}
	s := &fileScan{
		path: "/" + p, buf: buf, small: small, dec: dec, budget: maxDecompressed, seen: map[string]bool{},
		tokenName: strings.Contains(strings.ToLower(path.Base(p)), "token"),
	}
	r, ok := f.(io.ReaderAt)
	if fi.Size() <= maxWhole || !ok {
		n, err := io.ReadFull(f, small[:cap(small)])
		if err == nil && !ok { // more than maxWhole and no ReaderAt: hold it all
			rest, rerr := io.ReadAll(f)
			b := append(bytes.Clone(small[:n]), rest...)
			n, err, small = len(b), rerr, b
		}
		if err != nil && err != io.EOF && err != io.ErrUnexpectedEOF {
			return nil, fmt.Errorf("/%s: %w", p, err)
		}
		err = s.mem(small[:n], "", 0, tokens)
		return s.out, wrapPath(p, err)
	}
	return s.out, wrapPath(p, s.file(r, fi.Size(), tokens))
}

func wrapPath(p string, err error) error {
	if err != nil {
		return fmt.Errorf("/%s: %w", p, err)
	}
	return nil
}

// file judges a file larger than maxWhole, read at r in windows.
func (s *fileScan) file(r io.ReaderAt, size int64, anyToken bool) error {
	head := make([]byte, 512)
	if _, err := r.ReadAt(head, 0); err != nil && err != io.EOF {
		return err
	}
	if c := compression(head); c != "" {
		return s.decompressed(c, io.NewSectionReader(r, 0, size), "", 0)
	}
	if bytes.HasPrefix(head, elfMagic) && isProgram(r) {
		if !anyToken {
			return nil
		}
		return s.stream(r, size, "", false, true)
	}
	return s.stream(r, size, "", true, anyToken)
}

// mem judges data held whole: a small file, data decompressed from a file, or an entry of a tar
// archive in that (in says which). anyToken: every bootstrap token counts, not only those in
// a token context.
func (s *fileScan) mem(b []byte, in string, depth int, anyToken bool) error {
	if c := compression(b); c != "" {
		return s.decompressed(c, bytes.NewReader(b), in, depth)
	}
	if depth > 0 && isTar(b) {
		s.tar(b, in, depth)
		return nil
	}
	keys := true
	if bytes.HasPrefix(b, elfMagic) && isProgram(bytes.NewReader(b)) {
		if !anyToken {
			return nil
		}
		keys = false
	} else if len(b) <= maxWhole {
		s.whole(b, in)
	}
	s.search(b, 0, len(b), 0, in, keys, anyToken)
	return nil
}

// decompressed judges what r decompresses to, within the file's budget.
func (s *fileScan) decompressed(kind string, r io.Reader, in string, depth int) error {
	if depth >= maxNesting || s.budget <= 0 {
		return nil
	}
	out := &s.dec[depth]
	out.Reset()
	b, err := decompress(kind, r, s.budget, out)
	if err != nil {
		return nil // not data of that kind after all: nothing to search
	}
	s.budget -= int64(len(b))
	return s.mem(b, within(in, kind+" data"), depth+1, false)
}

func within(in, what string) string {
	if in == "" {
		return what
	}
	return in + ", " + what
}

// tar judges each regular entry of a tar archive (decompressed, in memory) as a file; a
// bootstrap token in it counts in a token context only, wherever the entry is.
func (s *fileScan) tar(b []byte, in string, depth int) {
	r := bytes.NewReader(b)
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err != nil {
			return // the end, or a tar cut short by the bound: what was read was judged
		}
		if h.Typeflag != tar.TypeReg || h.Size <= 0 || h.Size > int64(len(b)) {
			continue
		}
		// The entry's bytes are where the reader stands in b.
		at := len(b) - r.Len()
		end := min(len(b), at+int(h.Size))
		name := strings.TrimPrefix(path.Clean("/"+h.Name), "/")
		s.mem(b[at:end], within(in, "tar entry "+name), depth, false)
	}
}

// stream searches a large file for PEM keys (keys) and bootstrap tokens in windows of buf.
// Each window is the tail of the previous one plus a chunk: positions before from were judged
// already (they are kept as context for checks that look back), and a match is judged only
// once scanLookahead bytes after it are in the window or the data has ended, so each match is
// seen once, with its context, wherever chunks split.
func (s *fileScan) stream(ra io.ReaderAt, size int64, in string, keys, anyToken bool) error {
	r := io.NewSectionReader(ra, 0, size)
	buf := s.buf
	have, from, lines := 0, 0, 0 // lines: newlines before the window
	for {
		n, rerr := io.ReadFull(r, buf[have:])
		have += n
		eof := rerr == io.EOF || rerr == io.ErrUnexpectedEOF
		if rerr != nil && !eof {
			return rerr
		}
		win := buf[:have]
		limit := have - scanLookahead
		if eof {
			limit = have
		}
		s.search(win, from, limit, lines, in, keys, anyToken)
		if eof {
			return nil
		}
		start := max(0, limit-scanLookbehind)
		lines += bytes.Count(win[:start], []byte{'\n'})
		have = copy(buf, win[start:])
		from = limit - start
	}
}

// search judges the matches that start in win[from:limit]; lines is the number of newlines
// before win.
func (s *fileScan) search(win []byte, from, limit, lines int, in string, keys, anyToken bool) {
	lineAt := func(i int) int { return lines + bytes.Count(win[:i], []byte{'\n'}) + 1 }
	for off := from; keys && off < limit; {
		i := bytes.Index(win[off:], pemMarker)
		if i < 0 || off+i >= limit {
			break
		}
		i += off
		if kind, start, ok := pemKey(win, i); ok {
			s.add(in, lineAt(start), kind)
		}
		off = i + len(pemMarker)
	}
	for off := from; keys && off < limit; {
		i := bytes.Index(win[off:], pgpMarker)
		if i < 0 || off+i >= limit {
			break
		}
		i += off
		if start, ok := pgpKey(win, i); ok {
			s.add(in, lineAt(start), "OpenPGP private key (PGP PRIVATE KEY BLOCK)")
		}
		off = i + len(pgpMarker)
	}
	for off := from; off < limit; {
		i := bytes.IndexByte(win[off:], tokenMarker)
		if i < 0 || off+i >= limit {
			break
		}
		i += off
		if isToken(win, i) && (anyToken || s.tokenName || tokenContext(win, i-6)) {
			s.add(in, lineAt(i-6), "Kubernetes bootstrap token")
		}
		off = i + 1
	}
}

// tokenContext reports whether the line before a token at i names one within tokenReach
// bytes: "token: ", "--token ", "TOKEN=", "Authorization: Bearer ".
func tokenContext(win []byte, i int) bool {
	from := max(0, i-tokenReach)
	if nl := bytes.LastIndexByte(win[from:i], '\n'); nl >= 0 {
		from += nl + 1
	}
	before := bytes.ToLower(win[from:i])
	return bytes.Contains(before, []byte("token")) || bytes.Contains(before, []byte("bearer"))
}

// tokenReach is how far after "token" or "bearer" on its line a token still counts (within
// scanLookbehind, which the window keeps).
const tokenReach = 64

var magics = []struct {
	magic []byte
	kind  string
}{
	{[]byte{0x1f, 0x8b}, "gzip"},
	{[]byte{0x28, 0xb5, 0x2f, 0xfd}, "zstd"},
	{[]byte("\xfd7zXZ\x00"), "xz"},
}

// compression names the compression of data that starts with b, or "".
func compression(b []byte) string {
	for _, m := range magics {
		if bytes.HasPrefix(b, m.magic) {
			return m.kind
		}
	}
	return ""
}

// decompress returns at most limit bytes decompressed from r (in b): all of it, or its first
// limit bytes, or what came out before the data turned out corrupt or cut short.
func decompress(kind string, r io.Reader, limit int64, b *bytes.Buffer) ([]byte, error) {
	var d io.Reader
	switch kind {
	case "gzip":
		z, err := gzip.NewReader(r)
		if err != nil {
			return nil, err
		}
		defer z.Close()
		d = z
	case "zstd":
		z, err := zstd.NewReader(r, zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true),
			zstd.WithDecoderMaxMemory(uint64(limit)+1<<20))
		if err != nil {
			return nil, err
		}
		defer z.Close()
		d = z
	case "xz":
		z, err := xz.NewReader(r)
		if err != nil {
			return nil, err
		}
		d = z
	default:
		return nil, fmt.Errorf("unknown compression %q", kind)
	}
	_, err := io.Copy(b, io.LimitReader(d, limit))
	if b.Len() == 0 && err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// isTar reports whether b starts a POSIX or GNU tar archive.
func isTar(b []byte) bool {
	return len(b) >= 263 && bytes.Equal(b[257:262], []byte("ustar"))
}

// isProgram reports whether r is an ELF program, library or object: debug/elf parses its
// headers, and it has program headers or sections. A file that only starts with the magic
// ("\x7fELF" and then a PEM key) is not.
func isProgram(r io.ReaderAt) bool {
	f, err := elf.NewFile(r)
	if err != nil {
		return false
	}
	defer f.Close()
	return len(f.Progs) > 0 || len(f.Sections) > 1
}

// whole judges a whole file (or entry) that fits in maxWhole: a DER key or PKCS #12 file, a
// kubeconfig, a bootstrap token Secret.
func (s *fileScan) whole(b []byte, in string) {
	if len(b) > 0 && b[0] == 0x30 {
		if kind := derKey(b); kind != "" {
			s.add(in, 1, kind)
			return
		}
	}
	if bytes.IndexByte(b[:min(len(b), 8<<10)], 0) >= 0 {
		return // binary
	}
	kube := bytes.Contains(b, []byte("users")) && (bytes.Contains(b, []byte("client-key-data")) || bytes.Contains(b, []byte("token")))
	if kube || bytes.Contains(b, []byte("kubernetes.io/token")) {
		for _, f := range manifestSecrets(b) {
			s.add(in, f.Line, f.Kind)
		}
	}
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

const bootstrapTokenType = "bootstrap.kubernetes.io/token"

// manifest is what a kubeconfig, a Secret or a List of them holds that can be a secret.
type manifest struct {
	Kind     string `yaml:"kind"`
	Type     string `yaml:"type"`
	Metadata struct {
		Name string `yaml:"name"`
	} `yaml:"metadata"`
	Data       map[string]string `yaml:"data"`
	StringData map[string]string `yaml:"stringData"`
	Users      []struct {
		Name string `yaml:"name"`
		User struct {
			ClientKeyData string `yaml:"client-key-data"`
			Token         string `yaml:"token"`
		} `yaml:"user"`
	} `yaml:"users"`
	Clusters []yaml.Node `yaml:"clusters"`
	Items    []manifest  `yaml:"items"`
}

// manifestSecrets parses b as YAML or JSON documents and reports a kubeconfig's user client
// keys and tokens, and bootstrap token Secrets. Lines are where the value (or else its field)
// first appears in b.
func manifestSecrets(b []byte) (out []Finding) {
	lineOf := func(needles ...string) int {
		for _, n := range needles {
			if i := bytes.Index(b, []byte(n)); n != "" && i >= 0 {
				return bytes.Count(b[:i], []byte{'\n'}) + 1
			}
		}
		return 1
	}
	var check func(m manifest, depth int)
	check = func(m manifest, depth int) {
		if m.Kind == "Config" || (m.Kind == "" && len(m.Users) > 0 && len(m.Clusters) > 0) {
			for i, u := range m.Users {
				at := fmt.Sprintf("kubeconfig users[%d] (%s)", i, u.Name)
				if isClientKey(u.User.ClientKeyData) {
					out = append(out, Finding{Line: lineOf(u.User.ClientKeyData, "client-key-data"), Kind: at + " client-key-data: a private key"})
				}
				if isBearerToken(u.User.Token) {
					out = append(out, Finding{Line: lineOf(u.User.Token, "token"), Kind: at + " token"})
				}
			}
		}
		if m.Kind == "Secret" && m.Type == bootstrapTokenType {
			id, secret := m.StringData["token-id"], m.StringData["token-secret"]
			if d, err := base64.StdEncoding.DecodeString(m.Data["token-id"]); err == nil && id == "" {
				id = string(d)
			}
			if d, err := base64.StdEncoding.DecodeString(m.Data["token-secret"]); err == nil && secret == "" {
				secret = string(d)
			}
			if isBootstrapToken(id + "." + secret) {
				out = append(out, Finding{Line: lineOf("token-secret"), Kind: "Kubernetes bootstrap token Secret (bootstrap-token-" + id + ")"})
			}
		}
		if depth < 4 {
			for _, it := range m.Items {
				check(it, depth+1)
			}
		}
	}
	defer func() {
		if recover() != nil { // the YAML parser on text that is not YAML: nothing parsed
			out = nil
		}
	}()
	d := yaml.NewDecoder(bytes.NewReader(b))
	for range 1000 {
		var m manifest
		err := d.Decode(&m)
		var te *yaml.TypeError
		if err != nil && !errors.As(err, &te) {
			break // the end, or not YAML
		}
		check(m, 0)
	}
	return out
}

// isClientKey reports whether s, a kubeconfig's client-key-data, is base64 of a private key
// (PEM or DER).
func isClientKey(s string) bool {
	b, err := base64.StdEncoding.DecodeString(strings.Join(strings.Fields(s), ""))
	if err != nil || len(b) == 0 {
		return false
	}
	for off := 0; ; {
		i := bytes.Index(b[off:], pemMarker)
		if i < 0 {
			break
		}
		if _, _, ok := pemKey(b, off+i); ok {
			return true
		}
		off += i + len(pemMarker)
	}
	return b[0] == 0x30 && derKey(b) != ""
}

// isBearerToken reports whether s, a kubeconfig user's token, is one: a bootstrap token, a
// JWT (a service account token: a header that decodes to JSON naming its algorithm), or an
// opaque token of at least 20 characters of a token alphabet with letters and digits. A
// placeholder ("<token>", "REDACTED", "${TOKEN}") is none of these.
func isBearerToken(s string) bool {
	if isBootstrapToken(s) {
		return true
	}
	if parts := strings.Split(s, "."); len(parts) == 3 {
		h, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(parts[0], "="))
		var hdr struct {
			Alg string `json:"alg"`
		}
		if err == nil && json.Unmarshal(h, &hdr) == nil && hdr.Alg != "" {
			return true
		}
	}
	if len(s) < 20 {
		return false
	}
	var letters, digits bool
	for _, c := range []byte(s) {
		switch {
		case c >= '0' && c <= '9':
			digits = true
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z':
			letters = true
		case strings.IndexByte("-._~+/=", c) >= 0:
		default:
			return false
		}
	}
	return letters && digits
}

func isBootstrapToken(s string) bool {
	return len(s) == 23 && s[6] == '.' && isToken([]byte(s), 6)
}

// dropPackaged leaves out the findings in files that the image's dpkg database records with
// the same content (its md5sums and conffiles): a distribution's package shipped them to
// everyone.
func dropPackaged(fsys fs.FS, findings []Finding) []Finding {
	sums := dpkgSums(fsys)
	if len(sums) == 0 {
		return findings
	}
	packaged := map[string]bool{}
	out := findings[:0]
	for _, f := range findings {
		p := strings.TrimPrefix(f.Path, "/")
		is, ok := packaged[p]
		if !ok {
			is = sums[p] != "" && fileMD5(fsys, p) == sums[p]
			packaged[p] = is
		}
		if !is {
			out = append(out, f)
		}
	}
	return out
}

// dpkgSums maps the files of the image's installed packages (paths relative to the root,
// with symlinked top directories — /bin, /lib of a merged /usr — resolved) to their md5.
func dpkgSums(fsys fs.FS) map[string]string {
	sums := map[string]string{}
	top := map[string]string{}
	canon := func(p string) string {
		p = strings.TrimPrefix(path.Clean("/"+p), "/")
		first, rest, found := strings.Cut(p, "/")
		if !found {
			return p
		}
		t, ok := top[first]
		if !ok {
			t = first
			if l, err := fs.ReadLink(fsys, first); err == nil && !path.IsAbs(l) && !strings.HasPrefix(path.Clean(l), "..") {
				t = path.Clean(l)
			}
			top[first] = t
		}
		return t + "/" + rest
	}
	files, _ := fs.Glob(fsys, "var/lib/dpkg/info/*.md5sums")
	for _, f := range files {
		b, err := fs.ReadFile(fsys, f)
		if err != nil {
			continue
		}
		for line := range strings.Lines(string(b)) {
			sum, p, ok := strings.Cut(strings.TrimRight(line, "\n"), "  ")
			if ok && len(sum) == 32 {
				sums[canon(p)] = sum
			}
		}
	}
	if b, err := fs.ReadFile(fsys, "var/lib/dpkg/status"); err == nil {
		in := false
		for line := range strings.Lines(string(b)) {
			line = strings.TrimRight(line, "\n")
			switch {
			case strings.HasPrefix(line, "Conffiles:"):
				in = true
			case in && strings.HasPrefix(line, " "):
				if f := strings.Fields(line); len(f) >= 2 && len(f[1]) == 32 {
					sums[canon(f[0])] = f[1]
				}
			default:
				in = false
			}
		}
	}
	return sums
}

func fileMD5(fsys fs.FS, p string) string {
	f, err := fsys.Open(p)
	if err != nil {
		return ""
	}
	defer f.Close()
	h := md5.New()
	if _, err := io.Copy(h, f); err != nil {
		return ""
	}
	return hex.EncodeToString(h.Sum(nil))
}

// secretsError is the bake's refusal of an image with findings: one line each, and what the
// guard searched.
func secretsError(found []Finding) error {
	lines := make([]string, len(found))
	for i, f := range found {
		lines[i] = f.String()
	}
	return fmt.Errorf("refusing to bake: secrets in the image (they belong in the node's config):\n  %s\n"+
		"(every file is searched for private keys — PEM, OpenPGP, DER, PKCS #12 — kubeconfig "+
		"credentials and bootstrap tokens; gzip, zstd and xz files up to %d MiB decompressed, "+
		"tar archives in them entry by entry; programs (ELF) only for tokens in /etc and "+
		"/usr/lib/kiln; a file a dpkg package installed unchanged is public and not reported)",
		strings.Join(lines, "\n  "), maxDecompressed>>20)
}
