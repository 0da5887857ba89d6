package source

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kilnproject/kiln/internal/testkit"
)

// hostileURL is a web server whose config never ends.
type hostileURL struct{ testkit.Streamer }

func (h *hostileURL) ServeHTTP(w http.ResponseWriter, _ *http.Request) { h.Stream(w) }

// TestAttackEndlessAnswer: a config server that answers far more than MaxConfigSize makes
// the source fail, naming the source and the cap, after reading
// no more than the cap: the client stops taking bytes and the heap does not grow with
// the answer.
func TestAttackEndlessAnswer(t *testing.T) {
	tests := []struct {
		name     string
		handler  *hostileURL
		provider func(srv *httptest.Server) Provider
		wantErr  []string
	}{
		{
			name:    "kiln.config.url",
			handler: &hostileURL{Streamer: testkit.Streamer{Total: 8 * MaxConfigSize}},
			provider: func(srv *httptest.Server) Provider {
				return &CmdlineURL{Cmdline: "kiln.config.url=" + srv.URL + "/node.ign", Backoff: time.Millisecond}
			},
			wantErr: []string{"config source cmdline-url", "/node.ign", "64 MiB cap"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(tc.handler)
			defer srv.Close()
			p := tc.provider(srv)

			before := testkit.HeapAllocated()
			_, _, err := Select(context.Background(), []Provider{p}, 5*time.Minute)
			grown := testkit.HeapAllocated() - before

			if err == nil {
				t.Fatal("a never-ending answer was accepted")
			}
			for _, want := range tc.wantErr {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not contain %q", err, want)
				}
			}
			tc.handler.CheckStopped(t, grown, MaxConfigSize)
		})
	}
}

// TestAttackHugeFile: a file source (embedded file, fw_cfg item) of gigabytes is refused
// naming the file and the cap.
func TestAttackHugeFile(t *testing.T) {
	huge := func(t *testing.T, path string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		f, err := os.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if err := f.Truncate(4 << 30); err != nil { // sparse: 4 GiB of zeros
			t.Fatal(err)
		}
	}
	tests := []struct {
		name    string
		setup   func(t *testing.T) (Provider, string)
		wantErr string
	}{
		{name: "embedded", setup: func(t *testing.T) (Provider, string) {
			p := filepath.Join(t.TempDir(), "config.ign")
			huge(t, p)
			return Embedded{Path: p}, p
		}, wantErr: "config source embedded"},
		{name: "fw_cfg", setup: func(t *testing.T) (Provider, string) {
			f := &FWCfg{Sysfs: t.TempDir(), LoadModule: func(context.Context) error { return nil }}
			huge(t, f.RawPath())
			return f, f.RawPath()
		}, wantErr: "config source fw_cfg"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, path := tc.setup(t)
			before := testkit.HeapAllocated()
			_, _, err := Select(context.Background(), []Provider{p}, 5*time.Minute)
			grown := testkit.HeapAllocated() - before
			if err == nil {
				t.Fatal("a 4 GiB config file was accepted")
			}
			for _, want := range []string{tc.wantErr, path, "64 MiB cap"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not contain %q", err, want)
				}
			}
			if limit := uint64(4 * MaxConfigSize); grown > limit {
				t.Errorf("reading the file allocated %d MiB, want at most %d MiB", grown>>20, limit>>20)
			}
		})
	}
}
