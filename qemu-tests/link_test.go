package qemutests

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kilnproject/kiln/builder/vm"
	"github.com/kilnproject/kiln/initd/config"
	"github.com/kilnproject/kiln/internal/nodeimage"
	"github.com/kilnproject/kiln/internal/testkit"
)

// linkProbe is the script each VM runs once first boot has written it: it waits for the peer's
// echo service over the link, then tries the host's service on the user network at 10.0.2.2.
// networkd started before first boot wrote the .network file, hence the reload.
const linkProbe = `#!/bin/bash
peer=$1 hostport=$2
networkctl reload
for i in $(seq 150); do
  if reply=$(timeout 3 bash -c "exec 3<>/dev/tcp/$peer/7777 && head -n1 <&3" 2>/dev/null); then
    echo "kiln-link-test: peer ok $reply attempt $i"
    break
  fi
  sleep 1
done
[ -n "$reply" ] || { echo "kiln-link-test: peer unreachable"; ip -br addr; ip route; }
if timeout 5 bash -c "exec 3<>/dev/tcp/10.0.2.2/$hostport" 2>/dev/null; then
  echo "kiln-link-test: host reachable"
else
  echo "kiln-link-test: host unreachable"
fi
`

// linkNodeConfig is one VM's config: the link's NIC (matched by MAC) gets addr, an echo
// service answers on port 7777 with name, and the probe runs against peer.
func linkNodeConfig(t *testing.T, dir, name, mac, addr, peer string, hostPort int) string {
	t.Helper()
	indent := func(s string) string {
		return "          " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n          ")
	}
	bu := fmt.Sprintf(`variant: fcos
version: 1.6.0
storage:
  files:
    - path: /etc/systemd/network/10-link.network
      mode: 0644
      contents:
        inline: |
          [Match]
          MACAddress=%[1]s
          [Network]
          Address=%[2]s/24
          LinkLocalAddressing=no
          IPv6AcceptRA=no
    - path: /etc/kiln-link-test.sh
      mode: 0755
      contents:
        inline: |
%[6]s
systemd:
  units:
    - name: link-echo.socket
      enabled: true
      contents: |
        [Socket]
        ListenStream=7777
        Accept=yes
        [Install]
        WantedBy=sockets.target
    - name: link-echo@.service
      contents: |
        [Service]
        ExecStart=/bin/echo hello-from-%[3]s
        StandardInput=socket
        StandardOutput=socket
    - name: link-probe.service
      enabled: true
      contents: |
        [Unit]
        After=kiln-firstboot.service link-echo.socket
        [Service]
        Type=oneshot
        ExecStart=/bin/bash /etc/kiln-link-test.sh %[4]s %[5]d
        StandardOutput=journal+console
        StandardError=journal+console
        [Install]
        WantedBy=multi-user.target
`, mac, addr, name, peer, hostPort, indent(linkProbe))
	ign, err := config.TranslateButane([]byte(bu))
	if err != nil {
		t.Fatalf("%s config: %v\n%s", name, err, bu)
	}
	p := filepath.Join(dir, name+".ign")
	if err := os.WriteFile(p, ign, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// hostService answers every TCP connection on 127.0.0.1 (10.0.2.2 to a guest) and counts them.
func hostService(t *testing.T) (port int, conns *atomic.Int32) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	conns = new(atomic.Int32)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			fmt.Fprintln(c, "host")
			c.Close()
		}
	}()
	return l.Addr().(*net.TCPAddr).Port, conns
}

// Two VMs on one link (kiln run --link) reach each other at the static addresses their configs
// give the link's NIC, found by the MAC kiln derives from the image file and link names. The
// one run --offline cannot reach the host's service at 10.0.2.2 (the other one can), yet the
// port forwarded to it answers from the host. Both are plain nodes, whose first boot succeeds.
func TestLinkAndOffline(t *testing.T) {
	e := newEnv(t)
	baked := bakePlain(t, e)
	hostPort, hostConns := hostService(t)
	fwd := testkit.FreePort(t)
	nodes := []*linkNode{
		{name: "a", addr: "192.168.100.1", peer: "192.168.100.2", offline: true},
		{name: "b", addr: "192.168.100.2", peer: "192.168.100.1"},
	}
	start := time.Now()
	bootLinked(t, e, baked, nodes, hostPort, fwd)

	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	checkFirstBoot(t, ctx, nodes)
	checkPeers(t, ctx, nodes, start)
	checkHost(t, ctx, nodes, hostPort)
	if got := hostConns.Load(); got != 1 {
		t.Errorf("the host's service saw %d connections, want 1 (from b only)", got)
	}
	checkForward(t, fwd)
	t.Logf("whole test %s", time.Since(start).Round(time.Second))
}

// linkNode is one VM of TestLinkAndOffline: its address on the link, its peer's, and
// whether it runs offline.
type linkNode struct {
	name, addr, peer string
	offline          bool
	disk             string
	m                *vm.Machine
}

