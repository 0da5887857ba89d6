package source

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kilnproject/kiln/internal/fetch"
	"github.com/kilnproject/kiln/internal/testkit"
)

// startTFTPD runs Debian's tftpd-hpa on 127.0.0.1 at a free port, serving dir, and
// returns host:port. It skips the test when in.tftpd is missing or we are not root
// (in.tftpd -s chroots).
func startTFTPD(t *testing.T, dir string) string {
	t.Helper()
	bin := testkit.Tool(t, "in.tftpd", "tftpd-hpa")
	testkit.RequireRoot(t, "in.tftpd -s chroots")
	// The daemon drops to user tftp: the tree must be readable by others.
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := pc.LocalAddr().String()
	pc.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, "-L", "-a", addr, "-s", dir)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatalf("start in.tftpd: %v", err)
	}
	t.Cleanup(func() {
		cancel()
		_ = cmd.Wait()
		if t.Failed() && stderr.Len() > 0 {
			t.Logf("in.tftpd: %s", stderr.String())
		}
	})
	// Wait until it answers (a missing file gets an error packet); the bound only ends a
	// wait for a server that will never answer, however slow the machine.
	deadline := time.Now().Add(time.Minute)
	for {
		_, err := TFTPClient{Timeout: 100 * time.Millisecond, Retries: 1}.Get(context.Background(), addr, "probe-not-there")
		var se *tftpServerError
		if errors.As(err, &se) {
			return addr
		}
		if time.Now().After(deadline) {
			t.Fatalf("in.tftpd on %s does not answer: %v", addr, err)
		}
	}
}

func writeFile(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

func randomBytes(n int) []byte {
	r := rand.New(rand.NewPCG(uint64(n), 1))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func TestTFTPAgainstTFTPDHPA(t *testing.T) {
	dir := t.TempDir()
	addr := startTFTPD(t, dir)
	files := map[string][]byte{
		"small.ign":        []byte(ign),
		"empty":            {},
		"two-blocks-exact": randomBytes(2 * DefaultTFTPBlockSize), // ends with an empty block
		"multi":            randomBytes(10_000),
		"exact-512":        randomBytes(3 * 512),
		"wrap":             randomBytes(8*65536 + 100), // 65549 blocks of 8 bytes: the block number wraps
	}
	for name, data := range files {
		writeFile(t, filepath.Join(dir, "cfg", name), data)
	}
	tests := []struct {
		name     string
		file     string
		blksize  int
		wantErr  string
		long     bool
		maxTime  time.Duration
		wantData []byte
	}{
		{name: "small with blksize option", file: "cfg/small.ign"},
		{name: "empty file", file: "cfg/empty"},
		{name: "exact multiple of the block size", file: "cfg/two-blocks-exact"},
		{name: "many blocks", file: "cfg/multi"},
		{name: "classic 512-byte blocks, no option", file: "cfg/exact-512", blksize: 512},
		{name: "odd block size", file: "cfg/multi", blksize: 1000},
		{name: "block number wraps past 65535", file: "cfg/wrap", blksize: 8, long: true},
		{name: "not found fails at once", file: "cfg/missing.ign", wantErr: "tftp server error 1: File not found", maxTime: 10 * time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.long && testing.Short() {
				t.Skip("65549 round trips")
			}
			start := time.Now()
			got, err := TFTPClient{BlockSize: tc.blksize}.Get(context.Background(), addr, tc.file)
			if tc.maxTime > 0 && time.Since(start) > tc.maxTime {
				t.Errorf("Get took %v, want under %v", time.Since(start), tc.maxTime)
			}
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !fetch.IsPermanent(err) {
					t.Fatalf("Get: err = %v, want permanent %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Get: %v", err)
			}
			want := files[filepath.Base(tc.file)]
			if !bytes.Equal(got, want) {
				t.Errorf("Get returned %d bytes, want the file's %d bytes", len(got), len(want))
			}
		})
	}
}

func TestTFTPTooLarge(t *testing.T) {
	dir := t.TempDir()
	addr := startTFTPD(t, dir)
	big := filepath.Join(dir, "big")
	f, err := os.Create(big)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(MaxConfigSize + 1); err != nil {
		t.Fatal(err)
	}
	f.Close()
	os.Chmod(big, 0o644)
	_, err = TFTPClient{BlockSize: 65464}.Get(context.Background(), addr, "big")
	if err == nil || !strings.Contains(err.Error(), "larger than the 64 MiB cap") {
		t.Fatalf("err = %v, want the size limit", err)
	}
}

func TestCmdlineURLTFTP(t *testing.T) {
	dir := t.TempDir()
	addr := startTFTPD(t, dir)
	writeFile(t, filepath.Join(dir, "nodes", "52:54:00:12:34:56.ign"), []byte(ign))
	nic := func() ([]net.Interface, error) {
		return []net.Interface{{Name: "eth0", HardwareAddr: mustMAC(t, "52:54:00:12:34:56")}}, nil
	}
	tests := []struct{ path, wantErr string }{
		{path: "/nodes/${mac}.ign"},
		{path: "/nodes/nobody.ign", wantErr: "File not found"},
	}
	for _, tc := range tests {
		t.Run(tc.path, func(t *testing.T) {
			c := &CmdlineURL{Cmdline: "kiln.config.url=tftp://" + addr + tc.path, Interfaces: nic}
			start := time.Now()
			data, err := c.Fetch(context.Background())
			if tc.wantErr != "" {
				// At once: not after retries until the default timeout (minutes).
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || time.Since(start) > 10*time.Second {
					t.Fatalf("Fetch = %v after %v, want %q at once", err, time.Since(start), tc.wantErr)
				}
				return
			}
			if err != nil || string(data) != ign {
				t.Fatalf("Fetch = %q, %v", data, err)
			}
		})
	}
}

func TestTFTPSilentServer(t *testing.T) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	start := time.Now()
	_, err = TFTPClient{Timeout: 50 * time.Millisecond, Retries: 2}.Get(context.Background(), pc.LocalAddr().String(), "x")
	if err == nil || !strings.Contains(err.Error(), "no answer from") {
		t.Fatalf("err = %v, want no answer", err)
	}
	if fetch.IsPermanent(err) {
		t.Error("silence was treated as a permanent error")
	}
	if el := time.Since(start); el > 10*time.Second {
		t.Errorf("gave up after %v, want about 3 × 50ms", el)
	}
	// Three requests: the first and two retransmissions.
	_ = pc.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	buf := make([]byte, 100)
	n := 0
	for {
		if _, _, err := pc.ReadFrom(buf); err != nil {
			break
		}
		n++
	}
	if n != 3 {
		t.Errorf("server saw %d requests, want 3", n)
	}
}

