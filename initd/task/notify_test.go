package task

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestNotify(t *testing.T) {
	tests := []struct {
		name string
		addr func(t *testing.T) string
	}{
		{"socket file", func(t *testing.T) string { return filepath.Join(t.TempDir(), "notify") }},
		{"abstract namespace", func(t *testing.T) string { return fmt.Sprintf("@kiln-test-notify-%d", os.Getpid()) }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			addr := tc.addr(t)
			conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: addr, Net: "unixgram"})
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			t.Setenv("NOTIFY_SOCKET", addr)

			for _, msg := range []string{"STATUS=task 3/12: files", "READY=1\nSTATUS=tasks=12 applied=5 unchanged=7 failed=0"} {
				if err := Notify(msg); err != nil {
					t.Fatal(err)
				}
				conn.SetReadDeadline(time.Now().Add(5 * time.Second))
				buf := make([]byte, 4096)
				n, err := conn.Read(buf)
				if err != nil {
					t.Fatal(err)
				}
				if got := string(buf[:n]); got != msg {
					t.Errorf("systemd got %q, want %q", got, msg)
				}
			}
		})
	}
}

func TestNotifyErrors(t *testing.T) {
	tests := []struct {
		name    string
		socket  string
		wantErr string // "" means Notify is a silent no-op
	}{
		{"not under systemd", "", ""},
		{"socket gone", "/nonexistent/kiln/notify", "sd_notify to /nonexistent/kiln/notify: "},
		{"relative name", "notify", `NOTIFY_SOCKET="notify": want an absolute path`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("NOTIFY_SOCKET", tc.socket)
			err := Notify("READY=1")
			switch {
			case tc.wantErr == "" && err != nil:
				t.Errorf("Notify: %v, want nil", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Errorf("Notify: %v, want error containing %q", err, tc.wantErr)
			}
		})
	}
}
