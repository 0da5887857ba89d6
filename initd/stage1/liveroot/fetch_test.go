package liveroot

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kilnproject/kiln/internal/testkit"
)

// ramDir mounts a tmpfs of size bytes for the test.
func ramDir(t *testing.T, size int64) string {
	t.Helper()
	testkit.RequireRoot(t, "mounting a tmpfs")
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size="+strconv.FormatInt(size, 10)); err != nil {
		t.Fatalf("mount tmpfs: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	return dir
}

func image(n int) ([]byte, string) {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + i/251)
	}
	sum := sha256.Sum256(b)
	return b, hex.EncodeToString(sum[:])
}

// server answers each request with the next of steps (the last repeats), counting requests.
type server struct {
	*httptest.Server
	hits   atomic.Int32
	mu     sync.Mutex
	ranges []string // each request's Range header
}

type step func(w http.ResponseWriter, r *http.Request)

func serve(t *testing.T, steps ...step) *server {
	s := &server{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := int(s.hits.Add(1))
		s.mu.Lock()
		s.ranges = append(s.ranges, r.Header.Get("Range"))
		s.mu.Unlock()
		steps[min(n, len(steps))-1](w, r)
	}))
	t.Cleanup(s.Close)
	return s
}

func body(b []byte) step {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(len(b)))
		w.Write(b)
	}
}

func status(code int) step {
	return func(w http.ResponseWriter, _ *http.Request) { http.Error(w, http.StatusText(code), code) }
}

// cut promises all of b and sends half, then drops the connection; etag, when set, lets the
// client resume.
func cut(b []byte, etag string) step {
	return func(w http.ResponseWriter, _ *http.Request) {
		if etag != "" {
			w.Header().Set("ETag", etag)
		}
		w.Header().Set("Content-Length", strconv.Itoa(len(b)))
		w.Write(b[:len(b)/2])
		w.(http.Flusher).Flush()
		conn, _, _ := w.(http.Hijacker).Hijack()
		conn.Close()
	}
}

// stall sends half of b and then nothing until the client goes away.
func stall(b []byte) step {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Last-Modified", "Fri, 04 Dec 2026 08:00:00 GMT")
		w.Header().Set("Content-Length", strconv.Itoa(len(b)))
		w.Write(b[:len(b)/2])
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}
}

// ranged serves b with Range support and the ETag etag, as kiln serve does.
func ranged(b []byte, etag string) step {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("ETag", etag)
		http.ServeContent(w, r, "rootfs.img", time.Time{}, bytes.NewReader(b))
	}
}

// wrongRange answers any request with 206 for bytes from 0.
func wrongRange(b []byte) step {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Range", fmt.Sprintf("bytes 0-%d/%d", len(b)-1, len(b)))
		w.WriteHeader(http.StatusPartialContent)
		w.Write(b)
	}
}

// chunked sends b without a Content-Length.
func chunked(b []byte) step {
	return func(w http.ResponseWriter, _ *http.Request) {
		for i := 0; i < len(b); i += 64 << 10 {
			w.Write(b[i:min(i+64<<10, len(b))])
			w.(http.Flusher).Flush()
		}
	}
}

