package bake

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/dsa"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/asn1"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"golang.org/x/crypto/ssh"
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
		"var/roothome/.ssh/id_ed25519":     {Data: []byte(openSSHKeyPEM(t, nil))},
		"usr/share/big.dat":                {Data: big},
		"etc/kiln/bootstrap-token":         {Data: []byte("abcdef.0123456789abcdef\n")},
		"usr/lib/kiln/templates/join.tmpl": {Data: []byte("line one\n  token: \"07401b.f395accd246ae52d\"\n")},
		"etc/kubernetes/tokens.csv":        {Data: []byte("x,y\nabcdef.0123456789abcdef,kubelet-bootstrap,10001\n" + ec)},
		// Not secrets:
		"usr/bin/kubelet":            {Data: []byte("\x00pem: -----BEGIN RSA PRIVATE KEY-----\x00format\x00abcdef.0123456789abcdef\x00")},
		"usr/share/doc/tls.md":       {Data: []byte("Keys start with `-----BEGIN PRIVATE KEY-----` and end with -----END PRIVATE KEY-----.\n")},
		"usr/lib/libgnutls.so.30":    {Data: append(program(t), ec...)},
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
		{"/etc/kiln/bootstrap-token", 1, "Kubernetes bootstrap token", ""},
		{"/etc/kubernetes/tokens.csv", 2, "Kubernetes bootstrap token", ""},
		{"/etc/kubernetes/tokens.csv", 3, "private key (EC PRIVATE KEY)", ""},
		{"/etc/ssh/ssh_host_ecdsa_key", 1, "private key (EC PRIVATE KEY)", ""},
		{"/etc/ssl/private/snakeoil.key", 2, "private key (PRIVATE KEY)", ""},
		{"/usr/lib/kiln/templates/join.tmpl", 2, "Kubernetes bootstrap token", ""},
		{"/usr/share/big.dat", bigLine, "private key (EC PRIVATE KEY)", ""},
		{"/var/roothome/.ssh/id_ed25519", 1, "OpenSSH private key", ""},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("findings:\n got %v\nwant %v", got, want)
	}
}

