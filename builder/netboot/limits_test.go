package netboot

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kilnproject/kiln/builder/netboot/netboottest"
)

// serveLoopback loads o and runs Serve on a loopback port until the test ends; it returns
// the address and the log.
func serveLoopback(t *testing.T, o Options) (string, *syncBuffer) {
	t.Helper()
	logs := &syncBuffer{}
	o.Log = slog.New(slog.NewTextHandler(logs, nil))
	s, err := Load(o)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln, time.Second) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return ln.Addr().String(), logs
}

// request sends GET path on a new connection, with a small receive buffer (the server
// soon has to wait for the client to read), and returns the connection.
func request(t *testing.T, addr, path string, header ...string) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	conn.(*net.TCPConn).SetReadBuffer(64 << 10)
	fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: boot.example\r\n%s\r\n", path, strings.Join(header, ""))
	return conn
}

// A download whose client stops reading is cut after the stall timeout; one that is slow
// but keeps moving runs as long as it takes, well past the timeout.
func TestStalledClientCut(t *testing.T) {
	const stall = time.Second
	dir := fixture(t)
	big := netboottest.Small
	big.RootFS = 24 << 20 // much more than loopback's socket buffers hold
	if _, err := netboottest.WriteImage(dir, "metal-worker", big); err != nil {
		t.Fatal(err)
	}
	addr, logs := serveLoopback(t, Options{Dir: dir, StallTimeout: stall})
	for _, tc := range []struct {
		name  string
		pause time.Duration // before the response is read at all
		every time.Duration // between MiBs read
		whole bool
	}{
		{"stalled", 2*stall + stall/2, 0, false},
		{"slow but moving", 0, 100 * time.Millisecond, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			conn := request(t, addr, "/images/metal-worker-pxe/rootfs.img")
			time.Sleep(tc.pause)
			conn.SetReadDeadline(time.Now().Add(30 * time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Fatalf("no response: %v", err)
			}
			var n int64
			for err == nil {
				var k int64
				k, err = io.CopyN(io.Discard, resp.Body, 1<<20)
				n += k
				time.Sleep(tc.every)
			}
			if errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("after %d bytes: the server neither sent the rest nor closed", n)
			}
			if got := n == big.RootFS && err == io.EOF; got != tc.whole {
				t.Errorf("%d of %d bytes, then %v; want whole: %v", n, big.RootFS, err, tc.whole)
			}
			if d := time.Since(start); tc.whole && d < 2*stall {
				t.Errorf("the slow download took only %s: not slow enough to show a stall timeout of %s is no total deadline", d, stall)
			}
		})
	}
	logged(t, logs, `msg="client stopped reading: connection cut" path=/images/metal-worker-pxe/rootfs.img`, "stall_timeout=1s")
	if strings.Count(logs.String(), "client stopped reading") != 1 {
		t.Errorf("want one download cut:\n%s", logs)
	}
}

// At most MaxConns connections are served at once: another waits to be accepted until one
// of them closes, and is answered then.
func TestMaxConns(t *testing.T) {
	addr, logs := serveLoopback(t, Options{Dir: fixture(t), MaxConns: 2})
	var held []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		held = append(held, c)
	}
	third := request(t, addr, "/healthz")
	third.SetReadDeadline(time.Now().Add(time.Second))
	if b, err := io.ReadAll(third); !errors.Is(err, os.ErrDeadlineExceeded) || len(b) > 0 {
		t.Fatalf("a third connection was answered beside two held ones: %q, %v", b, err)
	}
	logged(t, logs, `msg="connection limit reached: new connections wait until one closes" max_conns=2`)
	held[0].Close()
	third.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(third), nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("once one closed: %v, %v; want 200", resp, err)
	}
}

// A Range header may ask for up to 16 ranges; more are refused rather than answered with a
// multipart body of each.
func TestRangeLimit(t *testing.T) {
	ts, _ := startServer(t, Options{Dir: fixture(t)})
	ranges := func(n int) string {
		var rs []string
		for i := range n {
			rs = append(rs, fmt.Sprintf("%d-%d", i*10, i*10+4))
		}
		return "bytes=" + strings.Join(rs, ",")
	}
	for _, tc := range []struct {
		ranges int
		status int
		body   string
	}{
		{1, 206, ""},
		{16, 206, "Content-Range: bytes 150-154/3000"},
		{17, 416, "17 ranges in one Range header; kiln serve answers at most 16"},
		{1000, 416, "1000 ranges in one Range header"},
	} {
		t.Run(fmt.Sprint(tc.ranges), func(t *testing.T) {
			resp, body := get(t, ts.URL+"/images/metal-worker-pxe/vmlinuz", "", "Range", ranges(tc.ranges))
			if resp.StatusCode != tc.status || !strings.Contains(body, tc.body) {
				t.Errorf("status %d (want %d), body %.200q (want %q)", resp.StatusCode, tc.status, body, tc.body)
			}
		})
	}
}

// A request with a body is answered 400 at once and its connection closed: no handler reads
// a body, and net/http would otherwise wait, with no deadline, for one that never comes.
func TestRequestBodyRefused(t *testing.T) {
	addr, _ := serveLoopback(t, Options{Dir: fixture(t)})
	for _, tc := range []struct{ name, header string }{
		{"length", "Content-Length: 100\r\n"},
		{"small length", "Content-Length: 1\r\n"},
		{"chunked", "Transfer-Encoding: chunked\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn := request(t, addr, "/healthz", tc.header) // and no body
			conn.SetReadDeadline(time.Now().Add(5 * time.Second))
			r := bufio.NewReader(conn)
			resp, err := http.ReadResponse(r, nil)
			if err != nil {
				t.Fatalf("no answer while the body is awaited: %v", err)
			}
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "kiln serve takes no request body") {
				t.Errorf("status %d %q, want 400", resp.StatusCode, body)
			}
			if n, err := r.Read(make([]byte, 1)); err != io.EOF {
				t.Errorf("after the answer: %d bytes, %v; want the connection closed", n, err)
			}
		})
	}
}
