package source

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kilnproject/kiln/internal/fetch"
)

// TestAttackRedirectDowngrade: kiln.config.url on https must not be led off TLS. A
// redirect to http (where anyone on the path can swap the config) is refused at once,
// without retries; http to https is followed; a chain of more than fetch.MaxRedirects is
// refused.
func TestAttackRedirectDowngrade(t *testing.T) {
	var secureURL string // set once the https server runs
	var plainHits atomic.Int32
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		plainHits.Add(1)
		if r.URL.Path == "/up" {
			http.Redirect(w, r, secureURL+"/node.ign", http.StatusFound)
			return
		}
		w.Write([]byte(`{"ignition":{"version":"3.4.0"},"passwd":{"users":[{"name":"attacker"}]}}`))
	}))
	defer plain.Close()
	var secureHits atomic.Int32
	secure := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		secureHits.Add(1)
		switch {
		case r.URL.Path == "/down":
			http.Redirect(w, r, plain.URL+"/evil.ign", http.StatusFound)
		case strings.HasPrefix(r.URL.Path, "/loop"):
			http.Redirect(w, r, r.URL.Path+"x", http.StatusFound)
		default:
			w.Write([]byte(`{"ignition":{"version":"3.4.0"}}`))
		}
	}))
	defer secure.Close()
	secureURL = secure.URL

	tests := []struct {
		name     string
		url      string
		wantData string
		wantErr  []string
		// wantSecureHits is how many requests reach the https server: a refused
		// redirect is not retried.
		wantSecureHits int32
		wantPlainHits  int32
	}{
		{name: "https to http refused", url: secure.URL + "/down",
			wantErr:        []string{"refused redirect", plain.URL + "/evil.ign", "must stay on https"},
			wantSecureHits: 1},
		{name: "http to https followed", url: plain.URL + "/up", wantData: `{"ignition":{"version":"3.4.0"}}`,
			wantSecureHits: 1, wantPlainHits: 1},
		{name: "endless redirects refused", url: secure.URL + "/loop",
			wantErr:        []string{"refused redirect", "more than 10 redirects"},
			wantSecureHits: fetch.MaxRedirects + 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			secureHits.Store(0)
			plainHits.Store(0)
			c := &CmdlineURL{
				// The timeout only bounds a client that wrongly retries.
				Cmdline:    "kiln.config.url=" + tc.url + " kiln.config.timeout=20s",
				HTTPClient: secure.Client(),
				Backoff:    10 * time.Millisecond,
			}
			data, err := c.Fetch(context.Background())
			if tc.wantErr == nil {
				if err != nil || string(data) != tc.wantData {
					t.Fatalf("Fetch = %q, %v; want %q", data, err, tc.wantData)
				}
			} else {
				if err == nil {
					t.Fatalf("Fetch = %q; want an error", data)
				}
				for _, want := range tc.wantErr {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("error %q does not contain %q", err, want)
					}
				}
			}
			if got := secureHits.Load(); got != tc.wantSecureHits {
				t.Errorf("%d requests to the https server, want %d", got, tc.wantSecureHits)
			}
			if got := plainHits.Load(); got != tc.wantPlainHits {
				t.Errorf("%d requests to the http server, want %d", got, tc.wantPlainHits)
			}
		})
	}
}
