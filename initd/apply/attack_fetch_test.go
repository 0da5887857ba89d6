package apply

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/kilnproject/kiln/internal/testkit"
)

// TestAttackRemoteContents: storage.files contents fetched over http(s) cannot be led off
// TLS by a redirect, and cannot add up to more than config.MaxFilesSize however many
// entries share the download.
func TestAttackRemoteContents(t *testing.T) {
	zeros := make([]byte, 60<<20)
	packed := testkit.Gzip(t, zeros)
	var plainHits atomic.Int32
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		plainHits.Add(1)
		w.Write([]byte("tampered"))
	}))
	defer plain.Close()
	secure := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/down":
			http.Redirect(w, r, plain.URL+"/p", http.StatusFound)
		case "/zeros.gz":
			w.Write(packed)
		default:
			w.Write([]byte("payload"))
		}
	}))
	defer secure.Close()

	entry := func(i int, src, hash string, gz bool) string {
		comp := ""
		if gz {
			comp = `"compression":"gzip",`
		}
		return fmt.Sprintf(`{"path":"/opt/f%d","contents":{"source":%q,%s"verification":{"hash":%q}}}`, i, src, comp, hash)
	}
	tests := []struct {
		name    string
		entries []string
		wantErr []string
	}{
		{name: "https redirected to http", entries: []string{entry(0, secure.URL+"/down", sha([]byte("tampered")), false)},
			wantErr: []string{"storage.files[0].contents.source", "refused redirect", "must stay on https"}},
		{name: "three 60 MiB downloads", entries: []string{
			entry(0, secure.URL+"/zeros.gz", sha(zeros), true),
			entry(1, secure.URL+"/zeros.gz", sha(zeros), true),
			entry(2, secure.URL+"/zeros.gz", sha(zeros), true),
		}, wantErr: []string{"storage.files[2].contents", "128 MiB cap"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			plainHits.Store(0)
			root := t.TempDir()
			cfg := parse(t, `{"ignition":{"version":"3.5.0"},"storage":{"files":[`+strings.Join(tc.entries, ",")+`]}}`)
			_, err := Files(context.Background(), root, files(t, cfg), HTTPGetter(secure.Client()))
			if err == nil {
				t.Fatal("Files succeeded")
			}
			for _, want := range tc.wantErr {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not contain %q", err, want)
				}
			}
			if n := plainHits.Load(); n != 0 {
				t.Errorf("%d requests reached the http server", n)
			}
			if written, _ := filepath.Glob(filepath.Join(root, "opt", "*")); len(written) > 0 {
				t.Errorf("files written despite the error: %v", written)
			}
			if _, err := os.Stat(filepath.Join(root, "opt")); err == nil {
				t.Error("/opt created despite the error")
			}
		})
	}
}
