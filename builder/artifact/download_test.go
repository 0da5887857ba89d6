package artifact

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kilnproject/kiln/internal/poll"
	"github.com/kilnproject/kiln/internal/testkit"
)

// stuckClock never ends a pause: only the context does.
type stuckClock struct{ testkit.InstantClock }

func (*stuckClock) After(time.Duration) <-chan time.Time { return nil }

// rangeServer is an HTTP server whose i-th answer (from 0) the test scripts, recording
// each request's Range and If-Range.
type rangeServer struct {
	*httptest.Server
	mu   sync.Mutex
	reqs []http.Header
}

func newRangeServer(t *testing.T, serve func(i int, w http.ResponseWriter, r *http.Request)) *rangeServer {
	s := &rangeServer{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		i := len(s.reqs)
		s.reqs = append(s.reqs, r.Header.Clone())
		s.mu.Unlock()
		serve(i, w, r)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *rangeServer) requests() []http.Header {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reqs
}

// version is one version of the served file, with the validator a server gives it.
type version struct {
	data []byte
	etag string    // "" sends none
	mod  time.Time // zero sends no Last-Modified
}

// serveFile answers as net/http's file server does: Range and If-Range honoured.
func (v version) serveFile(w http.ResponseWriter, r *http.Request) {
	if v.etag != "" {
		w.Header().Set("ETag", v.etag)
	}
	http.ServeContent(w, r, "blob", v.mod, bytes.NewReader(v.data))
}

// serveWhole sends the whole file with 200 whatever the request asks for.
func (v version) serveWhole(w http.ResponseWriter, _ *http.Request) {
	if v.etag != "" {
		w.Header().Set("ETag", v.etag)
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(v.data)))
	w.Write(v.data)
}

// serveCut announces the whole file but sends only its first n bytes, then drops the
// connection.
func (v version) serveCut(n int) func(w http.ResponseWriter, r *http.Request) {
	return func(w http.ResponseWriter, r *http.Request) {
		if v.etag != "" {
			w.Header().Set("ETag", v.etag)
		}
		if !v.mod.IsZero() {
			w.Header().Set("Last-Modified", v.mod.UTC().Format(http.TimeFormat))
		}
		w.Header().Set("Content-Length", strconv.Itoa(len(v.data)))
		w.Write(v.data[:n])
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler)
	}
}

// serveRangeCut answers a Range request bytes=N- with 206 as a file server does, but drops
// the connection once the first end bytes of the file have been sent.
func (v version) serveRangeCut(end int) func(w http.ResponseWriter, r *http.Request) {
	return func(w http.ResponseWriter, r *http.Request) {
		start, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(r.Header.Get("Range"), "bytes="), "-"))
		if err != nil || r.Header.Get("If-Range") != v.etag {
			http.Error(w, "the test expects a resume of "+v.etag, http.StatusBadRequest)
			return
		}
		w.Header().Set("ETag", v.etag)
		w.Header().Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", start, len(v.data)-1, len(v.data)))
		w.Header().Set("Content-Length", strconv.Itoa(len(v.data)-start))
		w.WriteHeader(http.StatusPartialContent)
		w.Write(v.data[start:end])
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler)
	}
}

func status(code int) func(w http.ResponseWriter, r *http.Request) {
	return func(w http.ResponseWriter, r *http.Request) { http.Error(w, http.StatusText(code), code) }
}

// script answers request i with steps[i], and with the last step past the end.
func script(steps ...func(w http.ResponseWriter, r *http.Request)) func(int, http.ResponseWriter, *http.Request) {
	return func(i int, w http.ResponseWriter, r *http.Request) {
		steps[min(i, len(steps)-1)](w, r)
	}
}

