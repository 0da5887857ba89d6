package gce

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kilnproject/kiln/internal/cloudfake"
	"github.com/kilnproject/kiln/internal/poll"
)

// TestMetadataClient: which answers of the metadata server are values, which are tried
// again (429, 5xx, a dropped connection) and which are errors at once.
func TestMetadataClient(t *testing.T) {
	type reply struct {
		status int // 0 drops the connection
		flavor bool
		body   string
	}
	ok := reply{200, true, " cp-a\n"}
	tests := []struct {
		name         string
		replies      []reply // in order, the last one again once they are used up
		want         string
		wantErr      string
		notDefined   bool
		wantAttempts int
	}{
		{"value", []reply{ok}, "cp-a", "", false, 1},
		{"503, then the value", []reply{{503, true, "busy"}, ok}, "cp-a", "", false, 2},
		{"429, then the value", []reply{{429, true, ""}, ok}, "cp-a", "", false, 2},
		{"dropped, then the value", []reply{{0, false, ""}, ok}, "cp-a", "", false, 2},
		{"500 every time", []reply{{500, true, "oops"}}, "", `answered 500 Internal Server Error: "oops" (gave up after 6 attempts)`, false, metadataAttempts},
		{"not defined", []reply{{404, true, "Not Found"}}, "", "not defined", true, 1},
		{"forbidden", []reply{{403, true, "Missing Metadata-Flavor:Google header."}}, "", "answered 403 Forbidden", false, 1},
		{"redirect not followed", []reply{{302, true, ""}}, "", "answered 302 Found", false, 1},
		{"not Google's", []reply{{200, false, "cp-a"}}, "", "is not a Google metadata server (no Metadata-Flavor: Google in the answer, status 200 OK)", false, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var asked atomic.Int32
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				n := int(asked.Add(1)) - 1
				rep := tt.replies[min(n, len(tt.replies)-1)]
				if r.Header.Get("Metadata-Flavor") != "Google" || r.URL.Path != "/computeMetadata/v1/instance/name" {
					t.Errorf("request %s with Metadata-Flavor %q", r.URL, r.Header.Get("Metadata-Flavor"))
				}
				if rep.status == 0 {
					if conn, _, err := w.(http.Hijacker).Hijack(); err == nil {
						conn.Close()
					}
					return
				}
				if rep.flavor {
					w.Header().Set("Metadata-Flavor", "Google")
				}
				if rep.status == http.StatusFound {
					w.Header().Set("Location", "http://169.254.169.254/elsewhere")
				}
				w.WriteHeader(rep.status)
				w.Write([]byte(rep.body))
			}))
			defer srv.Close()
			md := newMetadataClient(srv.Listener.Addr().String(), nil)
			md.retry.Backoff = poll.Backoff{Initial: time.Millisecond}
			got, err := md.getTrimmed(context.Background(), "instance/name")
			switch {
			case tt.wantErr == "" && (err != nil || got != tt.want):
				t.Errorf("get = %q, %v; want %q", got, err, tt.want)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Errorf("get = %q, %v; want error %q", got, err, tt.wantErr)
			case errors.Is(err, errNotDefined) != tt.notDefined:
				t.Errorf("get error %v: not defined %v, want %v", err, errors.Is(err, errNotDefined), tt.notDefined)
			}
			if n := int(asked.Load()); n != tt.wantAttempts {
				t.Errorf("%d attempts, want %d", n, tt.wantAttempts)
			}
		})
	}
}

// TestMetadataHost: GCE_METADATA_HOST names the metadata server when no host is given; a
// host given wins.
func TestMetadataHost(t *testing.T) {
	f := &cloudfake.GCEMetadata{Name: "cp-a"}
	srv := cloudfake.Serve(t, f)
	t.Setenv("GCE_METADATA_HOST", srv.Listener.Addr().String())
	if got, err := newMetadataClient("", nil).getTrimmed(context.Background(), "instance/name"); err != nil || got != "cp-a" {
		t.Errorf("with GCE_METADATA_HOST: %q, %v", got, err)
	}
	if got := newMetadataClient("192.0.2.1:80", nil).host; got != "192.0.2.1:80" {
		t.Errorf("host %q, want the one given", got)
	}
	t.Setenv("GCE_METADATA_HOST", "")
	if got := newMetadataClient("", nil).host; got != metadataIP {
		t.Errorf("host %q, want %s", got, metadataIP)
	}
}
