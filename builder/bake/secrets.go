package bake

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/kilnproject/kiln/builder/output"
	"github.com/kilnproject/kiln/builder/rootfs"
	"github.com/kilnproject/kiln/internal/atomicfile"
	"github.com/kilnproject/kiln/internal/decompress"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

// scanSecrets refuses a tree with secrets in it (ScanSecrets): they come with a node's config
// at first boot; one baked into the image would be shared by every node made from it.
//
// A base linked from the cache of flattened bases is scanned once, alone, and marked clean
// there for this kiln (its executable's sha256: another scanner scans again); a tree of a
// clean base skips the base's files it still holds (the same inode at the same path) and
// scans only what the bake added or replaced.
func (b *baker) scanSecrets(tree *rootfs.Tree) error {
	t := time.Now()
	skip, err := b.cleanBase()
	if err != nil {
		return err
	}
	found, err := scanSecrets(os.DirFS(tree.Dir), skip)
	if err != nil {
		return err
	}
	if len(found) > 0 {
		return secretsError(found)
	}
	b.step("secrets scanned", t)
	return nil
}

// cleanBase returns which of the bake tree's files need no scan: those still the cached base's own,
// when the base, scanned alone, holds no secret. It scans the base when no mark says so for
// this kiln, and marks it clean. Without a cached base (or with a secret in it) nothing is
// skipped: the whole tree is scanned and its findings reported.
func (b *baker) cleanBase() (func(p string, d fs.DirEntry) bool, error) {
	if b.baseTree == "" {
		return nil, nil
	}
	scanner, err := executableSHA256()
	if err != nil {
		b.log.Warn("the cached base's secret scan is not reused", "err", err)
		return nil, nil
	}
	mark := filepath.Join(filepath.Dir(b.baseTree), "secrets-clean")
	if got, err := os.ReadFile(mark); err != nil || string(got) != scanner {
		found, err := ScanSecrets(os.DirFS(b.baseTree))
		if err != nil || len(found) > 0 {
			return nil, nil // the whole tree's scan reports them
		}
		if err := atomicfile.Write(mark, []byte(scanner), atomicfile.Options{Mode: 0o600}); err != nil {
			b.log.Warn("the cached base's secret scan is not kept", "err", err)
		}
	}
	return func(p string, d fs.DirEntry) bool {
		fi, err := d.Info()
		if err != nil {
			return false
		}
		bi, err := os.Lstat(filepath.Join(b.baseTree, p))
		return err == nil && os.SameFile(fi, bi)
	}, nil
}

// executableSHA256 is the running kiln's sha256: which secret scanner marked a base clean.
func executableSHA256() (string, error) {
	exe, err := os.Executable()
	if err != nil {
		return "", err
	}
	sum, _, err := output.HashFile(exe)
	return sum, err
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

// inTokenDir reports whether p (relative to the root) is in one of tokenDirs. A pre-pulled
// image's applied layers (nodeimage.SnapshotsPath/<chain ID>/) are a root of their own: there
// the image's own etc/ is, and the rest of /usr/lib/kiln is not (its programs are the image's).
func inTokenDir(p string) bool {
	if rest, ok := strings.CutPrefix(p, strings.TrimPrefix(nodeimage.SnapshotsPath, "/")+"/"); ok {
		_, inImage, _ := strings.Cut(rest, "/")
		return strings.HasPrefix(inImage, "etc/")
	}
	for _, d := range tokenDirs {
		if strings.HasPrefix(p, d) {
			return true
		}
	}
	return false
}

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
//     in /etc and /usr/lib/kiln (a pre-pulled image's applied layers there count as a root of
//     their own: anywhere in the image's etc/), elsewhere in a token context — the word "token"
//     or "bearer" earlier on its line, or a file whose name says token.
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
func ScanSecrets(fsys fs.FS) ([]Finding, error) { return scanSecrets(fsys, nil) }

// scanSecrets is ScanSecrets leaving out the regular files skip says (nil: none).
func scanSecrets(fsys fs.FS, skip func(p string, d fs.DirEntry) bool) ([]Finding, error) {
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
		if d.Type().IsRegular() && (skip == nil || !skip(p, d)) {
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
	s := &fileScan{
		path: "/" + p, buf: buf, small: small, dec: dec, budget: maxDecompressed, seen: map[string]bool{},
		tokenName: strings.Contains(strings.ToLower(path.Base(p)), "token"),
	}
	tokens := inTokenDir(p)
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
	if c := decompress.ByMagic(head); c != decompress.None {
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
	if c := decompress.ByMagic(b); c != decompress.None {
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
func (s *fileScan) decompressed(kind decompress.Kind, r io.Reader, in string, depth int) error {
	if depth >= maxNesting || s.budget <= 0 {
		return nil
	}
	out := &s.dec[depth]
	out.Reset()
	b, err := inflate(kind, r, s.budget, out)
	if err != nil {
		return nil // not data of that kind after all: nothing to search
	}
	s.budget -= int64(len(b))
	return s.mem(b, within(in, string(kind)+" data"), depth+1, false)
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

// inflate returns at most limit bytes decompressed from r (in b): all of it, or its first
// limit bytes, or what came out before the data turned out corrupt or cut short.
func inflate(kind decompress.Kind, r io.Reader, limit int64, b *bytes.Buffer) ([]byte, error) {
	// At least the 64 MiB dictionary of xz -9 and zstd --ultra -22's 64 MiB window (both are
	// allocated as declared, however small the file): a file the decoder refuses would go
	// unscanned.
	d, err := decompress.Options{MaxMemory: max(limit+1<<20, 65<<20)}.Open(r, kind)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	_, err = io.Copy(b, io.LimitReader(d, limit))
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
