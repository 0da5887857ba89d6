package artifact

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func hexSum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// payload returns n bytes of deterministic, non-repeating-looking content.
func payload(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + i/251)
	}
	return b
}

// server serves content at /blob, in chunks of chunk bytes with a pause
// between them, and counts requests. With hold > 1 it keeps every response
// waiting until hold requests have arrived (or its client leaves).
type server struct {
	*httptest.Server
	hits    atomic.Int32
	content []byte
	chunk   int
	pause   time.Duration
	hold    int32
	held    chan struct{}
}

func newServer(t *testing.T, content []byte, chunk int, pause time.Duration) *server {
	return newHeldServer(t, content, chunk, pause, 0)
}

func newHeldServer(t *testing.T, content []byte, chunk int, pause time.Duration, hold int32) *server {
	s := &server{content: content, chunk: chunk, pause: pause, hold: hold, held: make(chan struct{})}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := s.hits.Add(1)
		if r.URL.Path != "/blob" {
			http.NotFound(w, r)
			return
		}
		if s.hold > 1 {
			if n == s.hold {
				close(s.held)
			}
			select {
			case <-s.held:
			case <-r.Context().Done():
				return
			}
		}
		w.Header().Set("Content-Length", strconv.Itoa(len(s.content)))
		for off := 0; off < len(s.content); off += s.chunk {
			end := min(off+s.chunk, len(s.content))
			if _, err := w.Write(s.content[off:end]); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			select {
			case <-time.After(s.pause):
			case <-r.Context().Done():
				return
			}
		}
	}))
	t.Cleanup(s.Close)
	return s
}

// cacheFiles lists every file under the cache's blob directory.
func cacheFiles(t *testing.T, c *Cache) []string {
	t.Helper()
	ents, err := os.ReadDir(c.blobDir())
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

func TestFetchHTTP(t *testing.T) {
	content := payload(300 << 10)
	srv := newServer(t, content, 64<<10, 0)
	c := NewCache(t.TempDir())
	src := Source{Name: "crictl", URL: srv.URL + "/blob", SHA256: hexSum(content)}

	p, err := c.Fetch(context.Background(), src)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(c.Root, "blobs", "sha256", src.SHA256); p != want {
		t.Errorf("path %s, want %s", p, want)
	}
	got, err := os.ReadFile(p)
	if err != nil || !bytes.Equal(got, content) {
		t.Fatalf("cached content differs (%v)", err)
	}
	if fi, _ := os.Stat(p); fi.Mode().Perm() != 0o444 {
		t.Errorf("blob mode %v, want read-only", fi.Mode())
	}
	if _, err := c.Fetch(context.Background(), src); err != nil {
		t.Fatal(err)
	}
	if n := srv.hits.Load(); n != 1 {
		t.Errorf("server hit %d times, want 1 (second fetch from the cache)", n)
	}
	if files := cacheFiles(t, c); len(files) != 1 {
		t.Errorf("cache holds %v, want just the blob", files)
	}
}

func TestFetchFailuresLeaveNothing(t *testing.T) {
	content := payload(100 << 10)
	good := hexSum(content)
	wrong := hexSum([]byte("something else"))
	slow := newServer(t, content, 10<<10, time.Hour) // stalls after the first chunk
	fast := newServer(t, content, 32<<10, 0)
	truncated := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(len(content)))
		w.Write(content[:len(content)/2])
	}))
	defer truncated.Close()
	local := filepath.Join(t.TempDir(), "local.bin")
	os.WriteFile(local, content, 0o644)

	// How far a stalled or cancelled download got depends on the machine's speed; what it
	// says does not.
	partial := func(url, cause string) string {
		return "^" + regexp.QuoteMeta(fmt.Sprintf("artifact \"crictl\": GET %s: ", url)) + `(after \d+ bytes: )?` + regexp.QuoteMeta(cause) + "$"
	}
	tests := []struct {
		name    string
		src     Source
		stall   time.Duration
		cancel  time.Duration
		wantErr string // the whole error, or with a leading ^ a regular expression
	}{
		{"wrong hash", Source{Name: "crictl", URL: fast.URL + "/blob", SHA256: wrong}, 0, 0,
			fmt.Sprintf("artifact \"crictl\": sha256 mismatch: want %s, got %s (from %s/blob)", wrong, good, fast.URL)},
		{"wrong hash of a file", Source{Name: "runc", Path: local, SHA256: wrong}, 0, 0,
			fmt.Sprintf("artifact \"runc\": sha256 mismatch: want %s, got %s (from %s)", wrong, good, local)},
		{"not found", Source{Name: "crictl", URL: fast.URL + "/nope", SHA256: good}, 0, 0,
			fmt.Sprintf("artifact \"crictl\": GET %s/nope: server answered 404 Not Found", fast.URL)},
		{"stalled", Source{Name: "crictl", URL: slow.URL + "/blob", SHA256: good}, 500 * time.Millisecond, 0,
			partial(slow.URL+"/blob", "no data arrived for 500ms")},
		{"cancelled", Source{Name: "crictl", URL: slow.URL + "/blob", SHA256: good}, 0, 500 * time.Millisecond,
			partial(slow.URL+"/blob", "context canceled")},
		{"truncated", Source{Name: "crictl", URL: truncated.URL, SHA256: good}, 0, 0,
			fmt.Sprintf("artifact \"crictl\": GET %s: after 51200 bytes: unexpected EOF", truncated.URL)},
		{"missing file", Source{Name: "runc", Path: local + ".gone", SHA256: good}, 0, 0,
			fmt.Sprintf("artifact \"runc\": open %s.gone: no such file or directory", local)},
		{"unpinned", Source{Name: "crictl", URL: fast.URL + "/blob"}, 0, 0,
			"artifact \"crictl\": not pinned: no sha256 (run kiln lock)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := NewCache(t.TempDir())
			c.Retry.Attempts = 1 // each failure as one attempt sees it; retries: download_test.go
			if tt.stall > 0 {
				c.StallTimeout = tt.stall
			}
			ctx := context.Background()
			if tt.cancel > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithCancel(ctx)
				defer cancel()
				time.AfterFunc(tt.cancel, cancel)
			}
			_, err := c.Fetch(ctx, tt.src)
			matches := err != nil && err.Error() == tt.wantErr
			if strings.HasPrefix(tt.wantErr, "^") {
				matches = err != nil && regexp.MustCompile(tt.wantErr).MatchString(err.Error())
			}
			if !matches {
				t.Errorf("error:\n got: %v\nwant: %s", err, tt.wantErr)
			}
			if files := cacheFiles(t, c); len(files) != 0 {
				t.Errorf("cache holds %v after a failed fetch", files)
			}
		})
	}
}

