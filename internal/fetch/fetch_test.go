package fetch

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kilnproject/kiln/internal/poll"
	"github.com/kilnproject/kiln/internal/testkit"
)

func TestCheckStatus(t *testing.T) {
	now := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		code       int
		retryAfter string
		wantErr    string // "" for none
		permanent  bool
		wantPause  time.Duration
	}{
		{code: 200},
		{code: 206, wantErr: "server answered 206 Partial Content", permanent: true},
		{code: 403, wantErr: "server answered 403 Forbidden", permanent: true},
		{code: 404, wantErr: "server answered 404 Not Found", permanent: true},
		{code: 408, wantErr: "server answered 408 Request Timeout"},
		{code: 429, retryAfter: "7", wantErr: "server answered 429 Too Many Requests", wantPause: 7 * time.Second},
		{code: 500, retryAfter: "7", wantErr: "server answered 500 Internal Server Error"}, // Retry-After only on 429 and 503
		{code: 503, retryAfter: now.Add(10 * time.Second).Format(http.TimeFormat), wantErr: "server answered 503 Service Unavailable", wantPause: 10 * time.Second},
		{code: 503, retryAfter: "soon", wantErr: "server answered 503 Service Unavailable"},
	}
	for _, tt := range tests {
		resp := &http.Response{StatusCode: tt.code, Status: strconv.Itoa(tt.code) + " " + http.StatusText(tt.code), Header: http.Header{}}
		if tt.retryAfter != "" {
			resp.Header.Set("Retry-After", tt.retryAfter)
		}
		err := CheckStatus(resp, now)
		if tt.wantErr == "" {
			if err != nil {
				t.Errorf("%d: %v, want nil", tt.code, err)
			}
			continue
		}
		var se *StatusError
		if err == nil || err.Error() != tt.wantErr || !errors.As(err, &se) || se.Code != tt.code {
			t.Errorf("%d: %v, want %q", tt.code, err, tt.wantErr)
			continue
		}
		if IsPermanent(err) != tt.permanent || se.RetryAfter != tt.wantPause {
			t.Errorf("%d: permanent %v, Retry-After pause %v; want %v, %v", tt.code, IsPermanent(err), se.RetryAfter, tt.permanent, tt.wantPause)
		}
	}
}

// TestRedirects: a chain that began on https may not go on over http; http to https is
// followed; a chain longer than MaxRedirects is refused. Refusals are permanent.
func TestRedirects(t *testing.T) {
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/loop/") {
			http.Redirect(w, r, "/loop"+r.URL.Path, http.StatusFound)
			return
		}
		io.WriteString(w, "plain")
	}))
	defer plain.Close()
	secure := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/down" {
			http.Redirect(w, r, plain.URL+"/x", http.StatusFound)
			return
		}
		io.WriteString(w, "secure")
	}))
	defer secure.Close()
	up := httptest.NewServer(http.RedirectHandler(secure.URL+"/y", http.StatusFound))
	defer up.Close()
	client := secure.Client()
	tests := []struct {
		url, body, err string
	}{
		{url: secure.URL + "/down", err: "a fetch that began on https must stay on https"},
		{url: up.URL, body: "secure"},
		{url: plain.URL + "/loop/", err: "more than 10 redirects"},
	}
	for _, tt := range tests {
		req, _ := http.NewRequest(http.MethodGet, tt.url, nil)
		resp, err := Do(client, req)
		if tt.err != "" {
			var re *RedirectError
			if err == nil || !strings.Contains(err.Error(), tt.err) || !errors.As(err, &re) || !IsPermanent(err) {
				t.Errorf("%s: %v, want a permanent refusal naming %q", tt.url, err, tt.err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", tt.url, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(b) != tt.body {
			t.Errorf("%s: body %q, want %q", tt.url, b, tt.body)
		}
	}
}

func TestRetryDo(t *testing.T) {
	transient := errors.New("connection reset")
	busy := &StatusError{Code: 503, Status: "503 Service Unavailable", RetryAfter: 3 * time.Second}
	greedy := &StatusError{Code: 429, Status: "429 Too Many Requests", RetryAfter: time.Hour}
	tests := []struct {
		name       string
		attempts   int
		results    []error // what each call returns; past the end, nil
		wantCalls  int
		wantErr    string
		wantPauses []time.Duration
	}{
		{name: "success after transient failures", results: []error{transient, transient},
			wantCalls: 3, wantPauses: []time.Duration{time.Second, 2 * time.Second}},
		{name: "permanent ends at once", results: []error{Permanent(errors.New("404"))},
			wantCalls: 1, wantErr: "404"},
		{name: "attempts bounded", attempts: 3, results: []error{transient, transient, transient, transient},
			wantCalls: 3, wantErr: "connection reset (gave up after 3 attempts)", wantPauses: []time.Duration{time.Second, 2 * time.Second}},
		{name: "one attempt says no count", attempts: 1, results: []error{transient},
			wantCalls: 1, wantErr: "connection reset"},
		{name: "Retry-After sets the pause", results: []error{busy},
			wantCalls: 2, wantPauses: []time.Duration{3 * time.Second}},
		{name: "Retry-After capped by the backoff's Max", results: []error{greedy},
			wantCalls: 2, wantPauses: []time.Duration{4 * time.Second}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := &testkit.InstantClock{}
			r := Retry{Attempts: tt.attempts, Backoff: poll.Backoff{Initial: time.Second, Factor: 2, Max: 4 * time.Second}, Clock: clock}
			calls := 0
			err := r.Do(context.Background(), "x", func(context.Context) error {
				calls++
				if calls <= len(tt.results) {
					return tt.results[calls-1]
				}
				return nil
			})
			if calls != tt.wantCalls {
				t.Errorf("%d calls, want %d", calls, tt.wantCalls)
			}
			switch {
			case tt.wantErr == "" && err != nil:
				t.Errorf("Do = %v", err)
			case tt.wantErr != "" && (err == nil || err.Error() != tt.wantErr || !IsPermanent(err)):
				t.Errorf("Do = %v, want permanent %q", err, tt.wantErr)
			}
			if got := clock.Pauses(); !slices.Equal(got, tt.wantPauses) {
				t.Errorf("pauses %v, want %v", got, tt.wantPauses)
			}
		})
	}
}