func TestTFTPContextCancel(t *testing.T) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = TFTPClient{Timeout: 10 * time.Second}.Get(ctx, pc.LocalAddr().String(), "x")
	// Promptly: well before the client's own 10 s timeout.
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 5*time.Second {
		t.Fatalf("Get = %v after %v, want the context's deadline promptly", err, time.Since(start))
	}
}

// TestTFTPLossAndForeignTID plays a server that ignores the first request and the
// blksize option, and a stranger that injects a block from another port mid-transfer.
func TestTFTPLossAndForeignTID(t *testing.T) {
	srv := &lossyTFTPServer{
		server: listenLoopbackUDP(t), transfer: listenLoopbackUDP(t), stranger: listenLoopbackUDP(t),
		block1: randomBytes(512), block2: []byte("tail"),
		strangerGot: make(chan []byte, 1),
	}
	serverErr := make(chan error, 1)
	go func() { serverErr <- srv.serve() }()
	got, err := TFTPClient{Timeout: 100 * time.Millisecond}.Get(context.Background(), srv.server.LocalAddr().String(), "cfg.ign")
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	if want := append(append([]byte(nil), srv.block1...), srv.block2...); !bytes.Equal(got, want) {
		t.Errorf("Get = %d bytes, want %d (the stranger's block must not be in it)", len(got), len(want))
	}
	if err := <-serverErr; err != nil {
		t.Fatalf("server: %v", err)
	}
	if e := <-srv.strangerGot; len(e) < 4 || binary.BigEndian.Uint16(e) != tftpERROR || binary.BigEndian.Uint16(e[2:]) != tftpErrUnknownTID {
		t.Errorf("stranger got %q, want ERROR 5 (unknown transfer ID)", e)
	}
}

// listenLoopbackUDP listens on a free UDP port of 127.0.0.1 until the test ends.
func listenLoopbackUDP(t *testing.T) *net.UDPConn {
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// tftpData is a DATA packet of block n carrying p.
func tftpData(n uint16, p []byte) []byte {
	b := binary.BigEndian.AppendUint16(binary.BigEndian.AppendUint16(nil, tftpDATA), n)
	return append(b, p...)
}

// lossyTFTPServer is a TFTP server that drops the first request and ignores the blksize option,
// sending block1 and block2 from its transfer port, while a stranger injects a block from another.
type lossyTFTPServer struct {
	server, transfer, stranger *net.UDPConn
	block1, block2             []byte
	strangerGot                chan []byte // what the client answered the stranger
}

// ack reads ACK n from the client, skipping repeated ACKs of earlier blocks: the client
// resends one when the next block is slow to come (100ms here), as on a loaded machine.
func (s *lossyTFTPServer) ack(n uint16) error {
	buf := make([]byte, 600)
	for {
		_ = s.transfer.SetReadDeadline(time.Now().Add(30 * time.Second))
		m, _, err := s.transfer.ReadFromUDP(buf)
		if err != nil {
			return fmt.Errorf("no ACK %d: %w", n, err)
		}
		if m == 4 && binary.BigEndian.Uint16(buf) == tftpACK && binary.BigEndian.Uint16(buf[2:]) < n {
			continue
		}
		if !bytes.Equal(buf[:m], binary.BigEndian.AppendUint16([]byte{0, tftpACK}, n)) {
			return fmt.Errorf("want ACK %d, got %q", n, buf[:m])
		}
		return nil
	}
}

// serve answers one transfer of cfg.ign.
func (s *lossyTFTPServer) serve() error {
	buf := make([]byte, 600)
	var client *net.UDPAddr
	for range 2 { // drop the first request
		_ = s.server.SetReadDeadline(time.Now().Add(30 * time.Second))
		n, from, err := s.server.ReadFromUDP(buf)
		if err != nil {
			return err
		}
		if got := string(buf[:n]); !strings.Contains(got, "cfg.ign\x00octet\x00blksize\x001468\x00") {
			return errors.New("bad request " + strconv.Quote(got))
		}
		client = from
	}
	if _, err := s.transfer.WriteToUDP(tftpData(1, s.block1), client); err != nil {
		return err
	}
	if err := s.ack(1); err != nil {
		return err
	}
	// A stranger sends block 2 from another port: the client must refuse it.
	if _, err := s.stranger.WriteToUDP(tftpData(2, []byte("evil")), client); err != nil {
		return err
	}
	_ = s.stranger.SetReadDeadline(time.Now().Add(30 * time.Second))
	n, _, err := s.stranger.ReadFromUDP(buf)
	if err != nil {
		return err
	}
	s.strangerGot <- append([]byte(nil), buf[:n]...)
	if _, err := s.transfer.WriteToUDP(tftpData(2, s.block2), client); err != nil {
		return err
	}
	return s.ack(2)
}
