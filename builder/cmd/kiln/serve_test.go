package main

import (
	"bufio"
	"bytes"
	"context"
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

// serveDir writes a served directory with one live group.
func serveDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if _, err := netboottest.WriteImage(dir, "metal-worker", netboottest.Small); err != nil {
		t.Fatal(err)
	}
	yaml := "groups:\n  - name: workers\n    image: metal-worker\n    mode: live\n    selector: {mac: 52:54:00:00:00:01}\n"
	if err := os.WriteFile(filepath.Join(dir, "machines.yaml"), []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// kiln serve runs as a process: it says where it listens, answers, and exits 0 on SIGTERM.
func TestServeProcess(t *testing.T) {
	dir := serveDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "serve", dir, "--listen", "127.0.0.1:0")
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
	rest := make(chan string, 1)
	go func() { b, _ := io.ReadAll(stderr); rest <- string(b) }()
	for path, want := range map[string]string{
		"/healthz":                         "ok\n",
		"/boot.ipxe?mac=52-54-00-00-00-01": "kiln.live.rootfs_url=http://" + addr + "/images/metal-worker-pxe/rootfs.img",
	} {
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
	dir := serveDir(t)
	os.WriteFile(filepath.Join(dir, "metal-worker-pxe", "vmlinuz"), []byte("not the baked kernel"), 0o644)
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
	} {
		var stderr bytes.Buffer
		root := newRoot()
		root.SetOut(&bytes.Buffer{})
		got := execute(context.Background(), root, tc.args, &stderr)
		if got != tc.code || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("kiln %s: exit %d (want %d), stderr %q (want %q)", strings.Join(tc.args, " "), got, tc.code, stderr.String(), tc.want)
		}
	}
}
