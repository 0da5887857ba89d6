package rootfs

import (
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/kilnproject/kiln/builder/artifact"
)

// TestOpenBaseCredentials opens a base image from a registry on 127.0.0.1 that answers 401
// to requests without the right Basic credentials, as a private registry does.
func TestOpenBaseCredentials(t *testing.T) {
	const user, password = "kiln", "base-secret"
	h := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, p, ok := r.BasicAuth(); !ok || u != user || p != password {
			w.Header().Set("WWW-Authenticate", `Basic realm="kiln-test"`)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			fmt.Fprint(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`)
			return
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")

	img, err := random.Image(1024, 1)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := name.ParseReference(host + "/base:1")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img, remote.WithAuth(&authn.Basic{Username: user, Password: password})); err != nil {
		t.Fatal(err)
	}
	d, _ := img.Digest()
	src := Source{Image: host + "/base", Digest: d.String()}
	basic := base64.StdEncoding.EncodeToString([]byte(user + ":" + password))

	tests := []struct {
		name    string
		config  string // DOCKER_CONFIG/config.json; "" writes none
		wantErr string
	}{
		{name: "anonymous is refused", wantErr: "registry " + host + " refused access (401 Unauthorized)"},
		{name: "docker config auths", config: fmt.Sprintf(`{"auths": {%q: {"auth": %q}}}`, host, basic)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tmp := t.TempDir()
			t.Setenv("HOME", tmp)
			t.Setenv("XDG_CONFIG_HOME", tmp)
			t.Setenv("XDG_RUNTIME_DIR", tmp)
			t.Setenv("REGISTRY_AUTH_FILE", filepath.Join(tmp, "none"))
			t.Setenv("DOCKER_CONFIG", tmp)
			if tt.config != "" {
				if err := os.WriteFile(filepath.Join(tmp, "config.json"), []byte(tt.config), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			// As the bake does: options built once, passed down.
			_, err := OpenBase(t.Context(), src, artifact.RemoteOptions(authn.DefaultKeychain)...)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			var ae *artifact.AuthError
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !strings.Contains(err.Error(), "DOCKER_CONFIG") || !errors.As(err, &ae) {
				t.Fatalf("OpenBase: %v, want an *AuthError saying %q and where credentials are looked up", err, tt.wantErr)
			}
		})
	}
}
