package artifact

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"time"

	"github.com/kilnproject/kiln/builder/spec"
	"github.com/kilnproject/kiln/internal/atomicfile"
	"github.com/kilnproject/kiln/internal/fetch"
	"github.com/kilnproject/kiln/internal/lastuse"
)

// Source is something to fetch: a URL (http or https) or a local Path,
// expected to hash to SHA256 (64 lower-case hex digits).
type Source struct {
	Name   string // for messages, e.g. the artifact name
	URL    string
	Path   string
	SHA256 string
}

func (s Source) String() string {
	if s.URL != "" {
		return s.URL
	}
	return s.Path
}

func (s Source) label() string {
	if s.Name != "" {
		return fmt.Sprintf("artifact %q", s.Name)
	}
	return "artifact " + s.String()
}

// emptySHA256 is the hash of zero bytes.
const emptySHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

// defaultStallTimeout is how long a download may make no progress.
const defaultStallTimeout = 60 * time.Second

var hexRE = regexp.MustCompile(`^[0-9a-f]{64}$`)

// Cache is a content-addressed blob store on disk. The zero value is not
// usable; make one with NewCache or DefaultCache. Fields may be set before
// first use.
type Cache struct {
	// Root is the cache directory; blobs live in Root/blobs/sha256.
	Root string
	// Client fetches http(s) sources. NewCache sets one with bounded dial,
	// TLS handshake and response header timeouts and no overall timeout
	// (downloads may be large; StallTimeout bounds them instead).
	Client *http.Client
	// StallTimeout fails a download attempt that receives nothing for this long.
	StallTimeout time.Duration
	// Retry says how http(s) downloads are retried and resumed (see DownloadRetry).
	Retry DownloadRetry
	// Log receives a line per download.
	Log *slog.Logger
}

