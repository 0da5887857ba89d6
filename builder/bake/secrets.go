package bake

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
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
	// scanLookahead is how many bytes after a match start a check may read.
	scanLookahead = 512
	// scanLookbehind is how many bytes before a match a check may read.
	scanLookbehind = 72
)

var (
	pemMarker   = []byte("PRIVATE KEY-----")
	pemBegin    = []byte("-----BEGIN ")
	tokenMarker = byte('.')
)

// ScanSecrets reads every regular file of fsys (symlinks are not followed) and reports private
// keys — PEM "… PRIVATE KEY" blocks with a body, OpenSSH private keys among them — anywhere,
// and Kubernetes bootstrap tokens (<6 of [a-z0-9]>.<16 of [a-z0-9]>) in /etc and
// /usr/lib/kiln. Each file is reported at most once per kind, at its first occurrence.
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
// the same line, at most 64 bytes before) followed by a base64 body, so that code merely
// naming the header is not taken for a key.
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
	body := win[i+len(pemMarker) : min(len(win), i+len(pemMarker)+scanLookahead-len(pemMarker))]
	if !hasBase64Run(body, 40) {
		return "", 0, false
	}
	typ = strings.TrimSpace(typ)
	if typ == "OPENSSH" {
		return "OpenSSH private key", b, true
	}
	if typ == "" {
		return "private key (PRIVATE KEY)", b, true
	}
	return "private key (" + typ + " PRIVATE KEY)", b, true
}

func hasBase64Run(b []byte, n int) bool {
	run := 0
	for _, c := range b {
		if c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '+' || c == '/' || c == '=' {
			if run++; run >= n {
				return true
			}
		} else {
			run = 0
		}
	}
	return false
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
