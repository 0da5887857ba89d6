package gce

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kilnproject/kiln/internal/cloudfake"
)

// fakeClock is a clock a test moves.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// tokenRequests counts the token requests f answered.
func tokenRequests(f *cloudfake.GCEMetadata) int {
	n := 0
	for _, c := range f.Calls() {
		if strings.HasSuffix(c, "/"+tokenPath) {
			n++
		}
	}
	return n
}

// TestTokenCached: the token is asked for once and kept until tokenEarly before it
// expires (the fake's live 3599 s), then asked for again.
func TestTokenCached(t *testing.T) {
	f := &cloudfake.GCEMetadata{Token: "ya29.first"}
	srv := cloudfake.Serve(t, f)
	clock := &fakeClock{t: time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)}
	ts := &metadataToken{md: newMetadataClient(srv.Listener.Addr().String(), nil), now: clock.now}
	ctx := context.Background()
	steps := []struct {
		after     time.Duration // since the step before
		newToken  string        // the metadata server's token from this step on, when set
		want      string
		wantAsked int // token requests so far
	}{
		{0, "", "ya29.first", 1},
		{0, "", "ya29.first", 1},
		{time.Hour - tokenEarly - 2*time.Second, "ya29.second", "ya29.first", 1}, // a second left before the refresh
		{2 * time.Second, "", "ya29.second", 2},
		{time.Minute, "", "ya29.second", 2},
	}
	for i, s := range steps {
		clock.add(s.after)
		if s.newToken != "" {
			f.Lock()
			f.Token = s.newToken
			f.Unlock()
		}
		got, err := ts.token(ctx)
		if err != nil || got != s.want || tokenRequests(f) != s.wantAsked {
			t.Errorf("step %d: token = %q, %v after %d requests; want %q after %d", i, got, err, tokenRequests(f), s.want, s.wantAsked)
		}
	}
}

// TestTokenErrors: token answers that give no usable bearer token, and one that lives
// too short to be kept.
func TestTokenErrors(t *testing.T) {
	tests := []struct {
		name    string
		status  int
		body    string
		want    string
		wantErr string
	}{
		{"bearer", 200, `{"access_token":"ya29.a","expires_in":3599,"token_type":"Bearer"}`, "ya29.a", ""},
		{"no token type", 200, `{"access_token":"ya29.a","expires_in":3599}`, "ya29.a", ""},
		{"about to expire: used, not kept", 200, `{"access_token":"ya29.a","expires_in":30,"token_type":"Bearer"}`, "ya29.a", ""},
		{"no service account", 404, "Not Found", "", "GCE metadata instance/service-accounts/default/token: not defined"},
		{"no access token", 200, `{"expires_in":3599,"token_type":"Bearer"}`, "", "no access_token in the answer"},
		{"another token type", 200, `{"access_token":"ya29.a","expires_in":3599,"token_type":"MAC"}`, "", `token type "MAC", want Bearer`},
		{"not JSON", 200, `ya29.a`, "", "invalid character"},
		{"forbidden", 403, "Forbidden", "", "answered 403 Forbidden"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var asked atomic.Int32
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				asked.Add(1)
				w.Header().Set("Metadata-Flavor", "Google")
				w.WriteHeader(tt.status)
				w.Write([]byte(tt.body))
			}))
			defer srv.Close()
			ts := newMetadataToken(newMetadataClient(srv.Listener.Addr().String(), nil))
			for range 2 {
				got, err := ts.token(context.Background())
				if tt.wantErr != "" {
					if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
						t.Fatalf("token = %q, %v; want error %q", got, err, tt.wantErr)
					}
				} else if err != nil || got != tt.want {
					t.Fatalf("token = %q, %v; want %q", got, err, tt.want)
				}
			}
			// A kept token is not asked for again; a refusal is, on the next call.
			wantAsked := 2
			if tt.wantErr == "" && !strings.Contains(tt.name, "not kept") {
				wantAsked = 1
			}
			if n := int(asked.Load()); n != wantAsked {
				t.Errorf("asked %d times, want %d", n, wantAsked)
			}
		})
	}
}