// bakePlain bakes a plain node (a role that is not Kubernetes'): only kiln-init and networkd
// matter here, and the other profiles may pin artifacts this test does not serve (lock
// covers every profile). Its first boot applies the config and runs no Kubernetes task.
func bakePlain(t *testing.T, e *env) string {
	t.Helper()
	profiles := filepath.Join(e.repo, "profiles")
	old, _ := filepath.Glob(filepath.Join(profiles, "*.yaml"))
	for _, p := range old {
		os.Remove(p)
	}
	plain := "# A plain node, without Kubernetes (qemu-tests/link_test.go).\nrole: plain\nartifacts: []\nunits:\n  enable: [kiln-firstboot.service, systemd-networkd.service]\n"
	if err := os.WriteFile(filepath.Join(profiles, "plain.yaml"), []byte(plain), 0o644); err != nil {
		t.Fatal(err)
	}
	return e.bake("qemu", "plain")
}

// bootLinked boots each node from a copy of baked on one link; the offline one gets the
// host's port fwd forwarded to its echo service.
func bootLinked(t *testing.T, e *env, baked string, nodes []*linkNode, hostPort, fwd int) {
	t.Helper()
	link := fmt.Sprintf("kiln-test-%d", os.Getpid())
	for _, n := range nodes {
		n.disk = filepath.Join(e.dir, n.name+".raw")
		copySparse(t, baked, n.disk)
		mac := vm.LinkMAC(n.disk, link)
		cfg := vm.Config{Image: n.disk, Links: []vm.Link{{Name: link}}, Offline: n.offline, MemoryMB: 1024,
			Config: linkNodeConfig(t, e.dir, n.name, mac, n.addr, n.peer, hostPort)}
		if n.offline {
			cfg.Forward = map[string]int{fmt.Sprintf("127.0.0.1:%d", fwd): 7777}
		}
		// Wait only for kiln-init's first line, so the second VM boots alongside the first.
		n.m, _ = e.bootWith(cfg, regexp.MustCompile(`kiln-init: stage 1|msg="stage 1"`), 5*time.Minute)
		t.Logf("%s: %s on link %s (MAC %s), offline %v", n.name, n.addr, link, mac, n.offline)
	}
}

// checkFirstBoot checks each node's first boot succeeded.
func checkFirstBoot(t *testing.T, ctx context.Context, nodes []*linkNode) {
	t.Helper()
	for _, n := range nodes {
		if line, err := n.m.WaitFor(ctx, firstbootDone); err != nil || firstbootOutcome(line) != nodeimage.OutcomeOK {
			t.Errorf("%s: first boot of a plain node: %q, %v\n%s", n.name, line, err, tail(n.m.Lines(), 40))
		}
	}
}

// checkPeers checks each node reached the other's echo service over the link.
func checkPeers(t *testing.T, ctx context.Context, nodes []*linkNode, start time.Time) {
	t.Helper()
	re := regexp.MustCompile(`kiln-link-test: peer (ok|unreachable)`)
	for _, n := range nodes {
		other := "a"
		if n.name == "a" {
			other = "b"
		}
		line, err := n.m.WaitFor(ctx, re)
		if err != nil || !strings.Contains(line, "peer ok hello-from-"+other) {
			t.Fatalf("%s reaching %s over the link: %q, %v\n%s", n.name, n.peer, line, err, tail(n.m.Lines(), 40))
		}
		t.Logf("%s: %q %s after the first VM started", n.name, line[strings.Index(line, "kiln-link-test"):], time.Since(start).Round(time.Second))
	}
}

// checkHost checks the online node reached the host's service at 10.0.2.2 and the offline
// one did not.
func checkHost(t *testing.T, ctx context.Context, nodes []*linkNode, hostPort int) {
	t.Helper()
	re := regexp.MustCompile(`kiln-link-test: host (reachable|unreachable)`)
	for _, n := range nodes {
		line, err := n.m.WaitFor(ctx, re)
		if err != nil {
			t.Fatalf("%s: %v\n%s", n.name, err, tail(n.m.Lines(), 40))
		}
		want := "host reachable"
		if n.offline {
			want = "host unreachable"
		}
		if !strings.Contains(line, want) {
			t.Errorf("%s (offline %v) probing 10.0.2.2:%d: %q, want %q", n.name, n.offline, hostPort, line, want)
		}
	}
}

// checkForward checks the offline VM's forwarded port fwd answers from the host.
func checkForward(t *testing.T, fwd int) {
	t.Helper()
	c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", fwd), 10*time.Second)
	if err != nil {
		t.Fatalf("forwarded port %d: %v", fwd, err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	reply, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || strings.TrimSpace(reply) != "hello-from-a" {
		t.Fatalf("forwarded port %d answered %q, %v; want hello-from-a", fwd, reply, err)
	}
	t.Logf("host -> 127.0.0.1:%d -> a:7777 answered %q", fwd, strings.TrimSpace(reply))
}
