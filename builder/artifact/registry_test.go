package artifact

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
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

	"golang.org/x/crypto/bcrypt"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/kilnproject/kiln/internal/testkit"
)

// authRegistry is the CNCF distribution registry (Debian's docker-registry) on 127.0.0.1,
// serving plain HTTP with htpasswd (bcrypt) authentication for user/password.
type authRegistry struct {
	host, user, password string
}

func startAuthRegistry(t *testing.T) *authRegistry {
	t.Helper()
	r := &authRegistry{user: "kiln", password: "s3cret-pull"}
	hash, err := bcrypt.GenerateFromPassword([]byte(r.password), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	r.host = testkit.RegistryWith(t, testkit.RegistryOptions{HTPasswd: r.user + ":" + string(hash) + "\n"})
	return r
}

func writeTestFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// isolateDockerConfig points every place the default keychain reads credentials from into
// the test's temporary directory and returns the DOCKER_CONFIG directory (empty).
func isolateDockerConfig(t *testing.T) string {
	t.Helper()
	tmp := t.TempDir()
	t.Setenv("HOME", filepath.Join(tmp, "home"))
	t.Setenv("XDG_CONFIG_HOME", filepath.Join(tmp, "xdg-config"))
	t.Setenv("XDG_RUNTIME_DIR", filepath.Join(tmp, "xdg-run"))
	t.Setenv("REGISTRY_AUTH_FILE", filepath.Join(tmp, "no-auth.json"))
	dc := filepath.Join(tmp, "docker")
	if err := os.Mkdir(dc, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Setenv("DOCKER_CONFIG", dc)
	return dc
}

// TestPrivateRegistryCredentials pulls an image from a registry that requires a password:
// without credentials the error says where they are looked up; with the docker config's
// "auths" or a credential helper named in "credHelpers" the pull succeeds.
func TestPrivateRegistryCredentials(t *testing.T) {
	reg := startAuthRegistry(t)
	img := amd64(t, mustRandom(t), "amd64")
	ref, err := name.ParseReference(reg.host + "/kiln/private:1")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img, remote.WithAuth(&authn.Basic{Username: reg.user, Password: reg.password})); err != nil {
		t.Fatalf("push with explicit credentials: %v", err)
	}
	digest := digestOf(t, img)

	basic := base64.StdEncoding.EncodeToString([]byte(reg.user + ":" + reg.password))
	wrong := base64.StdEncoding.EncodeToString([]byte(reg.user + ":wrong"))
	tests := []struct {
		name    string
		config  string // config.json in DOCKER_CONFIG; "" writes none
		wantErr []string
		auth    bool // the error is an *AuthError
		helper  bool // the kilntest credential helper must have been asked
	}{
		{name: "no credentials", wantErr: []string{"registry " + reg.host + " refused access (401 Unauthorized)", "$DOCKER_CONFIG/config.json", "docker-credential-<name>"}, auth: true},
		{name: "auths", config: fmt.Sprintf(`{"auths": {%q: {"auth": %q}}}`, reg.host, basic)},
		{name: "wrong password", config: fmt.Sprintf(`{"auths": {%q: {"auth": %q}}}`, reg.host, wrong), wantErr: []string{"refused access (401 Unauthorized)", "credHelpers"}, auth: true},
		{name: "credHelpers", config: fmt.Sprintf(`{"credHelpers": {%q: "kilntest"}}`, reg.host), helper: true},
		{name: "credsStore", config: `{"credsStore": "kilntest"}`, helper: true},
		{name: "helper missing", config: fmt.Sprintf(`{"credHelpers": {%q: "kilnabsent"}}`, reg.host), wantErr: []string{"registry " + reg.host + ": looking up credentials", "docker-credential-kilnabsent", "$DOCKER_CONFIG/config.json"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dc := isolateDockerConfig(t)
			if tt.config != "" {
				writeTestFile(t, filepath.Join(dc, "config.json"), tt.config)
			}
			asked := installCredentialHelper(t, reg)

			c := NewCache(t.TempDir())
			src := ImageSource{Name: "private", Source: reg.host + "/kiln/private:1", Digest: digest}
			_, fetchErr := c.FetchImage(t.Context(), src, ImageFetch{Remote: RemoteOptions(authn.DefaultKeychain)})
			resolved, resolveErr := OCIResolver{Remote: RemoteOptions(authn.DefaultKeychain)}.ResolveImage(t.Context(), src.Source)

			for what, err := range map[string]error{"fetch": fetchErr, "resolve": resolveErr} {
				if len(tt.wantErr) == 0 {
					if err != nil {
						t.Fatalf("%s: %v", what, err)
					}
					continue
				}
				if err == nil {
					t.Fatalf("%s: no error, want one saying %q", what, tt.wantErr)
				}
				for _, w := range tt.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("%s: error %q\ndoes not say %q", what, err, w)
					}
				}
				var ae *AuthError
				if errors.As(err, &ae) != tt.auth {
					t.Errorf("%s: error is an *AuthError: %v, want %v", what, !tt.auth, tt.auth)
				}
			}
			if len(tt.wantErr) == 0 && resolved != digest {
				t.Errorf("resolved %s, want %s", resolved, digest)
			}
			if got := asked(); tt.helper != strings.Contains(got, reg.host) {
				t.Errorf("credential helper asked for %q; want it asked: %v", got, tt.helper)
			}
		})
	}
}

