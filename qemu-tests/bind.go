package qemutests

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// bind is a real BIND (Debian's named) serving one dynamic zone on 127.0.0.1, updated with a
// TSIG key; QEMU's user network shows it to guests at <net>.2.
type bind struct {
	port         int
	zone, secret string
	cmd          *exec.Cmd
	mu           sync.Mutex
	log          bytes.Buffer
}

const bindKey = "kiln-test-key"

func startBIND(t *testing.T, zone string) *bind {
	t.Helper()
	_, err := os.Stat("/usr/sbin/named")
	require(t, err == nil, "named not installed (Debian package bind9)")
	_, err = exec.LookPath("dig")
	require(t, err == nil, "dig not installed (Debian package bind9-dnsutils)")
	dir := t.TempDir()
	key := make([]byte, 32)
	rand.Read(key)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &bind{port: l.Addr().(*net.TCPAddr).Port, zone: zone, secret: base64.StdEncoding.EncodeToString(key)}
	l.Close()
	conf := fmt.Sprintf(`controls { };
options { directory %q; listen-on port %d { 127.0.0.1; }; listen-on-v6 { none; };
  pid-file %q; session-keyfile %q; recursion no; dnssec-validation no; };
key %q { algorithm hmac-sha256; secret %q; };
zone %q { type primary; file %q; allow-update { key %q; }; };
`, dir, b.port, filepath.Join(dir, "named.pid"), filepath.Join(dir, "session.key"), bindKey, b.secret,
		zone, filepath.Join(dir, "zone.db"), bindKey)
	db := fmt.Sprintf("$TTL 60\n@ IN SOA ns.%[1]s. admin.%[1]s. 1 3600 600 86400 60\n@ IN NS ns.%[1]s.\nns IN A 127.0.0.1\n", zone)
	os.WriteFile(filepath.Join(dir, "named.conf"), []byte(conf), 0o644)
	os.WriteFile(filepath.Join(dir, "zone.db"), []byte(db), 0o644)
	args := []string{"-g", "-c", filepath.Join(dir, "named.conf")}
	if os.Geteuid() == 0 {
		args = append(args, "-u", "root")
	}
	b.cmd = exec.Command("/usr/sbin/named", args...)
	b.cmd.Stdout, b.cmd.Stderr = &b.log, &b.log
	if err := b.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		b.cmd.Process.Kill()
		b.cmd.Wait()
	})
	for deadline := time.Now().Add(30 * time.Second); ; {
		if out, _ := b.dig("ns." + zone); out == "127.0.0.1" {
			return b
		}
		if time.Now().After(deadline) {
			t.Fatalf("named did not answer:\n%s", b.log.String())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// dig asks BIND for name's A records, as an operator would.
func (b *bind) dig(name string) (string, error) {
	out, err := exec.Command("dig", "@127.0.0.1", "-p", fmt.Sprint(b.port), name, "A", "+short", "+tries=1", "+time=2").Output()
	return strings.TrimSpace(string(out)), err
}
