package kube

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kilnproject/kiln/internal/poll"
)

// healthz answers like kube-apiserver's /healthz while its post-start hooks run: 500 and
// the checks, the failing ones marked [-], for the first failures requests; then "ok".
func healthz(failures int32, asked *atomic.Int32) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthz" {
			http.NotFound(w, r)
			return
		}
		if asked.Add(1) <= failures {
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = w.Write([]byte("[+]ping ok\n[+]etcd ok\n[-]poststarthook/rbac/bootstrap-roles failed: reason withheld\n" +
				"[-]poststarthook/scheduling/bootstrap-system-priority-classes failed: reason withheld\nhealthz check failed\n"))
			return
		}
		_, _ = w.Write([]byte("ok"))
	}
}

func TestWaitAPI(t *testing.T) {
	for _, tc := range []struct {
		name     string
		failures int32
		timeout  time.Duration
		wantErr  string // "" means the wait succeeds
	}{
		{name: "ok at once", failures: 0},
		{name: "ok once the hooks ran", failures: 3},
		{name: "still bootstrapping at the deadline", failures: 1000, timeout: 300 * time.Millisecond,
			wantErr: "poststarthook/rbac/bootstrap-roles failed: reason withheld; poststarthook/scheduling/bootstrap-system-priority-classes failed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var asked atomic.Int32
			srv := httptest.NewTLSServer(healthz(tc.failures, &asked))
			defer srv.Close()
			var logs bytes.Buffer
			c := &Client{server: srv.URL, httpClient: srv.Client()}
			err := WaitAPI(context.Background(), c, WaitAPIOptions{Timeout: tc.timeout, Interval: 20 * time.Millisecond,
				Log: slog.New(slog.NewTextHandler(&logs, nil))})
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("WaitAPI: %v", err)
				}
				if got := asked.Load(); got != tc.failures+1 {
					t.Errorf("asked /healthz %d times, want %d (until the first ok)", got, tc.failures+1)
				}
				if tc.failures > 0 && strings.Count(logs.String(), "waiting for the API server") != 1 {
					t.Errorf("want the failing checks logged once while they do not change, got:\n%s", logs.String())
				}
				if !strings.Contains(logs.String(), "API server ok") {
					t.Errorf("log does not say the API server is ok:\n%s", logs.String())
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !errors.Is(err, poll.ErrTimeout) {
				t.Fatalf("WaitAPI = %v; want a timeout naming %q", err, tc.wantErr)
			}
			if strings.Contains(err.Error(), "[+]") || strings.Contains(err.Error(), "ping ok") {
				t.Errorf("error lists the checks that passed: %v", err)
			}
		})
	}
}

func TestWaitAPIStopsWithItsContext(t *testing.T) {
	var asked atomic.Int32
	srv := httptest.NewTLSServer(healthz(1000, &asked))
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	err := WaitAPI(ctx, &Client{server: srv.URL, httpClient: srv.Client()}, WaitAPIOptions{Interval: 20 * time.Millisecond})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitAPI without a timeout = %v; want it to end with its context", err)
	}
}
