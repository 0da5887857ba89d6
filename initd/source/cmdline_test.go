package source

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kilnproject/kiln/internal/fetch"
)

func mustMAC(t *testing.T, s string) net.HardwareAddr {
	t.Helper()
	m, err := net.ParseMAC(s)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestPrimaryMAC(t *testing.T) {
	lo := net.Interface{Name: "lo", Flags: net.FlagLoopback | net.FlagUp}
	tests := []struct {
		name    string
		ifaces  []net.Interface
		want    string
		wantErr bool
	}{
		{name: "first by name", ifaces: []net.Interface{
			lo,
			{Name: "eth1", HardwareAddr: mustMAC(t, "52:54:00:00:00:02")},
			{Name: "eth0", HardwareAddr: mustMAC(t, "52:54:00:AB:CD:EF")},
		}, want: "52:54:00:ab:cd:ef"},
		{name: "skips interfaces without MAC", ifaces: []net.Interface{
			{Name: "a-tun", Flags: net.FlagUp},
			{Name: "ens3", HardwareAddr: mustMAC(t, "02-00-00-00-00-01")},
		}, want: "02:00:00:00:00:01"},
		{name: "only loopback", ifaces: []net.Interface{lo}, wantErr: true},
		{name: "none", wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := PrimaryMAC(tc.ifaces)
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Errorf("PrimaryMAC = %q, %v; want %q (error %v)", got, err, tc.want, tc.wantErr)
			}
		})
	}
}

// fakeDMI writes <sys>/class/dmi/id/{product_uuid,product_serial}; "" leaves a file out.
func fakeDMI(t *testing.T, uuid, serial string) string {
	t.Helper()
	sys := t.TempDir()
	dir := filepath.Join(sys, "class", "dmi", "id")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, v := range map[string]string{"product_uuid": uuid, "product_serial": serial} {
		if v == "" {
			continue
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(v+"\n"), 0o444); err != nil {
			t.Fatal(err)
		}
	}
	return sys
}

func TestExpand(t *testing.T) {
	full := fakeDMI(t, "4C4C4544-0042-3510-8052-B4C04F564E32", "VMware-56 4d 12")
	empty := fakeDMI(t, "", "")
	nic := func() ([]net.Interface, error) {
		return []net.Interface{{Name: "enp1s0", HardwareAddr: mustMAC(t, "52:54:00:12:34:56")}}, nil
	}
	noNIC := func() ([]net.Interface, error) { return nil, nil }
	host := func() (string, error) { return "node-1", nil }
	tests := []struct {
		name    string
		in      string
		sysfs   string
		ifaces  func() ([]net.Interface, error)
		want    string
		wantErr string
	}{
		{name: "no variables", in: "https://cfg.example/node.ign", sysfs: empty, ifaces: noNIC, want: "https://cfg.example/node.ign"},
		{name: "mac", in: "http://h/${mac}.ign", sysfs: empty, ifaces: nic, want: "http://h/52:54:00:12:34:56.ign"},
		{name: "uuid lowercased", in: "http://h/${uuid}", sysfs: full, ifaces: noNIC, want: "http://h/4c4c4544-0042-3510-8052-b4c04f564e32"},
		{name: "hostname and serial escaped", in: "tftp://h/${hostname}/${serial}?m=${mac}", sysfs: full, ifaces: nic,
			want: "tftp://h/node-1/VMware-56%204d%2012?m=52:54:00:12:34:56"},
		{name: "repeated variable", in: "${hostname}-${hostname}", sysfs: empty, ifaces: noNIC, want: "node-1-node-1"},
		{name: "unknown variable", in: "http://h/${ip}", sysfs: full, ifaces: nic, wantErr: "unknown variable ${ip} (known: hostname, mac, serial, uuid)"},
		{name: "unterminated", in: "http://h/${mac", sysfs: full, ifaces: nic, wantErr: `unterminated ${ at "${mac"`},
		{name: "no NIC for mac", in: "http://h/${mac}", sysfs: full, ifaces: noNIC, wantErr: "${mac}: no network interface with a MAC address"},
		{name: "no DMI uuid", in: "http://h/${uuid}", sysfs: empty, ifaces: nic, wantErr: "product_uuid: no such file"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := &CmdlineURL{Sysfs: tc.sysfs, Interfaces: tc.ifaces, Hostname: host}
			got, err := c.Expand(tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Expand = %q, %v; want error %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Errorf("Expand = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

func TestCmdlineURLProbe(t *testing.T) {
	dir := t.TempDir()
	withKey := filepath.Join(dir, "cmdline")
	if err := os.WriteFile(withKey, []byte("ro kiln.platform=metal kiln.config.url=http://10.0.0.1/c.ign\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		c    CmdlineURL
		want bool
	}{
		{"given line with key", CmdlineURL{Cmdline: "kiln.config.url=http://h/"}, true},
		{"given line without key", CmdlineURL{Cmdline: "ro quiet"}, false},
		{"read from file", CmdlineURL{CmdlinePath: withKey}, true},
		{"unreadable file", CmdlineURL{CmdlinePath: filepath.Join(dir, "missing")}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.c.Probe(context.Background()); got != tc.want {
				t.Errorf("Probe = %v, want %v", got, tc.want)
			}
		})
	}
}

// configServer serves ign at /node-<mac>.ign after failing the first `fail` requests with
// status failWith; any other path is 404.
func configServer(t *testing.T, fail int32, failWith int) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := hits.Add(1)
		if r.URL.Path != "/node-52:54:00:12:34:56.ign" {
			http.NotFound(w, r)
			return
		}
		if n <= fail {
			http.Error(w, "try later", failWith)
			return
		}
		fmt.Fprint(w, ign)
	}))
	t.Cleanup(srv.Close)
	return srv, &hits
}

func TestCmdlineURLFetchHTTP(t *testing.T) {
	nic := func() ([]net.Interface, error) {
		return []net.Interface{{Name: "eth0", HardwareAddr: mustMAC(t, "52:54:00:12:34:56")}}, nil
	}
	tests := []struct {
		name     string
		fail     int32
		failWith int
		path     string
		extra    string
		wantHits int32
		wantErr  string
		maxTime  time.Duration
	}{
		{name: "first try", path: "/node-${mac}.ign", wantHits: 1},
		{name: "two 503s then success", fail: 2, failWith: http.StatusServiceUnavailable, path: "/node-${mac}.ign", wantHits: 3},
		// maxTime tells a Fetch that stops from one that retries for the default two minutes,
		// with room for a slow machine.
		{name: "404 fails at once", path: "/wrong.ign", wantHits: 1, wantErr: "404 Not Found", maxTime: 10 * time.Second},
		{name: "403 fails at once", fail: 100, failWith: http.StatusForbidden, path: "/node-${mac}.ign", wantHits: 1, wantErr: "403 Forbidden", maxTime: 10 * time.Second},
		{name: "5xx until the deadline", fail: 1000, failWith: http.StatusBadGateway, path: "/node-${mac}.ign",
			extra: " kiln.config.timeout=1", wantErr: "gave up after", maxTime: 20 * time.Second},
		{name: "bad timeout", path: "/node-${mac}.ign", extra: " kiln.config.timeout=soon", wantErr: "kiln.config.timeout=soon: not a duration"},
		{name: "unknown variable", path: "/${rack}.ign", wantErr: "unknown variable ${rack}"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srv, hits := configServer(t, tc.fail, tc.failWith)
			c := &CmdlineURL{
				Cmdline:    "ro kiln.config.url=" + srv.URL + tc.path + tc.extra,
				Interfaces: nic,
				Backoff:    50 * time.Millisecond,
			}
			start := time.Now()
			data, err := c.Fetch(context.Background())
			if tc.maxTime > 0 && time.Since(start) > tc.maxTime {
				t.Errorf("Fetch took %v, want under %v", time.Since(start), tc.maxTime)
			}
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Fetch = %q, %v; want error %q", data, err, tc.wantErr)
				}
			} else if err != nil || string(data) != ign {
				t.Fatalf("Fetch = %q, %v; want the config", data, err)
			}
			if tc.wantHits > 0 && hits.Load() != tc.wantHits {
				t.Errorf("server saw %d requests, want %d", hits.Load(), tc.wantHits)
			}
		})
	}
}

