package bake

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"testing/fstest"
	"time"
)

func ecKeyPEM(t *testing.T, typ string) string {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	var der []byte
	if typ == "PRIVATE KEY" {
		der, err = x509.MarshalPKCS8PrivateKey(k)
	} else {
		der, err = x509.MarshalECPrivateKey(k)
	}
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}))
}

// openSSHKey has the shape of `ssh-keygen -t ed25519` output (the body is made up).
const openSSHKey = `-----BEGIN OPENSSH PRIVATE KEY-----
b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW
QyNTUxOQAAACBfakefakefakefakefakefakefakefakefakefakefakefakeAAAAJjfake
-----END OPENSSH PRIVATE KEY-----
`

func TestScanSecrets(t *testing.T) {
	ec := ecKeyPEM(t, "EC PRIVATE KEY")
	pkcs8 := ecKeyPEM(t, "PRIVATE KEY")
	// A key straddling the 1 MiB chunk boundary of the scanner, in a binary-looking file.
	big := bytes.Repeat([]byte{0x7e, 'E', 'L', 'F', 0, '\n'}, (scanChunk-20)/6)
	big = append(big, []byte(ec)...)
	big = append(big, bytes.Repeat([]byte{0}, 3*scanChunk)...)
	bigLine := bytes.Count(big[:bytes.Index(big, []byte("-----BEGIN"))], []byte("\n")) + 1

	files := fstest.MapFS{
		"etc/ssh/ssh_host_ecdsa_key":       {Data: []byte(ec)},
		"etc/ssl/private/snakeoil.key":     {Data: []byte("# comment\n" + pkcs8)},
		"var/roothome/.ssh/id_ed25519":     {Data: []byte(openSSHKey)},
		"usr/share/big.dat":                {Data: big},
		"etc/kiln/bootstrap-token":         {Data: []byte("abcdef.0123456789abcdef\n")},
		"usr/lib/kiln/templates/join.tmpl": {Data: []byte("line one\n  token: \"07401b.f395accd246ae52d\"\n")},
		"etc/kubernetes/tokens.csv":        {Data: []byte("x,y\nabcdef.0123456789abcdef,kubelet-bootstrap,10001\n" + ec)},
		// Not secrets:
		"usr/bin/kubelet":            {Data: []byte("\x00pem: -----BEGIN RSA PRIVATE KEY-----\x00format\x00abcdef.0123456789abcdef\x00")},
		"usr/share/doc/tls.md":       {Data: []byte("Keys start with `-----BEGIN PRIVATE KEY-----` and end with -----END PRIVATE KEY-----.\n")},
		"usr/lib/libgnutls.so.30":    {Data: []byte("\x7fELF\x02\x01 self-test\x00" + ec)},
		"etc/kiln/token.gz":          {Data: []byte("\x1f\x8b\x08\x00abcdef.0123456789abcdef\n")},
		"etc/ssl/certs/ca.pem":       {Data: []byte("-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIUQ2Zfakefakefakefakefakefakefakefake\n-----END CERTIFICATE-----\n")},
		"etc/hosts":                  {Data: []byte("127.0.0.1 localhost\n10.0.0.1 api.internal.demo.example.com\n")},
		"etc/kiln/not-a-token":       {Data: []byte("Xabcdef.0123456789abcdef abcdef.0123456789abcdefg abcde.0123456789abcdef ABCDEF.0123456789ABCDEF\n")},
		"etc/systemd/system/a.link":  {Data: []byte("abcdef.0123456789abcdef"), Mode: os.ModeSymlink},
		"usr/lib/kiln/images/blob/x": {Data: bytes.Repeat([]byte("abc.def "), 1000)},
	}
	got, err := ScanSecrets(files)
	if err != nil {
		t.Fatal(err)
	}
	want := []Finding{
		{"/etc/kiln/bootstrap-token", 1, "Kubernetes bootstrap token"},
		{"/etc/kubernetes/tokens.csv", 2, "Kubernetes bootstrap token"},
		{"/etc/kubernetes/tokens.csv", 3, "private key (EC PRIVATE KEY)"},
		{"/etc/ssh/ssh_host_ecdsa_key", 1, "private key (EC PRIVATE KEY)"},
		{"/etc/ssl/private/snakeoil.key", 2, "private key (PRIVATE KEY)"},
		{"/usr/lib/kiln/templates/join.tmpl", 2, "Kubernetes bootstrap token"},
		{"/usr/share/big.dat", bigLine, "private key (EC PRIVATE KEY)"},
		{"/var/roothome/.ssh/id_ed25519", 1, "OpenSSH private key"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("findings:\n got %v\nwant %v", got, want)
	}
}

// TestScanSecretsChunkBoundaries moves a token and a key across every offset around the
// scanner's chunk boundary: each must be found exactly once, at the right line.
func TestScanSecretsChunkBoundaries(t *testing.T) {
	ec := ecKeyPEM(t, "RSA PRIVATE KEY") // the type is only a label here
	for _, secret := range []struct{ text, kind string }{
		{"abcdef.0123456789abcdef", "Kubernetes bootstrap token"},
		{ec, "private key (RSA PRIVATE KEY)"},
	} {
		for shift := -scanLookahead - 40; shift <= scanLookbehind+40; shift += 7 {
			pad := scanChunk + shift
			data := append(bytes.Repeat([]byte("x\n"), pad/2), ' ')
			data = append(append(data, secret.text...), " trailing\n"...)
			got, err := ScanSecrets(fstest.MapFS{"etc/f": {Data: data}})
			if err != nil {
				t.Fatal(err)
			}
			want := []Finding{{"/etc/f", pad/2 + 1, secret.kind}}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("%s at offset %d: got %v, want %v", secret.kind, len(data)-len(secret.text), got, want)
			}
		}
	}
}

// TestScanSecretsRealTree measures the scan on a real root tree: KILN_SCAN_TREE=/path/to/tree.
func TestScanSecretsRealTree(t *testing.T) {
	dir := os.Getenv("KILN_SCAN_TREE")
	if dir == "" {
		t.Skip("set KILN_SCAN_TREE to a root tree to measure the scan")
	}
	var files, size int64
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				files++
				size += fi.Size()
			}
		}
		return nil
	})
	start := time.Now()
	got, err := ScanSecrets(os.DirFS(dir))
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("scanned %d files, %d MiB in %s (%.0f MiB/s); findings: %v", files, size>>20, took.Round(time.Millisecond), float64(size>>20)/took.Seconds(), got)
	for _, f := range got {
		if !strings.HasPrefix(f.Path, "/") {
			t.Errorf("finding path %q is not absolute", f.Path)
		}
	}
}