// TestScanSecretsChunkBoundaries moves a token and a key across the offsets around the
// scanner's chunk boundaries (where a window's judged part ends, and where it ends): each must
// be found exactly once, at the right line.
func TestScanSecretsChunkBoundaries(t *testing.T) {
	ec := ecKeyPEM(t, "EC PRIVATE KEY")
	for _, secret := range []struct{ text, kind string }{
		{"abcdef.0123456789abcdef", "Kubernetes bootstrap token"},
		{ec, "private key (EC PRIVATE KEY)"},
	} {
		for _, edge := range []int{0, scanLookbehind, scanLookahead, scanLookahead + scanLookbehind} {
			for shift := edge - len(secret.text) - 20; shift <= edge+20; shift += 3 {
				pad := scanChunk + shift
				data := append(bytes.Repeat([]byte("x\n"), pad/2), ' ')
				data = append(append(data, secret.text...), " trailing\n"...)
				got, err := ScanSecrets(fstest.MapFS{"etc/f": {Data: data}})
				if err != nil {
					t.Fatal(err)
				}
				want := []Finding{{"/etc/f", pad/2 + 1, secret.kind, ""}}
				if !reflect.DeepEqual(got, want) {
					t.Fatalf("%s at offset %d: got %v, want %v", secret.kind, len(data)-len(secret.text), got, want)
				}
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

// openSSHKeyPEM is a fresh ed25519 key as ssh-keygen writes it, encrypted (aes256-ctr, bcrypt)
// when passphrase is set.
func openSSHKeyPEM(t *testing.T, passphrase []byte) string {
	t.Helper()
	_, k, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	var b *pem.Block
	if passphrase == nil {
		b, err = ssh.MarshalPrivateKey(k, "root@node")
	} else {
		b, err = ssh.MarshalPrivateKeyWithPassphrase(k, "root@node", passphrase)
	}
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(b))
}

func pemString(typ string, der []byte) string {
	return string(pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}))
}

// dsaKeyPEM is a fresh DSA key in OpenSSL's "DSA PRIVATE KEY" form.
func dsaKeyPEM(t *testing.T) string {
	t.Helper()
	var k dsa.PrivateKey
	if err := dsa.GenerateParameters(&k.Parameters, rand.Reader, dsa.L1024N160); err != nil {
		t.Fatal(err)
	}
	if err := dsa.GenerateKey(&k, rand.Reader); err != nil {
		t.Fatal(err)
	}
	der, err := asn1.Marshal(struct {
		Version       int
		P, Q, G, Y, X *big.Int
	}{0, k.P, k.Q, k.G, k.Y, k.X})
	if err != nil {
		t.Fatal(err)
	}
	return pemString("DSA PRIVATE KEY", der)
}

// encryptedPKCS8PEM encrypts a PKCS #8 key as `openssl pkcs8 -topk8 -v2 aes-256-cbc` does:
// PBES2, PBKDF2 with HMAC-SHA256, AES-256-CBC.
func encryptedPKCS8PEM(t *testing.T, pkcs8 []byte, passphrase string) string {
	t.Helper()
	salt, iv := make([]byte, 16), make([]byte, aes.BlockSize)
	rand.Read(salt)
	rand.Read(iv)
	const iterations = 2048
	key, err := pbkdf2.Key(sha256.New, passphrase, salt, iterations, 32)
	if err != nil {
		t.Fatal(err)
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		t.Fatal(err)
	}
	pad := aes.BlockSize - len(pkcs8)%aes.BlockSize
	data := append(bytes.Clone(pkcs8), bytes.Repeat([]byte{byte(pad)}, pad)...)
	cipher.NewCBCEncrypter(block, iv).CryptBlocks(data, data)
	type algorithm struct {
		OID    asn1.ObjectIdentifier
		Params asn1.RawValue
	}
	raw := func(v any) asn1.RawValue {
		b, err := asn1.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return asn1.RawValue{FullBytes: b}
	}
	kdf := algorithm{asn1.ObjectIdentifier{1, 2, 840, 113549, 1, 5, 12}, raw(struct {
		Salt       []byte
		Iterations int
		PRF        algorithm
	}{salt, iterations, algorithm{asn1.ObjectIdentifier{1, 2, 840, 113549, 2, 9}, asn1.NullRawValue}})}
	scheme := algorithm{asn1.ObjectIdentifier{2, 16, 840, 1, 101, 3, 4, 1, 42}, raw(iv)}
	der, err := asn1.Marshal(struct {
		Algorithm algorithm
		Data      []byte
	}{algorithm{asn1.ObjectIdentifier{1, 2, 840, 113549, 1, 5, 13}, raw(struct{ KDF, Scheme algorithm }{kdf, scheme})}, data})
	if err != nil {
		t.Fatal(err)
	}
	return pemString("ENCRYPTED PRIVATE KEY", der)
}

// indent prefixes every line of s.
func indent(prefix, s string) string {
	return prefix + strings.ReplaceAll(strings.TrimSuffix(s, "\n"), "\n", "\n"+prefix) + "\n"
}

// cloudInitExample is the shape of cloud-init's module documentation (cc_ssh.py): a config
// example whose key is its first line (keyLine) and an ellipsis; and the same docstring
// compiled into a CPython 3.11 .pyc.
func cloudInitExample(keyLine string) (doc string, pyc []byte) {
	example := "    Example:\n        ssh_keys:\n          rsa_private: |\n" +
		"            -----BEGIN RSA PRIVATE KEY-----\n            " + keyLine + "\n            ...\n" +
		"            -----END RSA PRIVATE KEY-----\n          rsa_public: ssh-rsa AAAAB3NzaC1yc2EAAAABIwAAAGEAoPRhIfLvedSDKw7Xd ...\n"
	// The .pyc: magic, flags, mtime, size, then the marshalled module code whose constants
	// hold the docstring (a short ASCII string: type 'z', one length byte... here the long
	// form 'a' with a 4-byte length) and the code around it.
	doc = "Set up SSH keys.\n\n" + example
	pyc = []byte("\xa7\x0d\x0d\x0a\x00\x00\x00\x00\x10\x32\x9a\x65\x2e\x14\x00\x00\xe3\x00\x00\x00\x00\x00\x00\x00")
	pyc = append(pyc, 'a', byte(len(doc)), byte(len(doc)>>8), 0, 0)
	pyc = append(pyc, doc...)
	pyc = append(pyc, "\xda\x07__doc__\xe9\x00\x00\x00\x00N)\x03\xda\x02os\x97\x00d\x00Z\x00"...)
	return doc, pyc
}

// TestScanSecretsKeys: what parses as a key is reported, however it is embedded in a file;
// a PEM header with something else after it (cloud-init's documentation: a key shortened with
// "...", code naming the header) is not, in source or in compiled Python.
func TestScanSecretsKeys(t *testing.T) {
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	rsaPEM := pemString("RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(rsaKey))
	_, edKey, _ := ed25519.GenerateKey(rand.Reader)
	ed8, err := x509.MarshalPKCS8PrivateKey(edKey)
	if err != nil {
		t.Fatal(err)
	}
	//lint:ignore SA1019 the legacy encryption is what old tools wrote; the guard must know it.
	legacy, err := x509.EncryptPEMBlock(rand.Reader, "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(rsaKey), []byte("secret"), x509.PEMCipherAES256)
	if err != nil {
		t.Fatal(err)
	}
	ecPEM := ecKeyPEM(t, "EC PRIVATE KEY")
	jsonKey, _ := json.Marshal(map[string]string{"key": ecPEM})
	rsaLines := strings.Split(rsaPEM, "\n")
	doc, pyc := cloudInitExample(rsaLines[1])
	random := make([]byte, 600)
	rand.Read(random)

	for _, tc := range []struct {
		name, path, data string
		line             int // of the finding; 0: none
		kind             string
	}{
		{"RSA (PKCS #1)", "etc/ssl/private/node.key", rsaPEM, 1, "private key (RSA PRIVATE KEY)"},
		{"EC (SEC 1)", "etc/ssh/ssh_host_ecdsa_key", ecPEM, 1, "private key (EC PRIVATE KEY)"},
		{"ed25519 (PKCS #8)", "etc/kubernetes/pki/sa.key", pemString("PRIVATE KEY", ed8), 1, "private key (PRIVATE KEY)"},
		{"DSA", "etc/ssh/ssh_host_dsa_key", dsaKeyPEM(t), 1, "private key (DSA PRIVATE KEY)"},
		{"OpenSSH", "root/.ssh/id_ed25519", openSSHKeyPEM(t, nil), 1, "OpenSSH private key"},
		{"OpenSSH, passphrase", "root/.ssh/id_deploy", openSSHKeyPEM(t, []byte("secret")), 1, "OpenSSH private key"},
		{"PKCS #8 encrypted", "opt/app/key.pem", encryptedPKCS8PEM(t, ed8, "secret"), 1, "private key (ENCRYPTED PRIVATE KEY)"},
		{"RSA, legacy encryption", "opt/app/legacy.pem", string(pem.EncodeToMemory(legacy)), 1, "private key (RSA PRIVATE KEY)"},
		{"CRLF line ends", "srv/key.pem", strings.ReplaceAll(rsaPEM, "\n", "\r\n"), 1, "private key (RSA PRIVATE KEY)"},
		{"indented in a cloud-config", "etc/cloud/cloud.cfg.d/99-keys.cfg",
			"#cloud-config\nssh_keys:\n  rsa_private: |\n" + indent("    ", rsaPEM), 4, "private key (RSA PRIVATE KEY)"},
		{"escaped in a JSON string", "etc/app/config.json", "{\n  \"name\": \"x\",\n  " + string(jsonKey[1:]), 3, "private key (EC PRIVATE KEY)"},
		{"commented out", "etc/app/app.conf", "# old key:\n" + indent("# ", ecPEM), 2, "private key (EC PRIVATE KEY)"},
		{"quoted lines in code", "opt/app/key.py", "KEY = (\n" + indent("    ", `"`+strings.ReplaceAll(strings.TrimSuffix(ecPEM, "\n"), "\n", `\n"`+"\n"+`"`)+`\n"`) + ")\n", 2, "private key (EC PRIVATE KEY)"},

		// Not keys.
		{"cloud-init's shortened example", "usr/lib/python3/dist-packages/cloudinit/config/cc_ssh.py", `"""` + doc + `"""` + "\n", 0, ""},
		{"the same example compiled", "usr/lib/python3/dist-packages/cloudinit/config/__pycache__/cc_ssh.cpython-311.pyc", string(pyc), 0, ""},
		{"code naming the header", "usr/lib/python3/dist-packages/app/pem.py",
			"BEGIN = \"-----BEGIN RSA PRIVATE KEY-----\"\nEND = \"-----END RSA PRIVATE KEY-----\"\n\ndef is_key(s):\n    return s.startswith(\"-----BEGIN RSA PRIVATE KEY-----\")\n", 0, ""},
		{"a placeholder", "usr/lib/python3/dist-packages/cloudinit/config/cc_salt_minion.py",
			"          private_key: |\n            -----BEGIN PRIVATE KEY-----\n            <key data>\n            -----END PRIVATE KEY-----\n", 0, ""},
		{"base64 that is no key", "usr/share/app/fixture.pem", pemString("RSA PRIVATE KEY", random), 0, ""},
		{"a key cut short", "usr/share/app/partial.pem", strings.Join(rsaLines[:10], "\n") + "\n", 0, ""},
		{"an OpenSSH key's public part only", "etc/app/fake", pemString("OPENSSH PRIVATE KEY", []byte("openssh-key-v1\x00\x00\x00\x00\x04none")), 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ScanSecrets(fstest.MapFS{tc.path: {Data: []byte(tc.data)}})
			if err != nil {
				t.Fatal(err)
			}
			var want []Finding
			if tc.line != 0 {
				want = []Finding{{"/" + tc.path, tc.line, tc.kind, ""}}
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("findings in\n%s\n got %v\nwant %v", tc.data, got, want)
			}
		})
	}
}