func TestDownloadRetriesAndResumes(t *testing.T) {
	const cut = 40000
	modTime := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	v1 := version{data: payload(100 << 10), etag: `"v1"`}
	v2 := version{data: payload(90 << 10)[1000:], etag: `"v2"`}
	byDate := version{data: v1.data, mod: modTime}
	type want struct {
		content  []byte   // what the cache must hold; nil: the fetch fails
		sha256   string   // the pin; default: content's
		requests int      // exactly this many requests
		ranges   []string // Range of each request
		ifRange  []string // If-Range of each request
		pauses   int      // pauses taken between attempts
		err      []string // the error says each of these
		log      []string // the log says each of these
	}
	tests := []struct {
		name  string
		serve func(int, http.ResponseWriter, *http.Request)
		want  want
	}{
		{
			name:  "503 twice then OK",
			serve: script(status(503), status(503), v1.serveFile),
			want: want{content: v1.data, requests: 3, ranges: []string{"", "", ""}, pauses: 2,
				log: []string{"download failed, retrying", "attempt=1", "attempt=2", "503 Service Unavailable", "next="}},
		},
		{
			name:  "429 and 500 are transient too",
			serve: script(status(429), status(500), v1.serveFile),
			want:  want{content: v1.data, requests: 3, pauses: 2},
		},
		{
			name:  "cut short, resumed with Range and If-Range",
			serve: script(v1.serveCut(cut), v1.serveFile),
			want: want{content: v1.data, requests: 2, ranges: []string{"", fmt.Sprintf("bytes=%d-", cut)},
				ifRange: []string{"", `"v1"`}, pauses: 1, log: []string{"unexpected EOF", fmt.Sprintf("have=%d", cut)}},
		},
		{
			name:  "resumed by Last-Modified when there is no ETag",
			serve: script(byDate.serveCut(cut), byDate.serveFile),
			want: want{content: v1.data, requests: 2, ranges: []string{"", fmt.Sprintf("bytes=%d-", cut)},
				ifRange: []string{"", modTime.Format(http.TimeFormat)}, pauses: 1},
		},
		{
			name:  "cut twice, resumed twice",
			serve: script(v1.serveCut(cut), v1.serveRangeCut(cut+1000), v1.serveFile),
			want: want{content: v1.data, requests: 3, pauses: 2,
				ranges: []string{"", fmt.Sprintf("bytes=%d-", cut), fmt.Sprintf("bytes=%d-", cut+1000)}},
		},
		{
			name:  "a server ignoring Range is read again from zero",
			serve: script(v1.serveCut(cut), v1.serveWhole),
			want: want{content: v1.data, requests: 2, ranges: []string{"", fmt.Sprintf("bytes=%d-", cut)}, pauses: 1,
				log: []string{"download restarts from zero", fmt.Sprintf("had=%d", cut)}},
		},
		{
			name:  "the file changed: If-Range fails and the new file is read whole",
			serve: script(v1.serveCut(cut), v2.serveFile),
			want: want{content: v2.data, requests: 2, ranges: []string{"", fmt.Sprintf("bytes=%d-", cut)},
				ifRange: []string{"", `"v1"`}, pauses: 1},
		},
		{
			name:  "checksum mismatch is not retried",
			serve: script(v1.serveFile),
			want: want{sha256: hexSum(v2.data), requests: 1,
				err: []string{"sha256 mismatch", "want " + hexSum(v2.data), "got " + hexSum(v1.data), "/blob"}},
		},
		{
			name:  "404 is not retried",
			serve: script(status(404), v1.serveFile),
			want:  want{sha256: hexSum(v1.data), requests: 1, err: []string{"/blob: server answered 404 Not Found"}},
		},
		{
			name:  "403 is not retried",
			serve: script(status(403), v1.serveFile),
			want:  want{sha256: hexSum(v1.data), requests: 1, err: []string{"/blob: server answered 403 Forbidden"}},
		},
		{
			name:  "attempts are bounded",
			serve: script(status(502)),
			want: want{sha256: hexSum(v1.data), requests: 5, pauses: 4,
				err: []string{"/blob: server answered 502 Bad Gateway (gave up after 5 attempts)"}},
		},
		{
			name:  "cut short every time: bounded, the partial file removed",
			serve: script(v1.serveCut(cut), status(503)),
			want:  want{sha256: hexSum(v1.data), requests: 5, pauses: 4, err: []string{"503 Service Unavailable (gave up after 5 attempts)"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := newRangeServer(t, tt.serve)
			var log bytes.Buffer
			clock := &testkit.InstantClock{}
			c := NewCache(t.TempDir())
			c.Log = slog.New(slog.NewTextHandler(&log, nil))
			c.Retry = DownloadRetry{Clock: clock}
			sum := tt.want.sha256
			if sum == "" {
				sum = hexSum(tt.want.content)
			}
			p, err := c.Fetch(t.Context(), Source{Name: "blob", URL: srv.URL + "/blob", SHA256: sum})

			if tt.want.content != nil {
				if err != nil {
					t.Fatal(err)
				}
				if got, _ := os.ReadFile(p); !bytes.Equal(got, tt.want.content) {
					t.Errorf("cached file is %d bytes and differs from the served %d", len(got), len(tt.want.content))
				}
			} else {
				if err == nil {
					t.Fatal("fetch succeeded, want an error")
				}
				for _, w := range tt.want.err {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q does not say %q", err, w)
					}
				}
				if files := cacheFiles(t, c); len(files) != 0 {
					t.Errorf("the cache holds %v after a failed fetch", files)
				}
			}
			reqs := srv.requests()
			if len(reqs) != tt.want.requests {
				t.Errorf("%d requests, want %d", len(reqs), tt.want.requests)
			}
			for i, want := range tt.want.ranges {
				if i < len(reqs) && reqs[i].Get("Range") != want {
					t.Errorf("request %d: Range %q, want %q", i, reqs[i].Get("Range"), want)
				}
			}
			for i, want := range tt.want.ifRange {
				if i < len(reqs) && reqs[i].Get("If-Range") != want {
					t.Errorf("request %d: If-Range %q, want %q", i, reqs[i].Get("If-Range"), want)
				}
			}
			if len(clock.Pauses()) != tt.want.pauses {
				t.Errorf("paused %v, want %d pauses", clock.Pauses(), tt.want.pauses)
			}
			for _, w := range tt.want.log {
				if !strings.Contains(log.String(), w) {
					t.Errorf("log does not say %q:\n%s", w, log.String())
				}
			}
		})
	}
}