// TestConcurrentFetch has two fetchers race for one blob from a slow server
// while a third goroutine checks that the blob, whenever it exists, is whole.
func TestConcurrentFetch(t *testing.T) {
	content := payload(256 << 10)
	srv := newServer(t, content, 16<<10, 20*time.Millisecond)
	c := NewCache(t.TempDir())
	src := Source{Name: "kubelet", URL: srv.URL + "/blob", SHA256: hexSum(content)}

	stop := make(chan struct{})
	watchErr := make(chan error, 1)
	go func() {
		defer close(watchErr)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if b, err := os.ReadFile(c.blobPath(src.SHA256)); err == nil && !bytes.Equal(b, content) {
				watchErr <- fmt.Errorf("saw a partial blob of %d bytes", len(b))
				return
			}
			time.Sleep(time.Millisecond)
		}
	}()

	var wg sync.WaitGroup
	paths := make([]string, 2)
	errs := make([]error, 2)
	for i := range 2 {
		wg.Go(func() { paths[i], errs[i] = c.Fetch(context.Background(), src) })
	}
	wg.Wait()
	close(stop)
	if err := <-watchErr; err != nil {
		t.Error(err)
	}
	for i := range 2 {
		if errs[i] != nil {
			t.Fatalf("fetch %d: %v", i, errs[i])
		}
		if b, _ := os.ReadFile(paths[i]); !bytes.Equal(b, content) {
			t.Errorf("fetch %d: wrong content at %s", i, paths[i])
		}
	}
	if files := cacheFiles(t, c); len(files) != 1 {
		t.Errorf("cache holds %v, want just the blob", files)
	}
}

// TestConcurrentFetchProcesses runs two copies of this test binary that
// fetch the same blob into one cache at the same time.
func TestConcurrentFetchProcesses(t *testing.T) {
	if os.Getenv("KILN_TEST_FETCH_URL") != "" {
		t.Skip("in a child process")
	}
	content := payload(256 << 10)
	// The server holds the first response until the second request comes,
	// so the two children really download at the same time.
	srv := newHeldServer(t, content, 16<<10, 10*time.Millisecond, 2)
	root := t.TempDir()
	sum := hexSum(content)
	var cmds []*exec.Cmd
	var outs []*bytes.Buffer
	for range 2 {
		cmd := exec.Command(os.Args[0], "-test.run=^TestFetchChild$", "-test.v")
		cmd.Env = append(os.Environ(), "KILN_TEST_FETCH_URL="+srv.URL+"/blob", "KILN_TEST_FETCH_ROOT="+root, "KILN_TEST_FETCH_SHA="+sum)
		out := &bytes.Buffer{}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds, outs = append(cmds, cmd), append(outs, out)
	}
	for i, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Errorf("child %d: %v\n%s", i, err, outs[i])
		}
		if !strings.Contains(outs[i].String(), "fetched "+filepath.Join(root, "blobs", "sha256", sum)) {
			t.Errorf("child %d output:\n%s", i, outs[i])
		}
	}
	if n := srv.hits.Load(); n != 2 {
		t.Errorf("server hit %d times, want 2 (both children raced)", n)
	}
	c := NewCache(root)
	if err := c.Verify(sum); err != nil {
		t.Error(err)
	}
	if files := cacheFiles(t, c); len(files) != 1 {
		t.Errorf("cache holds %v, want just the blob", files)
	}
}

