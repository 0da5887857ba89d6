package netboot

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/kilnproject/kiln/builder/netboot/netboottest"
)

// On shutdown, a transfer in flight finishes (within the drain timeout) and new
// connections are refused; one that outlasts the timeout is cut.
func TestServeDrains(t *testing.T) {
	dir := fixture(t)
	big := netboottest.Small
	big.RootFS = 48 << 20 // more than loopback's socket buffers hold
	if _, err := netboottest.WriteImage(dir, "metal-worker", big); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		drain    time.Duration
		complete bool
		log      string
	}{
		{"drained", 30 * time.Second, true, `msg="shutting down: draining requests" timeout=30s`},
		{"cut", 200 * time.Millisecond, false, "requests still open after the drain timeout were cut"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logs := &syncBuffer{}
			s, err := Load(Options{Dir: dir, Log: slog.New(slog.NewTextHandler(logs, nil))})
			if err != nil {
				t.Fatal(err)
			}
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- s.Serve(ctx, ln, tc.drain) }()
			url := "http://" + ln.Addr().String() + "/images/" + filepath.ToSlash("metal-worker-pxe/rootfs.img")
			resp, err := http.Get(url)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			cancel()
			if !tc.complete {
				time.Sleep(tc.drain + 300*time.Millisecond) // the client stalls past the timeout
			}
			n, err := io.Copy(io.Discard, resp.Body)
			if tc.complete && (err != nil || n != big.RootFS) {
				t.Errorf("transfer in flight: %d bytes, %v; want all %d", n, err, big.RootFS)
			}
			if !tc.complete && err == nil && n == big.RootFS {
				t.Error("transfer outlasting the drain timeout was not cut")
			}
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Serve: %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("Serve did not return")
			}
			if _, err := http.Get("http://" + ln.Addr().String() + "/healthz"); err == nil {
				t.Error("a new request was answered after shutdown")
			}
			logged(t, logs, tc.log)
		})
	}
}
