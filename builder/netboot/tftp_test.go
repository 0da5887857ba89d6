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
	srv, err := NewTFTP(dir, 0, slog.New(slog.NewTextHandler(logs, nil)))
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

// Anything but a regular file in the TFTP directory is refused at once, before it is
// opened: a FIFO would hold the request, and a thread, until someone wrote to it.
func TestTFTPRefusesNonRegular(t *testing.T) {
	dir := t.TempDir()
	mkfifo(t, filepath.Join(dir, "pipe.efi"))
	sock, err := net.Listen("unix", filepath.Join(dir, "sock.efi"))
	if err != nil {
		t.Fatal(err)
	}
	defer sock.Close()
	os.Mkdir(filepath.Join(dir, "sub"), 0o755)

	logs := &syncBuffer{}
	srv, err := NewTFTP(dir, 0, slog.New(slog.NewTextHandler(logs, nil)))
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
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Error("Serve did not return: a request is still held")
		}
	}()
	client, err := tftp.NewClient(conn.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	client.SetTimeout(time.Second)
	client.SetRetries(2)
	for _, tc := range []struct{ name, want string }{
		{"pipe.efi", "pipe.efi is a FIFO, not a regular file"},
		{"/pipe.efi", "pipe.efi is a FIFO, not a regular file"},
		{"sock.efi", "sock.efi is a socket, not a regular file"},
		{"sub", "sub is a directory, not a regular file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A request held open would end in the client's timeout, without the message.
			if _, err := receive(client, tc.name); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("read %s: %v; want the server's refusal %q", tc.name, err, tc.want)
			}
		})
	}
	logged(t, logs, `msg=tftp file=pipe.efi bytes=0`, `error="pipe.efi is a FIFO, not a regular file"`)
}

// At most maxTransfers transfers run at once: a request beyond them is refused at once, and
// served again once a transfer ends.
func TestTFTPMaxTransfers(t *testing.T) {
	dir := t.TempDir()
	efi := bytes.Repeat([]byte("ipxe.efi "), 30000)
	writeFile(t, filepath.Join(dir, "ipxe.efi"), string(efi))
	logs := &syncBuffer{}
	srv, err := NewTFTP(dir, 1, slog.New(slog.NewTextHandler(logs, nil)))
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

	// A client that asks for the file and acknowledges nothing holds the one transfer.
	holder, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	if _, err := holder.WriteTo([]byte("\x00\x01ipxe.efi\x00octet\x00"), conn.LocalAddr()); err != nil {
		t.Fatal(err)
	}
	holder.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 1024)
	n, transfer, err := holder.ReadFrom(buf)
	if err != nil || n < 4 || buf[1] != 3 {
		t.Fatalf("no first block for the holding client: %q, %v", buf[:n], err)
	}

	client, err := tftp.NewClient(conn.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	client.SetTimeout(time.Second)
	client.SetRetries(2)
	if _, err := receive(client, "ipxe.efi"); err == nil || !strings.Contains(err.Error(), `"ipxe.efi": busy with as many transfers as it runs at once (1); try again`) {
		t.Errorf("a second transfer beside the held one: %v; want a refusal", err)
	}

	// The holder gives up (a TFTP error packet): the slot is free again.
	if _, err := holder.WriteTo([]byte("\x00\x05\x00\x00gone\x00"), transfer); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		got, err := receive(client, "ipxe.efi")
		if err == nil && bytes.Equal(got, efi) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("once the held transfer ended: %d bytes, %v; want the file", len(got), err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
