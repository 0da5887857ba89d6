package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kilnproject/kiln/builder/netboot/netboottest"
	"github.com/kilnproject/kiln/internal/exitcode"
)

// TestMain lets a test run this test binary as kiln itself (KILN_TEST_AS_KILN=1), so that
// kiln serve is tested as a process receiving signals.
func TestMain(m *testing.M) {
	if os.Getenv("KILN_TEST_AS_KILN") == "1" {
		main()
		return
	}
	os.Exit(m.Run())
}

// tokenConfig is a node config holding a Kubernetes bootstrap token.
const tokenConfig = `variant: fcos
version: 1.6.0
storage:
  files:
    - path: /etc/kubernetes/join-token
      contents: {inline: abcdef.0123456789abcdef}
`

// serveDir writes a served directory with one live group; config (Butane) is its config
// when not "".
func serveDir(t *testing.T, config string) string {
	t.Helper()
	dir := t.TempDir()
	if _, err := netboottest.WriteImage(dir, "metal-worker", netboottest.Small); err != nil {
		t.Fatal(err)
	}
	yaml := "groups:\n  - name: workers\n    image: metal-worker\n    mode: live\n    selector: {mac: 52:54:00:00:00:01}\n"
	if config != "" {
		yaml += "    config: node.bu\n"
		if err := os.WriteFile(filepath.Join(dir, "node.bu"), []byte(config), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "machines.yaml"), []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// kiln serve runs as a process: it says where it listens, answers, and exits 0 on SIGTERM.
// With --allow-secrets it serves a config holding a token, and has said so once at startup.
func TestServeProcess(t *testing.T) {
	for _, tc := range []struct {
		name, config string
		args         []string
		logs         []string // before it says where it listens
		paths        map[string]string
	}{
		{"live worker", "", nil, nil, map[string]string{
			"/healthz":                         "ok\n",
			"/boot.ipxe?mac=52-54-00-00-00-01": "kiln.live.rootfs_url=http://{addr}/images/metal-worker-pxe/rootfs.img",
		}},
		{"secrets allowed", tokenConfig, []string{"--allow-secrets"},
			[]string{`level=WARN msg="serving secrets to anyone on the boot network (--allow-secrets)" config=`,
				`node.bu machines="machine workers (/config/workers)" secrets="/etc/kubernetes/join-token:1: Kubernetes bootstrap token"`},
			map[string]string{
				"/config/workers":                  "abcdef.0123456789abcdef",
				"/boot.ipxe?mac=52-54-00-00-00-01": "kiln.config.url=http://{addr}/config/workers",
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			serveProcess(t, append([]string{"serve", serveDir(t, tc.config), "--listen", "127.0.0.1:0"}, tc.args...), tc.logs, tc.paths)
		})
	}
}

// serveProcess runs kiln args, checks the log up to where it says it listens for logs, GETs
// each path and looks for its want ({addr}: where it listens), then stops it with SIGTERM.
func serveProcess(t *testing.T, args, logs []string, paths map[string]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], args...)
	cmd.Env = append(os.Environ(), "KILN_TEST_AS_KILN=1")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(stderr)
	addrRE := regexp.MustCompile(`msg=serving http=(127\.0\.0\.1:\d+)`)
	var addr string
	var logged bytes.Buffer
	for addr == "" && lines.Scan() {
		logged.WriteString(lines.Text() + "\n")
		if m := addrRE.FindStringSubmatch(lines.Text()); m != nil {
			addr = m[1]
		}
	}
	if addr == "" {
		t.Fatalf("kiln serve did not say where it listens:\n%s", logged.String())
	}
	for _, want := range logs {
		if !strings.Contains(logged.String(), want) {
			t.Errorf("the log lacks %q:\n%s", want, logged.String())
		}
	}
	rest := make(chan string, 1)
	go func() { b, _ := io.ReadAll(stderr); rest <- string(b) }()
	for path, want := range paths {
		want = strings.ReplaceAll(want, "{addr}", addr)
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(body), want) {
			t.Errorf("GET %s: %d %q, want %q", path, resp.StatusCode, body, want)
		}
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("kiln serve after SIGTERM: %v, want exit 0\n%s", err, <-rest)
	}
}

// Startup errors exit 1 naming what is wrong; a wrong command line exits 2.
func TestServeExitCodes(t *testing.T) {
	dir := serveDir(t, "")
	os.WriteFile(filepath.Join(dir, "metal-worker-pxe", "vmlinuz"), []byte("not the baked kernel"), 0o644)
	secrets := serveDir(t, tokenConfig)
	unsigned := serveDir(t, "")
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	pub := writePublicKey(t, key)
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"serve"}, exitcode.BadUsage, "accepts 1 arg"},
		{[]string{"serve", dir, "--tftp", ":0"}, exitcode.BadUsage, "--tftp and --tftp-dir go together"},
		{[]string{"serve", dir, "--listen", "127.0.0.1:0"}, exitcode.Failure, "metal-worker-pxe/vmlinuz: sha256"},
		{[]string{"serve", filepath.Join(dir, "nosuch")}, exitcode.Failure, "machines.yaml: no such file"},
		{[]string{"serve", dir, "--advertise-url", "10.0.0.2:8080"}, exitcode.BadUsage, "--advertise-url"},
		{[]string{"serve", dir, "--max-conns", "0"}, exitcode.BadUsage, "--max-conns 0: must be at least 1"},
		{[]string{"serve", dir, "--stall-timeout", "0s"}, exitcode.BadUsage, "--stall-timeout 0s: must be positive"},
		{[]string{"serve", secrets, "--listen", "127.0.0.1:0"}, exitcode.Failure,
			"machines.yaml:6: groups[0].config: " + filepath.Join(secrets, "node.bu") + " holds secrets, and kiln serve would hand it to machine workers (/config/workers):\n" +
				"    /etc/kubernetes/join-token:1: Kubernetes bootstrap token\n"},
		{[]string{"serve", secrets, "--listen", "127.0.0.1:0"}, exitcode.Failure, "or pass --allow-secrets"},
		{[]string{"serve", dir, "--key", filepath.Join(dir, "nosuch.pub")}, exitcode.BadUsage, "--key: "},
		{[]string{"serve", unsigned, "--key", pub, "--listen", "127.0.0.1:0"}, exitcode.Failure,
			"image metal-worker: refusing to serve an image whose provenance does not verify: "},
	} {
		var stderr bytes.Buffer
		root := newRoot()
		root.SetOut(&bytes.Buffer{})
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // a serve that starts stops then, exit 0
		got := execute(ctx, root, tc.args, &stderr)
		cancel()
		if got != tc.code || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("kiln %s: exit %d (want %d), stderr %q (want %q)", strings.Join(tc.args, " "), got, tc.code, stderr.String(), tc.want)
		}
	}
}