// NewCache returns a cache rooted at root.
func NewCache(root string) *Cache {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.DialContext = (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	tr.TLSHandshakeTimeout = 30 * time.Second
	tr.ResponseHeaderTimeout = 60 * time.Second
	return &Cache{
		Root:         root,
		Client:       &http.Client{Transport: tr},
		StallTimeout: defaultStallTimeout,
		Log:          slog.Default(),
	}
}

// DefaultCache returns the cache at spec.CacheDir: $KILN_CACHE, else
// $XDG_CACHE_HOME/kiln, else ~/.cache/kiln.
func DefaultCache() (*Cache, error) {
	dir, err := spec.CacheDir()
	if err != nil {
		return nil, err
	}
	return NewCache(dir), nil
}

func (c *Cache) blobDir() string { return filepath.Join(c.Root, "blobs", "sha256") }

// blobPath returns where the blob with this sha256 lives (or would).
func (c *Cache) blobPath(sha256 string) string { return filepath.Join(c.blobDir(), sha256) }

// Has returns the blob's path if the cache holds it.
func (c *Cache) Has(sha256 string) (string, bool) {
	if !hexRE.MatchString(sha256) {
		return "", false
	}
	p := c.blobPath(sha256)
	fi, err := os.Lstat(p)
	if err != nil || !fi.Mode().IsRegular() {
		return "", false
	}
	if fi.Size() == 0 && sha256 != emptySHA256 {
		return "", false // damaged (e.g. truncated by a crash of an older writer)
	}
	lastuse.Mark(p)
	return p, true
}

// Unused lists the blobs not used (Has, Fetch) or written since before, and the files of
// downloads left unfinished since before, for kiln cache prune to remove. Other files are not
// the cache's and are not listed.
func (c *Cache) Unused(before time.Time) ([]string, error) {
	return lastuse.Unused(c.blobDir(), before, lastuse.Files(hexRE), nil)
}

// Fetch returns the path of the blob that s names by its SHA256, fetching
// and verifying it first unless the cache holds it. A source that does not
// hash to s.SHA256 fails with
//
//	artifact "NAME": sha256 mismatch: want W, got G (from SOURCE)
//
// and leaves nothing in the cache.
func (c *Cache) Fetch(ctx context.Context, s Source) (string, error) {
	if s.SHA256 == "" {
		return "", fmt.Errorf("%s: not pinned: no sha256 (run kiln lock)", s.label())
	}
	if !hexRE.MatchString(s.SHA256) {
		return "", fmt.Errorf("%s: sha256 %q is not 64 lower-case hex digits", s.label(), s.SHA256)
	}
	if p, ok := c.Has(s.SHA256); ok {
		return p, nil
	}
	_, p, err := c.store(ctx, s, s.SHA256)
	return p, err
}

// Add fetches s whatever it hashes to, stores it and returns its sha256 and
// path. It is how unpinned artifacts get pinned. s.SHA256 is ignored.
func (c *Cache) Add(ctx context.Context, s Source) (sum, path string, err error) {
	return c.store(ctx, s, "")
}

// Verify re-hashes the cached blob and removes it if it is damaged.
func (c *Cache) Verify(sha256Hex string) error {
	p := c.blobPath(sha256Hex)
	f, err := os.Open(p)
	if err != nil {
		return fmt.Errorf("verify blob: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return fmt.Errorf("verify blob %s: %w", p, err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != sha256Hex {
		rmErr := os.Remove(p)
		return errors.Join(fmt.Errorf("blob %s is damaged: it hashes to %s; removed it", p, got), rmErr)
	}
	return nil
}

// store copies s into the cache (see put), checking it against want if set.
func (c *Cache) store(ctx context.Context, s Source, want string) (sum, path string, err error) {
	if s.URL == "" && s.Path == "" {
		return "", "", fmt.Errorf("%s: no url or path", s.label())
	}
	start := time.Now()
	sum, path, n, err := c.put(want, func(w *blobFile) error { return c.copy(ctx, s, w) })
	if err != nil {
		if errors.Is(err, errMismatch) {
			return "", "", fmt.Errorf("%s: sha256 mismatch: want %s, got %s (from %s)", s.label(), want, sum, s)
		}
		return "", "", fmt.Errorf("%s: %w", s.label(), err)
	}
	c.logger().Info("fetched", "artifact", s.Name, "source", s.String(), "sha256", sum, "bytes", n, "took", time.Since(start).Round(time.Millisecond))
	return sum, path, nil
}

// MismatchError says that content does not hash to the sha256 it was named by.
type MismatchError struct{ Want, Got string }

func (e *MismatchError) Error() string {
	return fmt.Sprintf("sha256 mismatch: want %s, got %s", e.Want, e.Got)
}

// PutBlob stores the content of r as the blob want (sha256, hex), hashing it while it is
// written, and returns its path. Content that hashes to something else is a *MismatchError and
// leaves nothing in the cache.
func (c *Cache) PutBlob(want string, r io.Reader) (string, error) {
	if !hexRE.MatchString(want) {
		return "", fmt.Errorf("blob sha256 %q is not 64 lower-case hex digits", want)
	}
	sum, p, _, err := c.put(want, func(w *blobFile) error {
		_, err := io.Copy(w, r)
		return err
	})
	if errors.Is(err, errMismatch) {
		return "", &MismatchError{Want: want, Got: sum}
	}
	if err != nil {
		return "", fmt.Errorf("blob sha256:%s: %w", want, err)
	}
	return p, nil
}

// errMismatch is returned by put when the content does not hash to want.
var errMismatch = errors.New("sha256 mismatch")

// put writes what fill produces into a new file in the blob directory (a blobFile) while
// hashing it, checks the hash against want (if set), then gives the file its name, the
// hash. It returns the hash, the path and the size. On a mismatch it returns the hash it got
// with an error wrapping errMismatch, and keeps nothing; on any error the file is removed.
func (c *Cache) put(want string, fill func(w *blobFile) error) (sum, path string, n int64, err error) {
	w, err := newBlobFile(c.blobDir())
	if err != nil {
		return "", "", 0, fmt.Errorf("cache: %w", err)
	}
	defer w.close()
	if err := fill(w); err != nil {
		return "", "", w.n, err
	}
	sum = hex.EncodeToString(w.h.Sum(nil))
	if want != "" && sum != want {
		return sum, "", w.n, fmt.Errorf("%w: want %s, got %s", errMismatch, want, sum)
	}
	if err := w.f.Commit(sum); err != nil {
		return "", "", w.n, fmt.Errorf("cache: %w", err)
	}
	return sum, c.blobPath(sum), w.n, nil
}

// blobFile is a blob being written into the cache: a temporary file in the blob directory
// and the sha256 and size of what it holds so far.
type blobFile struct {
	dir string
	f   *atomicfile.File
	h   hash.Hash
	n   int64
}

func newBlobFile(dir string) (*blobFile, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	f, err := atomicfile.Create(dir, atomicfile.Options{Mode: 0o444})
	if err != nil {
		return nil, err
	}
	return &blobFile{dir: dir, f: f, h: sha256.New()}, nil
}

// Write appends p to the file and the hash. Its errors are *writeError.
func (w *blobFile) Write(p []byte) (int, error) {
	n, err := w.f.Write(p)
	w.h.Write(p[:n])
	w.n += int64(n)
	if err != nil {
		return n, &writeError{err}
	}
	return n, nil
}

// restart drops what was written: the file is removed and an empty one takes its place.
func (w *blobFile) restart() error {
	if err := w.f.Close(); err != nil {
		return &writeError{err}
	}
	f, err := atomicfile.Create(w.dir, atomicfile.Options{Mode: 0o444})
	if err != nil {
		return &writeError{err}
	}
	w.f, w.n = f, 0
	w.h.Reset()
	return nil
}

// close removes the file unless it was committed.
func (w *blobFile) close() { w.f.Close() }

// writeError is a failure to write the cache (a full disk, say): never worth a retry.
type writeError struct{ err error }

func (e *writeError) Error() string { return e.err.Error() }
func (e *writeError) Unwrap() error { return e.err }

func (c *Cache) logger() *slog.Logger {
	if c.Log != nil {
		return c.Log
	}
	return slog.Default()
}

// copy writes the content of s to w: a local file, or a download (see download).
func (c *Cache) copy(ctx context.Context, s Source, w *blobFile) error {
	if s.URL != "" {
		return c.download(ctx, s.URL, w)
	}
	f, err := os.Open(s.Path)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := io.Copy(w, f); err != nil {
		return fmt.Errorf("read %s: %w", s.Path, err)
	}
	return nil
}

// watchStalls returns a context that ends once the reads through the watchdog's reader
// bring nothing for c.StallTimeout (defaultStallTimeout when zero); see fetch.Watch.
func (c *Cache) watchStalls(ctx context.Context) (context.Context, *fetch.Watchdog) {
	stall := c.StallTimeout
	if stall <= 0 {
		stall = defaultStallTimeout
	}
	return fetch.Watch(ctx, stall)
}