func TestFetch(t *testing.T) {
	img, sum := image(3<<20 + 17)
	corrupt := bytes.Clone(img)
	corrupt[len(corrupt)/3] ^= 0x01
	tests := []struct {
		name     string
		steps    []step
		tmpfs    int64
		attempts int
		stall    time.Duration
		wantErr  string
		wantHits int32
		ranges   []string // the Range header of each request, when checked
	}{
		{name: "ok", steps: []step{body(img)}, wantHits: 1},
		{name: "503 then ok is tried again", steps: []step{status(503), body(img)}, wantHits: 2},
		{name: "body cut short resumes where it stopped", steps: []step{cut(img, `"v1"`), ranged(img, `"v1"`)}, wantHits: 2,
			ranges: []string{"", fmt.Sprintf("bytes=%d-", len(img)/2)}},
		{name: "body cut short without a validator starts over", steps: []step{cut(img, ""), body(img)}, wantHits: 2,
			ranges: []string{"", ""}},
		{name: "an image changed meanwhile (If-Range) comes whole", steps: []step{cut(img, `"v0"`), ranged(img, `"v1"`)}, wantHits: 2},
		{name: "a 206 from the wrong offset starts over", steps: []step{cut(img, `"v1"`), wrongRange(img), body(img)}, wantHits: 3,
			ranges: []string{"", fmt.Sprintf("bytes=%d-", len(img)/2), ""}},
		{name: "stalled body resumes", steps: []step{stall(img), ranged(img, `"v1"`)}, stall: 300 * time.Millisecond, wantHits: 2,
			ranges: []string{"", fmt.Sprintf("bytes=%d-", len(img)/2)}},
		{name: "no content-length", steps: []step{chunked(img)}, wantHits: 1},
		{name: "a corrupt byte is refused at once", steps: []step{body(corrupt)},
			wantErr: "sha256 mismatch: the image has " + sha(corrupt) + ", kiln.live.rootfs_sha256 wants " + sum + ": refusing to use it", wantHits: 1},
		{name: "404 is not tried again", steps: []step{status(404)}, wantErr: "server answered 404 Not Found", wantHits: 1},
		{name: "403 is not tried again", steps: []step{status(403)}, wantErr: "server answered 403 Forbidden", wantHits: 1},
		{name: "503 every time gives up", steps: []step{status(503)}, attempts: 3,
			wantErr: "server answered 503 Service Unavailable (gave up after 3 attempts)", wantHits: 3},
		{name: "larger than the tmpfs is refused before fetching", steps: []step{body(img)}, tmpfs: 2 << 20,
			wantErr: "the image is 3145745 bytes, more than the 2097152 bytes of RAM free for it", wantHits: 1},
		{name: "larger than the tmpfs without content-length", steps: []step{chunked(img)}, tmpfs: 2 << 20,
			wantErr: "the image is larger than the 2097152 bytes of RAM free for it", wantHits: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// The directory does not exist yet, as /live in a fresh initramfs.
			dir := filepath.Join(ramDir(t, cmp.Or(tt.tmpfs, 16<<20)), "live")
			srv := serve(t, tt.steps...)
			clock := &testkit.InstantClock{}
			var logs bytes.Buffer
			f := Fetcher{Dir: dir, attempts: tt.attempts, clock: clock, stall: tt.stall}
			path, err := f.Fetch(t.Context(), slog.New(slog.NewTextHandler(&logs, nil)), srv.URL+"/rootfs.img", sum)
			if hits := srv.hits.Load(); hits != tt.wantHits {
				t.Errorf("server saw %d requests, want %d", hits, tt.wantHits)
			}
			if tt.ranges != nil && !slices.Equal(srv.ranges, tt.ranges) {
				t.Errorf("Range headers %q, want %q", srv.ranges, tt.ranges)
			}
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Fetch error = %v, want it to contain %q", err, tt.wantErr)
				}
				if ents, _ := os.ReadDir(dir); len(ents) != 0 {
					t.Errorf("Fetch failed but left %v in %s", ents, dir)
				}
				return
			}
			if err != nil {
				t.Fatalf("Fetch: %v\n%s", err, logs.String())
			}
			got, err := os.ReadFile(path)
			if err != nil || !bytes.Equal(got, img) {
				t.Fatalf("fetched file differs from the image (%v)", err)
			}
			if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o400 || filepath.Dir(path) != dir {
				t.Errorf("fetched file %s has mode %v", path, fi.Mode())
			}
			if retries := int(tt.wantHits) - 1; len(clock.Pauses()) != retries || strings.Count(logs.String(), "trying again") != retries {
				t.Errorf("pauses %v, want %d; log:\n%s", clock.Pauses(), retries, logs.String())
			}
		})
	}
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func TestFetchRefusesDirNotInRAM(t *testing.T) {
	dir := t.TempDir()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil || st.Type == unix.TMPFS_MAGIC || st.Type == unix.RAMFS_MAGIC {
		t.Skipf("the test's temporary directory is in RAM (%v)", err)
	}
	srv := serve(t, body([]byte("x")))
	_, err := Fetcher{Dir: dir}.Fetch(t.Context(), slog.New(slog.DiscardHandler), srv.URL, sha([]byte("x")))
	if err == nil || !strings.Contains(err.Error(), "not tmpfs or ramfs: the image must be fetched into RAM") {
		t.Fatalf("Fetch into %s: %v", dir, err)
	}
	if srv.hits.Load() != 0 {
		t.Error("Fetch asked the server although it had nowhere to put the image")
	}
}

func TestFetchRefusesWhenMemoryIsShort(t *testing.T) {
	dir := ramDir(t, 16<<20)
	meminfo := filepath.Join(t.TempDir(), "meminfo")
	os.WriteFile(meminfo, []byte("MemTotal:        1000000 kB\nMemAvailable:     200000 kB\n"), 0o644)
	srv := serve(t, body([]byte("x")))
	_, err := Fetcher{Dir: dir, memInfo: meminfo}.Fetch(t.Context(), slog.New(slog.DiscardHandler), srv.URL, sha([]byte("x")))
	if want := "no RAM free for the image: 195 MiB available, 256 MiB kept for the system"; err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("Fetch = %v, want %q", err, want)
	}
	// With 300 MiB available, 44 MiB are left for the image: 64 MiB announced is refused.
	os.WriteFile(meminfo, []byte("MemAvailable:     307200 kB\n"), 0o644)
	big := serve(t, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(64<<20))
		io.CopyN(w, zeros{}, 64<<20)
	})
	_, err = Fetcher{Dir: ramDir(t, 128<<20), memInfo: meminfo}.Fetch(t.Context(), slog.New(slog.DiscardHandler), big.URL, sha(nil))
	if want := "the image is 64 MiB, more than the 44 MiB of RAM free for it (256 MiB kept for the system)"; err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("Fetch = %v, want %q", err, want)
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

func TestFetchRefusesHTTPSDowngrade(t *testing.T) {
	plain := serve(t, body([]byte("x")))
	tls := httptest.NewTLSServer(http.RedirectHandler(plain.URL+"/rootfs.img", http.StatusFound))
	t.Cleanup(tls.Close)
	_, err := Fetcher{Dir: ramDir(t, 1<<20), httpClient: tls.Client()}.Fetch(t.Context(), slog.New(slog.DiscardHandler), tls.URL, sha([]byte("x")))
	if err == nil || !strings.Contains(err.Error(), "a fetch that began on https must stay on https") {
		t.Fatalf("Fetch = %v", err)
	}
	if plain.hits.Load() != 0 {
		t.Error("the plain http server was asked")
	}
}