// installCredentialHelper puts docker-credential-kilntest on PATH: it answers `get` for the
// registry with its credentials and records the server it was asked about. The function it
// returns reads that record.
func installCredentialHelper(t *testing.T, reg *authRegistry) func() string {
	t.Helper()
	bin := t.TempDir()
	asked := filepath.Join(bin, "asked")
	script := fmt.Sprintf(`#!/bin/sh
[ "$1" = get ] || exit 1
read -r server
printf '%%s\n' "$server" >> %q
case "$server" in
*%s*) printf '{"ServerURL":"%%s","Username":%q,"Secret":%q}\n' "$server" ;;
*) echo "credentials not found in native keychain"; exit 1 ;;
esac
`, asked, reg.host, reg.user, reg.password)
	if err := os.WriteFile(filepath.Join(bin, "docker-credential-kilntest"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	return func() string {
		b, _ := os.ReadFile(asked)
		return string(b)
	}
}

func mustRandom(t *testing.T) v1.Image {
	t.Helper()
	img, err := random.Image(2048, 2)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// TestRegistryRetries pulls an image through a registry that answers its manifest and a layer
// with 429 and 503 before serving them: RemoteOptions retries both.
func TestRegistryRetries(t *testing.T) {
	h := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	var mu sync.Mutex
	failures := map[string][]int{} // path → statuses still to answer with
	var answered []int
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		codes := failures[r.URL.Path]
		if len(codes) > 0 && r.Method == http.MethodGet {
			failures[r.URL.Path] = codes[1:]
			answered = append(answered, codes[0])
			mu.Unlock()
			http.Error(w, http.StatusText(codes[0]), codes[0])
			return
		}
		mu.Unlock()
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")
	img := amd64(t, mustRandom(t), "amd64")
	ref, err := name.ParseReference(host + "/kiln/flaky:1")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		t.Fatal(err)
	}
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	digest := digestOf(t, img)
	mu.Lock()
	failures["/v2/kiln/flaky/manifests/"+digest] = []int{http.StatusTooManyRequests, http.StatusServiceUnavailable}
	failures["/v2/kiln/flaky/blobs/"+digestOf(t, layers[0])] = []int{http.StatusBadGateway, http.StatusTooManyRequests}
	mu.Unlock()

	isolateDockerConfig(t)
	fast := remote.WithRetryBackoff(remote.Backoff{Duration: time.Millisecond, Factor: 1, Steps: 5})
	c := NewCache(t.TempDir())
	src := ImageSource{Name: "flaky", Source: host + "/kiln/flaky:1", Digest: digest}
	if _, err := c.FetchImage(t.Context(), src, ImageFetch{Remote: append(RemoteOptions(nil), fast)}); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(answered) != 4 {
		t.Errorf("answered %v before serving, want the 4 failures retried", answered)
	}
}

// TestRegistryBlobCutShort: a layer whose body is cut short is fetched again (the registry
// client retries requests, not bodies); a layer that arrives whole but corrupt is not.
func TestRegistryBlobCutShort(t *testing.T) {
	for _, tt := range []struct {
		name     string
		corrupt  bool
		wantGets int
	}{
		{name: "cut short, fetched again", wantGets: 2},
		{name: "corrupt, not retried", corrupt: true, wantGets: 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
			var mu sync.Mutex
			var blobPath string
			gets := 0
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				hit := r.Method == http.MethodGet && r.URL.Path == blobPath
				if hit {
					gets++
				}
				first := gets == 1
				mu.Unlock()
				if !hit || (!first && !tt.corrupt) {
					h.ServeHTTP(w, r)
					return
				}
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, r)
				body := rec.Body.Bytes()
				w.Header().Set("Content-Length", strconv.Itoa(len(body)))
				if tt.corrupt {
					body[len(body)/2] ^= 0xff
					w.Write(body)
					return
				}
				w.Write(body[:len(body)/2])
				w.(http.Flusher).Flush()
				panic(http.ErrAbortHandler)
			}))
			t.Cleanup(srv.Close)
			host := strings.TrimPrefix(srv.URL, "http://")
			img := amd64(t, mustRandom(t), "amd64")
			ref, err := name.ParseReference(host + "/kiln/cut:1")
			if err != nil {
				t.Fatal(err)
			}
			if err := remote.Write(ref, img); err != nil {
				t.Fatal(err)
			}
			layers, _ := img.Layers()
			mu.Lock()
			blobPath = "/v2/kiln/cut/blobs/" + digestOf(t, layers[0])
			mu.Unlock()

			isolateDockerConfig(t)
			var logs bytes.Buffer
			c := NewCache(t.TempDir())
			c.Log = slog.New(slog.NewTextHandler(&logs, nil))
			c.Retry = DownloadRetry{Clock: &testkit.InstantClock{}}
			_, err = c.FetchImage(t.Context(), ImageSource{Name: "cut", Source: host + "/kiln/cut:1", Digest: digestOf(t, img)}, ImageFetch{})
			if tt.corrupt != (err != nil) {
				t.Fatalf("fetch: %v (want an error: %v)", err, tt.corrupt)
			}
			mu.Lock()
			if gets != tt.wantGets {
				t.Errorf("%d GETs of the layer, want %d", gets, tt.wantGets)
			}
			mu.Unlock()
			if !tt.corrupt && !strings.Contains(logs.String(), "unexpected EOF") {
				t.Errorf("the retry is not logged with its cause:\n%s", logs.String())
			}
		})
	}
}