func TestCmdlineURLUnreachableRetriesUntilDeadline(t *testing.T) {
	// A port with no listener: connection refused, a network error that is retried.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	c := &CmdlineURL{Cmdline: "kiln.config.url=http://" + addr + "/c.ign kiln.config.timeout=700ms", Backoff: 50 * time.Millisecond}
	start := time.Now()
	_, err = c.Fetch(context.Background())
	elapsed := time.Since(start)
	if err == nil || !strings.Contains(err.Error(), "connection refused") || !strings.Contains(err.Error(), "gave up after") {
		t.Fatalf("err = %v, want retries ending in connection refused", err)
	}
	if elapsed < 700*time.Millisecond || elapsed > 20*time.Second {
		t.Errorf("gave up after %v, want the 700ms deadline (not the default two minutes)", elapsed)
	}
	if fetch.IsPermanent(err) {
		t.Error("a network error was treated as permanent")
	}
}

// When the deadline ends an attempt in flight, the error is what the attempts before it found,
// not the deadline: the server answers 502 once, then holds the next request until the fetch
// is stopped (here by the caller, when that request arrives; at boot by kiln.config.timeout).
func TestCmdlineURLDeadlineDuringAttempt(t *testing.T) {
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if hits.Add(1) == 1 {
			http.Error(w, "upstream down", http.StatusBadGateway)
			return
		}
		stop()
		<-r.Context().Done()
	}))
	defer srv.Close()
	c := &CmdlineURL{Cmdline: "kiln.config.url=" + srv.URL + "/c.ign", Backoff: time.Millisecond}
	_, err := c.Fetch(ctx)
	if err == nil || !strings.Contains(err.Error(), "gave up after 2 attempts") || !strings.Contains(err.Error(), "502 Bad Gateway") {
		t.Fatalf("err = %v, want the 502 of the first attempt", err)
	}
}

func TestCmdlineURLRejects(t *testing.T) {
	tests := []struct{ cmdline, wantErr string }{
		{"kiln.config.url=ftp://h/c.ign", `scheme "ftp" not supported`},
		{"kiln.config.url=/c.ign", `scheme "" not supported`},
		{"kiln.config.url=http:///c.ign", "no host"},
		{"ro", "kernel command line has no kiln.config.url="},
	}
	for _, tc := range tests {
		t.Run(tc.cmdline, func(t *testing.T) {
			_, err := (&CmdlineURL{Cmdline: tc.cmdline}).Fetch(context.Background())
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("err = %v, want %q", err, tc.wantErr)
			}
		})
	}
}

func TestCmdlineURLEmptyAnswer(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer srv.Close()
	_, err := (&CmdlineURL{Cmdline: "kiln.config.url=" + srv.URL + "/c.ign"}).Fetch(context.Background())
	if err == nil || !strings.Contains(err.Error(), "empty response") {
		t.Errorf("err = %v, want empty response", err)
	}
}
