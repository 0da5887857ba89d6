package rootfs

import (
	"bytes"
	"io"
	"io/fs"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/kilnproject/kiln/builder/artifact"
	"github.com/kilnproject/kiln/internal/testkit"
)

// blobFault is how a registry answers a GET of the faulty blob.
type blobFault int

const (
	cutOnce     blobFault = iota // the first body stops halfway, the connection dropped
	stallOnce                    // the first body stops halfway, the connection kept open
	cutAlways                    // every body stops halfway
	corruptBlob                  // every body is whole but has a byte flipped
)

// faultyRegistry is an in-memory registry whose answers to GETs of one blob (set with
// fault) are spoiled as its fault says; it counts those GETs.
type faultyRegistry struct {
	host string

	mu    sync.Mutex
	path  string
	fault blobFault
	gets  int
}

func newFaultyRegistry(t *testing.T) *faultyRegistry {
	h := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	f := &faultyRegistry{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		hit := r.Method == http.MethodGet && r.URL.Path == f.path
		if hit {
			f.gets++
		}
		first, fault := f.gets == 1, f.fault
		f.mu.Unlock()
		if !hit || (!first && (fault == cutOnce || fault == stallOnce)) {
			h.ServeHTTP(w, r)
			return
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		body := rec.Body.Bytes()
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		if fault == corruptBlob {
			body[len(body)/2] ^= 0xff
			w.Write(body)
			return
		}
		w.Write(body[:len(body)/2])
		w.(http.Flusher).Flush()
		if fault == stallOnce {
			// Until the client gives up on the request; a client that never does is cut
			// off, failing the test rather than hanging it.
			select {
			case <-r.Context().Done():
			case <-time.After(5 * time.Second):
			}
		}
		panic(http.ErrAbortHandler)
	}))
	t.Cleanup(srv.Close)
	f.host = strings.TrimPrefix(srv.URL, "http://")
	return f
}

// TestFlattenRegistryBaseRetries: a base layer whose body is cut short or stalls is fetched
// again under the cache's download retry; one that arrives whole but corrupt is refused at
// once, naming the layer; a failure leaves nothing in the cache.
func TestFlattenRegistryBaseRetries(t *testing.T) {
	tests := []struct {
		name     string
		fault    blobFault
		attempts int
		wantGets int
		wantErr  []string // "" for the layer digest
	}{
		{name: "cut short once", fault: cutOnce, wantGets: 2},
		{name: "stalled once", fault: stallOnce, wantGets: 2},
		{name: "cut short every time", fault: cutAlways, attempts: 3, wantGets: 3,
			wantErr: []string{"", "unexpected EOF", "gave up after 3 attempts"}},
		{name: "corrupt", fault: corruptBlob, wantGets: 1, wantErr: []string{"", "checksum"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("DOCKER_CONFIG", t.TempDir())
			reg := newFaultyRegistry(t)
			body := strings.Repeat("ID=kiln-retry\n", 4096)
			layer := testkit.Layer(t, testkit.Entry{Name: "etc/", Dir: true, Mode: 0o755}, testkit.Entry{Name: "etc/os-release", Body: body})
			img, err := mutate.AppendLayers(mutate.MediaType(empty.Image, types.OCIManifestSchema1), layer)
			if err != nil {
				t.Fatal(err)
			}
			ref, err := name.ParseReference(reg.host + "/base:1")
			if err != nil {
				t.Fatal(err)
			}
			if err := remote.Write(ref, img); err != nil {
				t.Fatal(err)
			}
			ld, _ := layer.Digest()
			reg.mu.Lock()
			reg.path, reg.fault = "/v2/base/blobs/"+ld.String(), tt.fault
			reg.mu.Unlock()

			d, _ := img.Digest()
			base, err := OpenBase(t.Context(), Source{Image: reg.host + "/base", Digest: d.String()})
			if err != nil {
				t.Fatal(err)
			}
			clock := &testkit.InstantClock{}
			var logs bytes.Buffer
			cache := artifact.NewCache(t.TempDir())
			cache.Log = slog.New(slog.NewTextHandler(&logs, nil))
			cache.Retry = artifact.DownloadRetry{Attempts: tt.attempts, Clock: clock}
			cache.StallTimeout = 200 * time.Millisecond
			dir := filepath.Join(t.TempDir(), "tree")
			_, err = FlattenWith(base, dir, FlattenOptions{Cache: cache})

			reg.mu.Lock()
			gets := reg.gets
			reg.mu.Unlock()
			if gets != tt.wantGets {
				t.Errorf("%d GETs of the layer, want %d", gets, tt.wantGets)
			}
			if len(clock.Pauses()) != gets-1 {
				t.Errorf("retry pauses %v, want %d of them, on the cache's clock", clock.Pauses(), gets-1)
			}
			if tt.wantErr == nil {
				if err != nil {
					t.Fatalf("FlattenWith: %v", err)
				}
				if b, err := os.ReadFile(filepath.Join(dir, "etc/os-release")); err != nil || string(b) != body {
					t.Errorf("etc/os-release: %d bytes, %v; want the layer's %d", len(b), err, len(body))
				}
				if !strings.Contains(logs.String(), "download failed, retrying") {
					t.Errorf("the retry is not logged:\n%s", logs.String())
				}
				return
			}
			if err == nil {
				t.Fatal("FlattenWith succeeded")
			}
			t.Logf("FlattenWith: %v", err)
			for _, want := range tt.wantErr {
				if want == "" {
					want = ld.String()
				}
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not say %q", err, want)
				}
			}
			if left := files(t, cache.Root); len(left) > 0 {
				t.Errorf("the failed layer left %v in the cache", left)
			}
		})
	}
}

// files lists the regular files below root.
func files(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			out = append(out, p)
		}
		return err
	})
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return out
}
