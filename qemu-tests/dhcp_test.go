package qemutests

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kilnproject/kiln/builder/vm"
	"github.com/kilnproject/kiln/initd/config"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

// qmp is a client of QEMU's machine protocol on a unix socket (QEMU's -qmp).
type qmp struct {
	conn net.Conn
	r    *bufio.Reader
}

// dialQMP connects to the QMP socket QEMU creates at path once it runs, and enters
// command mode.
func dialQMP(ctx context.Context, path string) (*qmp, error) {
	var conn net.Conn
	for {
		var err error
		if conn, err = net.Dial("unix", path); err == nil {
			break
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("QMP socket %s: %w (last: %v)", path, ctx.Err(), err)
		case <-time.After(100 * time.Millisecond):
		}
	}
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	q := &qmp{conn: conn, r: bufio.NewReader(conn)}
	if _, err := q.r.ReadBytes('\n'); err != nil { // the greeting
		conn.Close()
		return nil, fmt.Errorf("QMP greeting: %w", err)
	}
	if err := q.do("qmp_capabilities", nil); err != nil {
		conn.Close()
		return nil, err
	}
	return q, nil
}

// do runs one command and waits for its answer, skipping the events in between.
func (q *qmp) do(cmd string, args map[string]any) error {
	req := map[string]any{"execute": cmd}
	if args != nil {
		req["arguments"] = args
	}
	b, _ := json.Marshal(req)
	if _, err := q.conn.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("QMP %s: %w", cmd, err)
	}
	for {
		line, err := q.r.ReadBytes('\n')
		if err != nil {
			return fmt.Errorf("QMP %s: %w", cmd, err)
		}
		var resp struct {
			Return json.RawMessage `json:"return"`
			Error  *struct {
				Desc string `json:"desc"`
			} `json:"error"`
		}
		if err := json.Unmarshal(line, &resp); err != nil {
			return fmt.Errorf("QMP %s: %q: %w", cmd, line, err)
		}
		switch {
		case resp.Error != nil:
			return fmt.Errorf("QMP %s: %s", cmd, resp.Error.Desc)
		case resp.Return != nil:
			return nil
		}
	}
}

// statusProbe is a unit the test's config enables: first boot starts it while it runs, and
// it prints `kiln-init status`'s WAITING row on the console as soon as there is one.
const statusProbe = `variant: fcos
version: 1.6.0
systemd:
  units:
    - name: kiln-status-probe.service
      enabled: true
      contents: |
        [Service]
        Type=oneshot
        ExecStart=/bin/sh -c 'for i in $(seq 600); do s=$(kiln-init status 2>/dev/null | grep "^WAITING"); if [ -n "$s" ]; then echo "kiln-dhcp-test: $s"; exit 0; fi; sleep 0.5; done; echo "kiln-dhcp-test: no wait shown"'
        StandardOutput=journal+console
        [Install]
        WantedBy=multi-user.target
`

// A worker whose DHCP lease comes late — its only network's cable is plugged in while first
// boot runs — waits for the address instead of failing its templates, says so in `kiln-init
// status` while it waits, and ends first boot ok with kubelet's --node-ip set to the lease.
func TestWorkerWaitsForLateDHCP(t *testing.T) {
	e := newEnv(t)
	baked := e.bake("qemu", "worker")
	disk := filepath.Join(e.dir, "node.raw")
	copySparse(t, baked, disk)
	ign, err := config.TranslateButane([]byte(statusProbe))
	if err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(e.dir, "node.ign")
	if err := os.WriteFile(cfgPath, ign, 0o600); err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(filepath.Join(e.dir, "serial.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { logf.Close() })

	// QEMU starts paused (-S), so the NIC's cable is out before the guest runs.
	sock := filepath.Join(e.dir, "qmp.sock")
	start := time.Now()
	m, err := vm.Start(context.Background(), vm.Config{Image: disk, Config: cfgPath, Accel: "tcg", MemoryMB: 1024,
		Serial: logf, WorkDir: t.TempDir(), Extra: []string{"-S", "-qmp", "unix:" + sock + ",server=on,wait=off"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Stop)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	qctx, qcancel := context.WithTimeout(ctx, time.Minute)
	q, err := dialQMP(qctx, sock)
	qcancel()
	if err != nil {
		t.Fatal(err)
	}
	defer q.conn.Close()
	q.conn.SetDeadline(time.Time{})
	if err := q.do("set_link", map[string]any{"name": vm.UserNetdev, "up": false}); err != nil {
		t.Fatal(err)
	}
	if err := q.do("cont", nil); err != nil {
		t.Fatal(err)
	}
	wait := func(re *regexp.Regexp) string {
		t.Helper()
		line, err := m.WaitFor(ctx, re)
		if err != nil {
			t.Fatalf("%v\nlast console lines:\n%s", err, tail(m.Lines(), 40))
		}
		t.Logf("console %q after %s", strings.TrimSpace(line), time.Since(start).Round(time.Second))
		return line
	}

	line := wait(regexp.MustCompile(`kiln-dhcp-test: |` + firstbootDone.String()))
	if !regexp.MustCompile(`kiln-dhcp-test: WAITING +waiting for an IPv4/IPv6 address on a link \(DHCP\) \(needed by facts\), [0-9.]+m?s of 1m30s`).MatchString(line) {
		t.Fatalf("kiln-init status while the cable was out: %q, want the wait for an address", line)
	}
	// The lease comes half a minute later, as behind a slow DHCP server or a switch port in
	// spanning tree's listening state; first boot waits up to 90 s.
	time.Sleep(30 * time.Second)
	if err := q.do("set_link", map[string]any{"name": vm.UserNetdev, "up": true}); err != nil {
		t.Fatal(err)
	}
	t.Logf("cable plugged in after %s", time.Since(start).Round(time.Second))
	line = wait(firstbootDone)
	if firstbootOutcome(line) != nodeimage.OutcomeOK {
		t.Fatalf("first boot after a late lease: %q, want ok\n%s", line, tail(m.Lines(), 40))
	}
	m.Stop() // kiln-init syncs before it prints the line

	raw, err := e.dataFile(disk, "/lib/kiln/status.json")
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		State string `json:"state"`
		Tasks []struct {
			Name, State string
		} `json:"tasks"`
		Waits []struct {
			Fact     string `json:"fact"`
			WaitedMS int64  `json:"waited_ms"`
			Known    bool   `json:"known"`
		} `json:"waits"`
	}
	if err := json.Unmarshal([]byte(raw), &st); err != nil {
		t.Fatalf("status.json %q: %v", raw, err)
	}
	render := ""
	for _, tk := range st.Tasks {
		if tk.Name == "render" {
			render = tk.State
		}
	}
	if st.State != "ok" || render != "applied" || len(st.Waits) != 1 || !st.Waits[0].Known || st.Waits[0].WaitedMS < 25000 {
		t.Errorf("status.json: state %s, render %q, waits %+v; want ok, render applied, one wait of about 30 s that ended known", st.State, render, st.Waits)
	}
	dropIn, err := e.dataFile(disk, "/lib/kiln/etc/upper/systemd/system/kubelet.service.d/10-kiln.conf")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(dropIn, "--node-ip=10.0.2.15 ") {
		t.Errorf("kubelet drop-in lacks the lease's --node-ip=10.0.2.15:\n%s", dropIn)
	}
}
