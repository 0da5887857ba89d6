package netboot

import (
	"bytes"
	"flag"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kilnproject/kiln/builder/netboot/netboottest"
)

var update = flag.Bool("update", false, "rewrite testdata/golden from the server's answers")

// machinesYAML is the fixture's machines.yaml: live workers (a group-wide selector and one
// machine of its own), installed control planes with per-machine hostnames and etcd members.
const machinesYAML = `groups:
  - name: workers
    image: metal-worker
    mode: live
    config: worker.ign
    selector:
      mac: [52-54-00-00-00-01, 52:54:00:00:00:02]
    machines:
      - name: worker-3
        hostname: worker-3
        selector: {uuid: 8A4E3C2B-0000-4000-8000-000000000003}
        kernelArgs: kiln.net.timeout=120s
  - name: control-planes
    image: metal-control-plane
    mode: install
    install: {dev: auto, wipe: true}
    config: cp.bu
    kernelArgs: console=ttyS0,115200
    machines:
      - hostname: cp-1
        etcdMember: a
        selector: {mac: 52:54:00:00:01:01}
      - hostname: cp-2
        etcdMember: b
        selector: {hostname: cp-2}
`

// workerIgn writes a unit and no node.yaml: a machine's hostname goes to /etc/hostname.
const workerIgn = `{"ignition": {"version": "3.4.0"}, "systemd": {"units": [{"name": "hello.service", "enabled": true,
  "contents": "[Unit]\nDescription=hello\n[Service]\nExecStart=/bin/true\n[Install]\nWantedBy=multi-user.target\n"}]}}
`

// cpButane writes a control plane's node.yaml; each machine gets its hostname and member.
const cpButane = `variant: fcos
version: 1.6.0
storage:
  files:
    - path: /etc/kiln/node.yaml
      mode: 0644
      contents:
        inline: |
          # the rack's control planes
          cluster: {name: rack1, dnsZone: k8s.example.com}
          role: control-plane
          etcd:
            member: a
            members: [a, b, c]
`

// fixture writes a served directory: two images, their configs and machines.yaml.
func fixture(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, name := range []string{"metal-worker", "metal-control-plane"} {
		if _, err := netboottest.WriteImage(dir, name, netboottest.Small); err != nil {
			t.Fatal(err)
		}
	}
	writeFile(t, filepath.Join(dir, "machines.yaml"), machinesYAML)
	writeFile(t, filepath.Join(dir, "worker.ign"), workerIgn)
	writeFile(t, filepath.Join(dir, "cp.bu"), cpButane)
	return dir
}

func writeFile(t *testing.T, p, data string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

// syncBuffer is a log destination tests read while the server writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startServer loads dir and serves it over a real HTTP server; the log is returned.
func startServer(t *testing.T, o Options) (*httptest.Server, *syncBuffer) {
	t.Helper()
	logs := &syncBuffer{}
	o.Log = slog.New(slog.NewTextHandler(logs, nil))
	s, err := Load(o)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(ts.Close)
	return ts, logs
}

// golden compares got with testdata/golden/name, rewriting it with -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	p := filepath.Join("testdata", "golden", name)
	if *update {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(p)
	if err != nil {
		t.Fatalf("%v (run go test -update to write it)", err)
	}
	if got != string(want) {
		t.Errorf("%s differs from %s (go test -update rewrites it):\n--- got\n%s\n--- want\n%s", name, p, got, want)
	}
}

// logged waits (up to 5s) until the log holds every one of subs: the access-log line is
// written after the response went out.
func logged(t *testing.T, logs *syncBuffer, subs ...string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		all := true
		for _, sub := range subs {
			all = all && strings.Contains(logs.String(), sub)
		}
		if all {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	contains(t, "log", logs.String(), subs...)
}

func contains(t *testing.T, what, s string, subs ...string) {
	t.Helper()
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			t.Errorf("%s lacks %q:\n%s", what, sub, s)
		}
	}
}
