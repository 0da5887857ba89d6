package netboot

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pin/tftp/v3"
)

// The TFTP server hands out files under its directory and nothing else, and takes none.
func TestTFTP(t *testing.T) {
	top := t.TempDir()
	dir := filepath.Join(top, "ipxe")
	os.Mkdir(dir, 0o755)
	efi := bytes.Repeat([]byte("ipxe.efi "), 30000) // several hundred 512-byte blocks
	os.WriteFile(filepath.Join(dir, "ipxe.efi"), efi, 0o644)
	os.WriteFile(filepath.Join(top, "secret.key"), []byte("SECRET"), 0o600)
	os.Symlink(filepath.Join(top, "secret.key"), filepath.Join(dir, "link.key"))
	os.Mkdir(filepath.Join(dir, "sub"), 0o755)

	logs := &syncBuffer{}
	srv, err := NewTFTP(dir, slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, conn) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	}()
	client, err := tftp.NewClient(conn.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	client.SetTimeout(time.Second)
	client.SetRetries(2)

	for _, name := range []string{"ipxe.efi", "/ipxe.efi"} {
		if got, err := receive(client, name); err != nil || !bytes.Equal(got, efi) {
			t.Errorf("read %s: %d bytes, %v; want %d bytes", name, len(got), err, len(efi))
		}
	}
	for _, name := range []string{"../secret.key", "sub/../../secret.key", "/../secret.key", "link.key", "missing.efi", "sub"} {
		got, err := receive(client, name)
		if err == nil || strings.Contains(string(got), "SECRET") {
			t.Errorf("read %s: %q, %v; want a refusal", name, got, err)
		}
	}
	rf, err := client.Send("upload.efi", "octet")
	if err == nil {
		_, err = rf.ReadFrom(strings.NewReader("data"))
	}
	if err == nil {
		t.Error("write accepted")
	}
	if _, err := os.Stat(filepath.Join(dir, "upload.efi")); err == nil {
		t.Error("write created upload.efi")
	}
	logged(t, logs, `msg=tftp file=ipxe.efi bytes=270000`, `msg=tftp file=../secret.key bytes=0`, "not a file under the TFTP directory")
}

func receive(c *tftp.Client, name string) ([]byte, error) {
	wt, err := c.Receive(name, "octet")
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	_, err = wt.WriteTo(&buf)
	return buf.Bytes(), err
}