// TestDownloadBackoff checks the pauses: growing, jittered, capped.
func TestDownloadBackoff(t *testing.T) {
	srv := newRangeServer(t, script(status(503)))
	clock := &testkit.InstantClock{}
	c := NewCache(t.TempDir())
	c.Log = slog.New(slog.DiscardHandler)
	c.Retry = DownloadRetry{Attempts: 7, Clock: clock}
	_, err := c.Fetch(t.Context(), Source{URL: srv.URL, SHA256: emptySHA256})
	if err == nil || !strings.Contains(err.Error(), "gave up after 7 attempts") {
		t.Fatalf("error %v, want it to give up after 7 attempts", err)
	}
	// 1s doubling, capped at 30s, each drawn between half and all of it.
	nominal := []time.Duration{1, 2, 4, 8, 16, 30}
	if len(clock.Pauses()) != len(nominal) {
		t.Fatalf("pauses %v, want %d", clock.Pauses(), len(nominal))
	}
	for i, p := range clock.Pauses() {
		if hi := nominal[i] * time.Second; p < hi/2 || p > hi {
			t.Errorf("pause %d is %v, want between %v and %v", i+1, p, hi/2, hi)
		}
	}
}

// TestDownloadRetryAfter: the pause after a 429 or 503 is the one its Retry-After asks for
// (seconds or an HTTP date), capped at the backoff's Max; other answers, and values that say
// nothing usable, leave the pause to the backoff.
func TestDownloadRetryAfter(t *testing.T) {
	content := payload(1 << 10)
	// testkit.InstantClock's now is the Unix epoch.
	at := func(sec int64) string { return time.Unix(sec, 0).UTC().Format(http.TimeFormat) }
	constant := poll.Backoff{Initial: time.Second, Max: 20 * time.Second}
	tests := []struct {
		name       string
		code       int
		retryAfter string
		backoff    poll.Backoff
		want       time.Duration
	}{
		{"429 seconds", 429, "7", constant, 7 * time.Second},
		{"503 HTTP date", 503, at(12), constant, 12 * time.Second},
		{"capped at the backoff's Max", 503, "3600", constant, 20 * time.Second},
		{"capped at 30s by the default backoff", 429, at(3600), poll.Backoff{}, 30 * time.Second},
		{"a date past", 429, at(-60), constant, time.Second},
		{"not a number or a date", 429, "soon", constant, time.Second},
		{"zero", 503, "0", constant, time.Second},
		{"ignored on 500", 500, "7", constant, time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			busy := func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Retry-After", tt.retryAfter)
				http.Error(w, http.StatusText(tt.code), tt.code)
			}
			srv := newRangeServer(t, script(busy, func(w http.ResponseWriter, r *http.Request) { w.Write(content) }))
			clock := &testkit.InstantClock{}
			c := NewCache(t.TempDir())
			c.Log = slog.New(slog.DiscardHandler)
			c.Retry = DownloadRetry{Clock: clock, Backoff: tt.backoff}
			if _, err := c.Fetch(t.Context(), Source{URL: srv.URL, SHA256: hexSum(content)}); err != nil {
				t.Fatal(err)
			}
			if len(clock.Pauses()) != 1 || clock.Pauses()[0] != tt.want {
				t.Errorf("paused %v, want [%v]", clock.Pauses(), tt.want)
			}
		})
	}
}

