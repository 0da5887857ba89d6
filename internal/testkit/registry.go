package testkit

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/kilnproject/kiln/internal/poll"
)

// Registry starts the CNCF distribution registry (Debian's docker-registry) on a free
// 127.0.0.1 port, serving plain HTTP without authentication from a store in the test's
// temporary directory, and returns its host:port. It is stopped when the test ends; a failed
// test logs what it printed.
func Registry(t testing.TB) string {
	t.Helper()
	return RegistryWith(t, RegistryOptions{})
}

// RegistryOptions say how RegistryWith's registry runs.
type RegistryOptions struct {
	// Store is the directory it keeps blobs and manifests in (default: a temporary one); a
	// second registry on the same Store serves what the first stored.
	Store string
	// ReadOnly refuses every push (the registry's maintenance mode).
	ReadOnly bool
	// HTPasswd, when set, is an htpasswd file's content (bcrypt): the registry then asks
	// for those credentials (realm kiln-test).
	HTPasswd string
}

// RegistryWith is Registry with o.
func RegistryWith(t testing.TB, o RegistryOptions) string {
	t.Helper()
	bin := Tool(t, "docker-registry", "docker-registry")
	dir := t.TempDir()
	if o.Store == "" {
		o.Store = filepath.Join(dir, "store")
	}
	host := fmt.Sprintf("127.0.0.1:%d", FreePort(t))
	config := fmt.Sprintf(`version: 0.1
log: {level: warn, accesslog: {disabled: true}}
storage: {filesystem: {rootdirectory: %s}, delete: {enabled: true}, maintenance: {readonly: {enabled: %t}}}
http: {addr: %q, secret: kiln-test}
`, o.Store, o.ReadOnly, host)
	answer := http.StatusOK
	if o.HTPasswd != "" {
		if err := os.WriteFile(filepath.Join(dir, "htpasswd"), []byte(o.HTPasswd), 0o600); err != nil {
			t.Fatal(err)
		}
		config += fmt.Sprintf("auth: {htpasswd: {realm: kiln-test, path: %s}}\n", filepath.Join(dir, "htpasswd"))
		answer = http.StatusUnauthorized
	}
	if err := os.WriteFile(filepath.Join(dir, "config.yml"), []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	cmd := exec.Command(bin, "serve", filepath.Join(dir, "config.yml"))
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("docker-registry log:\n%s", out.String())
		}
	})
	err := poll.Until(context.Background(), poll.Options{What: "docker-registry to answer", Timeout: 20 * time.Second, Backoff: poll.Constant(50 * time.Millisecond)},
		func(ctx context.Context) (bool, error) {
			resp, err := http.Get("http://" + host + "/v2/")
			if err != nil {
				return false, err
			}
			resp.Body.Close()
			return resp.StatusCode == answer, fmt.Errorf("/v2/: %s", resp.Status)
		})
	if err != nil {
		t.Fatalf("%v\nlog:\n%s", err, out.String())
	}
	return host
}