// TestFetchChild is the child half of TestConcurrentFetchProcesses.
func TestFetchChild(t *testing.T) {
	url := os.Getenv("KILN_TEST_FETCH_URL")
	if url == "" {
		t.Skip("only run by TestConcurrentFetchProcesses")
	}
	c := NewCache(os.Getenv("KILN_TEST_FETCH_ROOT"))
	p, err := c.Fetch(context.Background(), Source{Name: "child", URL: url, SHA256: os.Getenv("KILN_TEST_FETCH_SHA")})
	if err != nil {
		t.Fatal(err)
	}
	fmt.Println("fetched", p)
}

func TestAddAndDamage(t *testing.T) {
	content := []byte("#!/bin/sh\necho hello\n")
	local := filepath.Join(t.TempDir(), "hello.sh")
	if err := os.WriteFile(local, content, 0o755); err != nil {
		t.Fatal(err)
	}
	c := NewCache(t.TempDir())
	sum, p, err := c.Add(context.Background(), Source{Name: "hello", Path: local})
	if err != nil {
		t.Fatal(err)
	}
	if sum != hexSum(content) || p != c.blobPath(sum) {
		t.Fatalf("Add = %s %s", sum, p)
	}

	// A zero-length blob under a name that is not the hash of nothing is
	// fetched again.
	os.Chmod(p, 0o644)
	os.WriteFile(p, nil, 0o444)
	if _, ok := c.Has(sum); ok {
		t.Error("Has accepts an empty blob")
	}
	if p2, err := c.Fetch(context.Background(), Source{Name: "hello", Path: local, SHA256: sum}); err != nil {
		t.Fatal(err)
	} else if b, _ := os.ReadFile(p2); !bytes.Equal(b, content) {
		t.Error("damaged blob was not replaced")
	}

	// Verify notices changed content and removes the blob.
	os.Chmod(p, 0o644)
	os.WriteFile(p, []byte("tampered"), 0o444)
	err = c.Verify(sum)
	if err == nil || !strings.Contains(err.Error(), "is damaged: it hashes to "+hexSum([]byte("tampered"))) {
		t.Errorf("Verify: %v", err)
	}
	if _, ok := c.Has(sum); ok {
		t.Error("damaged blob still in the cache")
	}
}

func TestDefaultCache(t *testing.T) {
	tests := []struct {
		kiln, xdg, home, want string
	}{
		{"/srv/kiln", "/x", "/h", "/srv/kiln"},
		{"", "/x", "/h", "/x/kiln"},
		{"", "", "/h", "/h/.cache/kiln"},
	}
	for _, tt := range tests {
		t.Setenv("KILN_CACHE", tt.kiln)
		t.Setenv("XDG_CACHE_HOME", tt.xdg)
		t.Setenv("HOME", tt.home)
		c, err := DefaultCache()
		if err != nil || c.Root != tt.want {
			t.Errorf("DefaultCache with KILN_CACHE=%q XDG_CACHE_HOME=%q HOME=%q: %v %v, want %s", tt.kiln, tt.xdg, tt.home, c, err, tt.want)
		}
	}
}

// TestFetchStoredGzip checks that a file served with Content-Encoding: gzip
// is stored as served, not decoded on the way.
func TestFetchStoredGzip(t *testing.T) {
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(payload(10 << 10))
	zw.Close()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Encoding", "gzip")
		w.Write(gz.Bytes())
	}))
	defer srv.Close()
	c := NewCache(t.TempDir())
	if _, err := c.Fetch(context.Background(), Source{Name: "tgz", URL: srv.URL, SHA256: hexSum(gz.Bytes())}); err != nil {
		t.Fatal(err)
	}
}

// TestUnusedBlobs: a blob Has (and so Fetch) found lately is in use; one a week old, or a
// download a crash left, is not; other files are not the cache's.
func TestUnusedBlobs(t *testing.T) {
	c := NewCache(t.TempDir())
	used, _ := c.PutBlob(hexSum([]byte("used")), bytes.NewReader([]byte("used")))
	old, _ := c.PutBlob(hexSum([]byte("old")), bytes.NewReader([]byte("old")))
	partial, foreign := filepath.Join(c.blobDir(), ".kiln-tmp.0123"), filepath.Join(c.blobDir(), "README")
	week := time.Now().Add(-7 * 24 * time.Hour)
	for _, p := range []string{used, old, partial, foreign} {
		if _, err := os.Stat(p); err != nil {
			if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Chtimes(p, week, week); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok := c.Has(hexSum([]byte("used"))); !ok {
		t.Fatal("Has misses a stored blob")
	}
	got, err := c.Unused(time.Now().Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{old, partial}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("Unused = %v, want %v", got, want)
	}
}