// TestDownloadCancel checks that a cancelled context ends a download promptly, in the middle
// of a body or of a pause, and leaves nothing in the cache.
func TestDownloadCancel(t *testing.T) {
	content := payload(64 << 10)
	tests := []struct {
		name  string
		serve func(started chan<- struct{}) func(int, http.ResponseWriter, *http.Request)
	}{
		{"during the body", func(started chan<- struct{}) func(int, http.ResponseWriter, *http.Request) {
			return func(_ int, w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Length", strconv.Itoa(len(content)))
				w.Write(content[:1000])
				w.(http.Flusher).Flush()
				close(started)
				<-r.Context().Done()
			}
		}},
		{"during a pause", func(started chan<- struct{}) func(int, http.ResponseWriter, *http.Request) {
			return func(_ int, w http.ResponseWriter, r *http.Request) {
				http.Error(w, "busy", http.StatusServiceUnavailable)
				close(started)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			started := make(chan struct{})
			srv := newRangeServer(t, tt.serve(started))
			c := NewCache(t.TempDir())
			c.Log = slog.New(slog.DiscardHandler)
			c.Retry = DownloadRetry{Clock: &stuckClock{}}
			ctx, cancel := context.WithCancel(t.Context())
			go func() {
				<-started
				cancel()
			}()
			done := make(chan error, 1)
			go func() {
				_, err := c.Fetch(ctx, Source{Name: "blob", URL: srv.URL, SHA256: hexSum(content)})
				done <- err
			}()
			var err error
			select {
			case err = <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("the fetch did not end within 10s of its context")
			}
			if !errors.Is(err, context.Canceled) {
				t.Errorf("error %v, want context.Canceled", err)
			}
			if n := len(srv.requests()); n != 1 {
				t.Errorf("%d requests, want 1", n)
			}
			if files := cacheFiles(t, c); len(files) != 0 {
				t.Errorf("the cache holds %v after a cancelled fetch", files)
			}
		})
	}
}

var _ poll.Clock = (*testkit.InstantClock)(nil)
