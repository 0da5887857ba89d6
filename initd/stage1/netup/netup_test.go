package netup

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/dhcpv4/server4"
	"github.com/insomniacslk/dhcp/rfc1035label"

	"github.com/kilnproject/kiln/internal/testkit"
)

// The tests run Up and a real DHCP server (server4) in two network namespaces joined by veth
// pairs. Each side is this test binary started again under `ip netns exec` with helperEnv
// naming its role.
const (
	helperEnv  = "KILN_NETUP_HELPER" // "server" or "client"
	ifaceEnv   = "KILN_NETUP_IFACE"  // server: the link to serve on
	dropEnv    = "KILN_NETUP_DROP"   // server: DISCOVERs to ignore before answering
	timeoutEnv = "KILN_NETUP_TIMEOUT"
	resolvEnv  = "KILN_NETUP_RESOLV"
)

// What the test server leases.
var (
	serverIP = net.IPv4(10, 99, 0, 1)
	leaseIP  = net.IPv4(10, 99, 0, 50)
	dnsIP    = net.IPv4(10, 99, 0, 53)
)

func TestMain(m *testing.M) {
	switch os.Getenv(helperEnv) {
	case "server":
		os.Exit(serveDHCP())
	case "client":
		os.Exit(runUp())
	}
	os.Exit(m.Run())
}

// serveDHCP answers DISCOVER and REQUEST on $KILN_NETUP_IFACE until killed.
func serveDHCP() int {
	var discovers atomic.Int64
	toDrop, _ := strconv.ParseInt(os.Getenv(dropEnv), 10, 64)
	handler := func(conn net.PacketConn, peer net.Addr, m *dhcpv4.DHCPv4) {
		reply, err := dhcpv4.NewReplyFromRequest(m,
			dhcpv4.WithYourIP(leaseIP),
			dhcpv4.WithServerIP(serverIP),
			dhcpv4.WithNetmask(net.CIDRMask(24, 32)),
			dhcpv4.WithRouter(serverIP),
			dhcpv4.WithDNS(dnsIP),
			dhcpv4.WithOption(dhcpv4.OptServerIdentifier(serverIP)),
			dhcpv4.WithOption(dhcpv4.OptIPAddressLeaseTime(10*time.Minute)),
			dhcpv4.WithOption(dhcpv4.OptDomainSearch(&rfc1035label.Labels{Labels: []string{"rack.test"}})))
		if err != nil {
			return
		}
		switch m.MessageType() {
		case dhcpv4.MessageTypeDiscover:
			if discovers.Add(1) <= toDrop {
				return
			}
			reply.UpdateOption(dhcpv4.OptMessageType(dhcpv4.MessageTypeOffer))
		case dhcpv4.MessageTypeRequest:
			reply.UpdateOption(dhcpv4.OptMessageType(dhcpv4.MessageTypeAck))
		default:
			return
		}
		_, _ = conn.WriteTo(reply.ToBytes(), peer)
	}
	conn, err := server4.NewIPv4UDPConn(os.Getenv(ifaceEnv), &net.UDPAddr{Port: dhcpv4.ServerPort})
	if err != nil {
		fmt.Fprintln(os.Stderr, "dhcp server:", err)
		return 1
	}
	s, err := server4.NewServer("", nil, handler, server4.WithConn(slirpConn{conn}))
	if err != nil {
		fmt.Fprintln(os.Stderr, "dhcp server:", err)
		return 1
	}
	fmt.Println("serving")
	_ = s.Serve()
	return 0
}

// slirpConn drops requests shorter than minMessageSize, as QEMU's user-mode DHCP server does.
type slirpConn struct{ net.PacketConn }

func (c slirpConn) ReadFrom(b []byte) (int, net.Addr, error) {
	for {
		n, addr, err := c.PacketConn.ReadFrom(b)
		if err != nil || n >= minMessageSize {
			return n, addr, err
		}
	}
}

// runUp runs Up and prints the lease as JSON, or the error.
func runUp() int {
	timeout, _ := time.ParseDuration(os.Getenv(timeoutEnv))
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	l, err := Up(context.Background(), log, Options{Timeout: timeout, resolvConf: os.Getenv(resolvEnv), progress: time.Second})
	if err != nil {
		fmt.Println("error: " + err.Error())
		return 1
	}
	out, _ := json.Marshal(map[string]string{"link": l.Link, "address": l.Address.String(),
		"gateway": l.gateway.String(), "server": l.server.String(), "string": l.String()})
	fmt.Println(string(out))
	return 0
}

// netns is a network namespace made for one test, deleted (with its links) at the end.
type netns string

func newNetns(t *testing.T, role string) netns {
	t.Helper()
	name := fmt.Sprintf("kiln-netup-%d-%s-%s", os.Getpid(), strings.ToLower(t.Name()[4:]), role)
	if len(name) > 60 {
		name = name[:60]
	}
	testkit.Run(t, "ip", "netns", "add", name)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	testkit.Run(t, "ip", "-n", name, "link", "set", "lo", "up")
	return netns(name)
}

// veth joins link a in ns to link b in peer, both set up unless down says otherwise.
func veth(t *testing.T, ns netns, a string, peer netns, b string) {
	t.Helper()
	testkit.Run(t, "ip", "-n", string(ns), "link", "add", a, "type", "veth", "peer", "name", b, "netns", string(peer))
}

// requireNetns skips the test unless it runs as root with iproute2 (or fails it under
// KILN_REQUIRE_TOOLS when ip is missing).
func requireNetns(t *testing.T) {
	t.Helper()
	testkit.RequireRoot(t, "network namespaces")
	testkit.Tool(t, "ip", "iproute2")
}