// TestRetryDoContextEnds: when ctx ends the error is the last attempt's, with how many
// attempts were made and why it stopped.
func TestRetryDoContextEnds(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	calls := 0
	err := Retry{Backoff: poll.Constant(time.Millisecond)}.Do(ctx, "x", func(context.Context) error {
		calls++
		if calls == 3 {
			cancel()
		}
		return errors.New("server answered 502 Bad Gateway")
	})
	want := "server answered 502 Bad Gateway (gave up after 3 attempts: context canceled)"
	if err == nil || err.Error() != want || !errors.Is(err, context.Canceled) {
		t.Errorf("Do = %v, want %q", err, want)
	}
}

// TestWatch: a server that sends nothing ends the context with ErrStalled; reads that bring
// data, and time spent between reads or while Idle, do not.
func TestWatch(t *testing.T) {
	const after = 100 * time.Millisecond
	t.Run("silent server", func(t *testing.T) {
		pr, pw := io.Pipe()
		defer pw.Close()
		ctx, w := Watch(context.Background(), after)
		defer w.Stop()
		go func() { <-ctx.Done(); pw.CloseWithError(context.Cause(ctx)) }()
		_, err := io.ReadAll(w.Reader(pr))
		if !errors.Is(err, ErrStalled) || !errors.Is(context.Cause(ctx), ErrStalled) || err.Error() != "no data arrived for 100ms" {
			t.Errorf("read = %v, cause %v; want a stall", err, context.Cause(ctx))
		}
	})
	t.Run("slow reader, steady server", func(t *testing.T) {
		ctx, w := Watch(context.Background(), after)
		defer w.Stop()
		w.Idle()
		time.Sleep(3 * after) // the caller busy before it reads
		r := w.Reader(strings.NewReader(strings.Repeat("x", 4)))
		buf := make([]byte, 1)
		for {
			if _, err := r.Read(buf); err == io.EOF {
				break
			}
			time.Sleep(2 * after) // writing what arrived to a slow disk
		}
		if ctx.Err() != nil {
			t.Errorf("context ended: %v", context.Cause(ctx))
		}
	})
	t.Run("no answer at all", func(t *testing.T) {
		ctx, w := Watch(context.Background(), after)
		defer w.Stop()
		select {
		case <-ctx.Done():
			if !errors.Is(context.Cause(ctx), ErrStalled) {
				t.Errorf("cause %v", context.Cause(ctx))
			}
		case <-time.After(10 * after):
			t.Error("a server that never answered was not taken for stalled")
		}
	})
}