// startServer runs the DHCP server on link in ns, ignoring the first drop DISCOVERs.
func startServer(t *testing.T, ns netns, link string, drop int) {
	t.Helper()
	testkit.Run(t, "ip", "-n", string(ns), "addr", "add", "10.99.0.1/24", "dev", link)
	testkit.Run(t, "ip", "-n", string(ns), "link", "set", link, "up")
	cmd := exec.Command("ip", "netns", "exec", string(ns), os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=server", ifaceEnv+"="+link, fmt.Sprintf("%s=%d", dropEnv, drop))
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line := make([]byte, 8)
	if _, err := out.Read(line); err != nil || !strings.HasPrefix(string(line), "serving") {
		t.Fatalf("DHCP server did not start: %v %q %s", err, line, stderr.String())
	}
}

// up runs Up in ns and returns its stdout (the lease as JSON, or "error: …"), its log and
// how long it took.
func up(t *testing.T, ns netns, timeout time.Duration, resolv string) (out, log string, took time.Duration) {
	t.Helper()
	cmd := exec.Command("ip", "netns", "exec", string(ns), os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=client", timeoutEnv+"="+timeout.String(), resolvEnv+"="+resolv)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	_ = cmd.Run()
	return strings.TrimSpace(stdout.String()), stderr.String(), time.Since(start)
}

func TestUpTakesTheFirstLease(t *testing.T) {
	requireNetns(t)
	client, server := newNetns(t, "c"), newNetns(t, "s")
	veth(t, client, "eth0", server, "dead0") // its peer stays down: no carrier, no lease
	veth(t, client, "ens3", server, "srv0")
	startServer(t, server, "srv0", 2) // two DISCOVERs go unanswered: the client retries, the console hears of it
	resolv := filepath.Join(t.TempDir(), "etc", "resolv.conf")

	out, log, took := up(t, client, 30*time.Second, resolv)
	var got map[string]string
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("Up: %s\nlog:\n%s", out, log)
	}
	want := map[string]string{"link": "ens3", "address": "10.99.0.50/24", "gateway": "10.99.0.1", "server": "10.99.0.1",
		"string": "ens3 10.99.0.50/24 via 10.99.0.1 dns 10.99.0.53 from 10.99.0.1 for 10m0s"}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("lease %s = %q, want %q", k, got[k], v)
		}
	}
	if !strings.Contains(log, "waiting for a DHCP lease on ens3, eth0 (") {
		t.Errorf("no progress line naming both links in the log:\n%s", log)
	}
	t.Logf("lease after %s", took.Round(time.Millisecond))
	addr := testkit.Run(t, "ip", "-n", string(client), "-4", "-o", "addr", "show", "dev", "ens3")
	if !strings.Contains(addr, "inet 10.99.0.50/24") {
		t.Errorf("ens3 addresses: %s", addr)
	}
	if addr := testkit.Run(t, "ip", "-n", string(client), "-4", "-o", "addr", "show", "dev", "eth0"); strings.Contains(addr, "inet ") {
		t.Errorf("eth0 got an address too: %s", addr)
	}
	if r := testkit.Run(t, "ip", "-n", string(client), "-4", "route", "show", "default"); !strings.Contains(r, "default via 10.99.0.1 dev ens3") {
		t.Errorf("default route: %q", r)
	}
	rc, err := os.ReadFile(resolv)
	if err != nil {
		t.Fatal(err)
	}
	if s := string(rc); !strings.Contains(s, "nameserver 10.99.0.53\n") || !strings.Contains(s, "search rack.test\n") {
		t.Errorf("resolv.conf:\n%s", s)
	}
	if r := testkit.Run(t, "ip", "-n", string(client), "route", "get", "10.99.0.1"); !strings.Contains(r, "dev ens3 src 10.99.0.50") {
		t.Errorf("route to the server: %q", r)
	}
}

func TestUpNoLease(t *testing.T) {
	requireNetns(t)
	client, server := newNetns(t, "c"), newNetns(t, "s")
	veth(t, client, "eth0", server, "dead0")
	veth(t, client, "ens3", server, "quiet0")
	testkit.Run(t, "ip", "-n", string(server), "link", "set", "quiet0", "up") // carrier, but no server
	resolv := filepath.Join(t.TempDir(), "resolv.conf")

	out, log, took := up(t, client, 4*time.Second, resolv)
	for _, want := range []string{
		"error: network: no DHCP lease within 4s on ens3, eth0 (",
		"ens3 ", ": link up, no DHCP offer",
		"eth0 ", ": no carrier",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("Up = %q, want it to contain %q\nlog:\n%s", out, want, log)
		}
	}
	if took > 10*time.Second {
		t.Errorf("Up gave up after %s, want about 4s", took)
	}
	if _, err := os.Stat(resolv); !os.IsNotExist(err) {
		t.Errorf("resolv.conf written without a lease (%v)", err)
	}
}

func TestUpNoLink(t *testing.T) {
	requireNetns(t)
	client := newNetns(t, "c")
	out, log, _ := up(t, client, 2*time.Second, filepath.Join(t.TempDir(), "resolv.conf"))
	want := "error: network: no network link appeared within 2s (links seen: lo); is the NIC's driver among the image's initramfs modules?"
	if out != want {
		t.Errorf("Up = %q, want %q", out, want)
	}
	if !strings.Contains(log, "waiting for a network link (1 s)") {
		t.Errorf("no progress line in the log:\n%s", log)
	}
}
