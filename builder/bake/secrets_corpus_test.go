package bake

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/md5"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"debug/elf"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/kilnproject/kiln/internal/testkit"
)

var (
	programOnce  sync.Once
	programBytes []byte
)

// program is a real ELF program: the test binary.
func program(t *testing.T) []byte {
	t.Helper()
	programOnce.Do(func() {
		exe, err := os.Executable()
		if err == nil {
			programBytes, _ = os.ReadFile(exe)
		}
	})
	if len(programBytes) == 0 {
		t.Fatal("cannot read the test binary")
	}
	return bytes.Clone(programBytes)
}

// programHead is the first 4 MiB of a real program: binary data ahead of a key in a layer,
// of a size that stays within the scan's decompression budget however big the test binary
// grows.
func programHead(t *testing.T) []byte {
	p := program(t)
	return p[:min(len(p), 4<<20)]
}

// rewrap re-wraps a PEM block's base64 at width (0: one line) and ends its lines with eol.
func rewrap(block *pem.Block, width int, eol string) string {
	b64 := base64.StdEncoding.EncodeToString(block.Bytes)
	var lines []string
	for width > 0 && len(b64) > width {
		lines = append(lines, b64[:width])
		b64 = b64[width:]
	}
	lines = append(lines, b64)
	return "-----BEGIN " + block.Type + "-----" + eol + strings.Join(lines, eol) + eol + "-----END " + block.Type + "-----" + eol
}

func testdata(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile("testdata/secrets/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// fakeJWT has a service account token's shape: a JSON header naming its algorithm, claims, a
// signature.
func fakeJWT() string {
	enc := base64.RawURLEncoding.EncodeToString
	sig := make([]byte, 64)
	rand.Read(sig)
	return enc([]byte(`{"alg":"RS256","kid":"x"}`)) + "." + enc([]byte(`{"sub":"system:serviceaccount:kube-system:admin"}`)) + "." + enc(sig)
}

func kubeconfig(user string) string {
	return "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://10.0.0.1:6443\n" +
		"    certificate-authority-data: " + base64.StdEncoding.EncodeToString([]byte("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")) + "\n" +
		"contexts:\n- name: c\n  context: {cluster: c, user: admin}\ncurrent-context: c\nusers:\n- name: admin\n  user:\n" + user
}

// tinyELF is an ELF64 file that debug/elf parses: a header and one loadable segment, payload.
func tinyELF(t *testing.T, payload []byte) []byte {
	t.Helper()
	var b bytes.Buffer
	hdr := elf.Header64{
		Ident: [elf.EI_NIDENT]byte{0x7f, 'E', 'L', 'F', byte(elf.ELFCLASS64), byte(elf.ELFDATA2LSB), byte(elf.EV_CURRENT)},
		Type:  uint16(elf.ET_REL), Machine: uint16(elf.EM_X86_64), Version: uint32(elf.EV_CURRENT),
		Phoff: 64, Ehsize: 64, Phentsize: 56, Phnum: 1,
	}
	prog := elf.Prog64{Type: uint32(elf.PT_LOAD), Flags: uint32(elf.PF_R), Off: 120, Filesz: uint64(len(payload)), Memsz: uint64(len(payload)), Align: 1}
	if err := binary.Write(&b, binary.LittleEndian, hdr); err != nil {
		t.Fatal(err)
	}
	if err := binary.Write(&b, binary.LittleEndian, prog); err != nil {
		t.Fatal(err)
	}
	b.Write(payload)
	if _, err := elf.NewFile(bytes.NewReader(b.Bytes())); err != nil {
		t.Fatalf("tinyELF: %v", err)
	}
	return b.Bytes()
}

// secretMaterial is one real secret of each form the guard knows, and documents that
// carry them, made fresh for a test.
type secretMaterial struct {
	rsaKey                       *rsa.PrivateKey
	rsaBlock, legacy, encBlock   *pem.Block
	pkcs1, sec1, pkcs8, pkcs8RSA []byte
	pubDER, certDER              []byte
	ecPEM, encPEM, secretYAML    string
	secretJSON, kubeJSON         []byte
}

// newSecretKeys makes the keys, their encodings, a public key and a certificate.
func newSecretKeys(t *testing.T) *secretMaterial {
	t.Helper()
	m := &secretMaterial{}
	var err error
	if m.rsaKey, err = rsa.GenerateKey(rand.Reader, 2048); err != nil {
		t.Fatal(err)
	}
	m.pkcs1 = x509.MarshalPKCS1PrivateKey(m.rsaKey)
	m.rsaBlock = &pem.Block{Type: "RSA PRIVATE KEY", Bytes: m.pkcs1}
	ecKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	if m.sec1, err = x509.MarshalECPrivateKey(ecKey); err != nil {
		t.Fatal(err)
	}
	_, edKey, _ := ed25519.GenerateKey(rand.Reader)
	if m.pkcs8, err = x509.MarshalPKCS8PrivateKey(edKey); err != nil {
		t.Fatal(err)
	}
	if m.pkcs8RSA, err = x509.MarshalPKCS8PrivateKey(m.rsaKey); err != nil {
		t.Fatal(err)
	}
	m.ecPEM = pemString("EC PRIVATE KEY", m.sec1)
	//lint:ignore SA1019 the legacy encryption is what old tools wrote; the guard must know it.
	m.legacy, err = x509.EncryptPEMBlock(rand.Reader, "RSA PRIVATE KEY", m.pkcs1, []byte("secret"), x509.PEMCipherAES128)
	if err != nil {
		t.Fatal(err)
	}
	m.encPEM = encryptedPKCS8PEM(t, m.pkcs8, "secret")
	m.encBlock, _ = pem.Decode([]byte(m.encPEM))
	if m.pubDER, err = x509.MarshalPKIXPublicKey(&ecKey.PublicKey); err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "node"},
		NotBefore: time.Unix(0, 0), NotAfter: time.Unix(1<<31, 0)}
	if m.certDER, err = x509.CreateCertificate(rand.Reader, tmpl, tmpl, &ecKey.PublicKey, ecKey); err != nil {
		t.Fatal(err)
	}
	return m
}

// newSecretMaterial makes the keys and the Kubernetes documents that carry tokens.
func newSecretMaterial(t *testing.T) *secretMaterial {
	t.Helper()
	m := newSecretKeys(t)
	b64 := base64.StdEncoding.EncodeToString
	m.secretYAML = "apiVersion: v1\nkind: Secret\nmetadata:\n  name: bootstrap-token-07401b\n  namespace: kube-system\n" +
		"type: bootstrap.kubernetes.io/token\ndata:\n  token-id: " + b64([]byte("07401b")) + "\n  token-secret: " + b64([]byte("f395accd246ae52d")) +
		"\n  usage-bootstrap-authentication: " + b64([]byte("true")) + "\n"
	m.secretJSON, _ = json.MarshalIndent(map[string]any{"apiVersion": "v1", "kind": "List", "items": []any{
		map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "metadata": map[string]string{"name": "x"}},
		map[string]any{"apiVersion": "v1", "kind": "Secret", "type": "bootstrap.kubernetes.io/token",
			"metadata": map[string]string{"name": "bootstrap-token-abcdef"}, "stringData": map[string]string{"token-id": "abcdef", "token-secret": "0123456789abcdef"}},
	}}, "", "  ")
	m.kubeJSON, _ = json.Marshal(map[string]any{"apiVersion": "v1", "kind": "Config",
		"clusters": []any{map[string]any{"name": "c", "cluster": map[string]string{"server": "https://10.0.0.1:6443"}}},
		"users":    []any{map[string]any{"name": "kubelet", "user": map[string]string{"token": "abcdef.0123456789abcdef"}}}})
	return m
}

// corpusCase is one file in a tree, and the finding the scan reports in it.
type corpusCase struct {
	name, path string
	data       []byte
	kind, in   string // of the finding; kind "": none
	line       int
}

// secretCorpus is one real secret of each form the guard knows.
func secretCorpus(t *testing.T, m *secretMaterial) []corpusCase {
	b64 := base64.StdEncoding.EncodeToString
	return []corpusCase{
		{"RSA, 64 wide", "etc/ssl/private/node.key", []byte(rewrap(m.rsaBlock, 64, "\n")), "private key (RSA PRIVATE KEY)", "", 1},
		{"RSA, 76 wide", "etc/ssl/private/node76.key", []byte(rewrap(m.rsaBlock, 76, "\n")), "private key (RSA PRIVATE KEY)", "", 1},
		{"RSA, one long line", "opt/app/one.pem", []byte(rewrap(m.rsaBlock, 0, "\n")), "private key (RSA PRIVATE KEY)", "", 1},
		{"RSA, CRLF", "srv/win.pem", []byte(rewrap(m.rsaBlock, 64, "\r\n")), "private key (RSA PRIVATE KEY)", "", 1},
		{"RSA, line ends turned to spaces", "opt/app/env", []byte("KEY=" + rewrap(m.rsaBlock, 64, " ")), "private key (RSA PRIVATE KEY)", "", 1},
		{"EC", "etc/ssh/ssh_host_ecdsa_key", []byte(m.ecPEM), "private key (EC PRIVATE KEY)", "", 1},
		{"PKCS #8", "etc/kubernetes/pki/sa.key", []byte(pemString("PRIVATE KEY", m.pkcs8)), "private key (PRIVATE KEY)", "", 1},
		{"PKCS #8 encrypted", "opt/app/enc.pem", []byte(m.encPEM), "private key (ENCRYPTED PRIVATE KEY)", "", 1},
		{"legacy encrypted PEM", "opt/app/m.legacy.pem", pem.EncodeToMemory(m.legacy), "private key (RSA PRIVATE KEY)", "", 1},
		{"OpenSSH", "root/.ssh/id_ed25519", []byte(openSSHKeyPEM(t, nil)), "OpenSSH private key", "", 1},
		{"PGP", "root/.gnupg/secret.asc", testdata(t, "pgp-secret.asc"), "OpenPGP private key (PGP PRIVATE KEY BLOCK)", "", 1},
		{"PGP, CRLF", "srv/secret.asc", bytes.ReplaceAll(testdata(t, "pgp-secret.asc"), []byte("\n"), []byte("\r\n")), "OpenPGP private key (PGP PRIVATE KEY BLOCK)", "", 1},
		{"gzip", "usr/share/doc/app/key.pem.gz", testkit.Gzip(t, []byte("notes\n"+m.ecPEM)), "private key (EC PRIVATE KEY)", "gzip data", 2},
		{"zstd", "var/backups/key.zst", testkit.Compress(t, "zst", []byte(m.ecPEM)), "private key (EC PRIVATE KEY)", "zstd data", 1},
		{"xz", "var/backups/key.xz", testkit.Compress(t, "xz", []byte(m.ecPEM)), "private key (EC PRIVATE KEY)", "xz data", 1},
		{"an image layer (tar.gz)", "usr/lib/kiln/images/blobs/sha256/0123", testkit.Gzip(t, testkit.Tar(t, testkit.Entry{Name: "bin/app", Body: string(programHead(t))}, testkit.Entry{Name: "etc/app/tls.key", Body: m.ecPEM})),
			"private key (EC PRIVATE KEY)", "gzip data, tar entry etc/app/tls.key", 1},
		{"gzip in xz", "var/backups/key.gz.xz", testkit.Compress(t, "xz", testkit.Gzip(t, []byte(m.ecPEM))), "private key (EC PRIVATE KEY)", "xz data, gzip data", 1},
		{"DER PKCS #1", "etc/app/key.der", m.pkcs1, "private key (RSA, DER)", "", 1},
		{"DER PKCS #8", "etc/app/key8.der", m.pkcs8RSA, "private key (PKCS #8, DER)", "", 1},
		{"DER EC", "etc/app/ec.der", m.sec1, "private key (EC, DER)", "", 1},
		{"DER encrypted PKCS #8", "etc/app/enc.der", m.encBlock.Bytes, "private key (ENCRYPTED PRIVATE KEY, DER)", "", 1},
		{"PKCS #12 (openssl pkcs12 -export)", "etc/app/client.p12", testdata(t, "client.p12"), "PKCS #12 file with a private key", "", 1},
		{"kubeconfig client-key-data", "root/.kube/config", []byte(kubeconfig("    client-certificate-data: " + b64(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: m.certDER})) +
			"\n    client-key-data: " + b64([]byte(m.ecPEM)) + "\n")), "kubeconfig users[0] (admin) client-key-data: a private key", "", 16},
		{"kubeconfig token (JWT)", "home/ops/admin.conf", []byte(kubeconfig("    token: " + fakeJWT() + "\n")), "kubeconfig users[0] (admin) token", "", 15},
		{"kubeconfig in JSON, bootstrap token", "opt/kube/kubelet.json", m.kubeJSON, "kubeconfig users[0] (kubelet) token", "", 1},
		{"bootstrap token Secret (YAML)", "opt/manifests/token.yaml", []byte(m.secretYAML), "Kubernetes bootstrap token Secret (bootstrap-token-07401b)", "", 9},
		{"bootstrap token Secret (JSON List)", "srv/objects.json", m.secretJSON, "Kubernetes bootstrap token Secret (bootstrap-token-abcdef)", "", 19},
		{"bootstrap token in a command line", "opt/join.sh", []byte("#!/bin/sh\nkubeadm join 10.0.0.1:6443 --token abcdef.0123456789abcdef \\\n  --discovery-token-unsafe-skip-ca-verification\n"), "Kubernetes bootstrap token", "", 2},
		{"a key behind ELF magic", "usr/lib/x86_64-linux-gnu/libfake.so", append([]byte("\x7fELF"), m.ecPEM...), "private key (EC PRIVATE KEY)", "", 1},
		{"bootstrap token in a pre-pulled image's etc", "usr/lib/kiln/snapshots/" + strings.Repeat("5e", 32) + "/etc/app/join.conf", []byte("server 10.0.0.1\njoin abcdef.0123456789abcdef\n"), "Kubernetes bootstrap token", "", 2},
		{"a key in a pre-pulled image's data", "usr/lib/kiln/snapshots/" + strings.Repeat("5e", 32) + "/srv/tls.key", []byte(m.ecPEM), "private key (EC PRIVATE KEY)", "", 1},
	}
}

// secretNearMisses are files that look like secrets and are not.
func secretNearMisses(t *testing.T, m *secretMaterial) []corpusCase {
	b64 := base64.StdEncoding.EncodeToString
	return []corpusCase{
		{"PEM header in Python", "usr/lib/python3/dist-packages/app/pem.py", []byte("HEADER = '-----BEGIN RSA PRIVATE KEY-----'\nFOOTER = '-----END RSA PRIVATE KEY-----'\n"), "", "", 0},
		{"PEM headers in Markdown", "usr/share/doc/app/README.md", []byte("A key:\n\n```\n-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjE...\n-----END OPENSSH PRIVATE KEY-----\n```\n\n-----BEGIN PGP PRIVATE KEY BLOCK-----\n...\n-----END PGP PRIVATE KEY BLOCK-----\n"), "", "", 0},
		{"the Markdown gzipped", "usr/share/doc/app/README.md.gz", testkit.Gzip(t, []byte("-----BEGIN PRIVATE KEY-----\n<your key>\n-----END PRIVATE KEY-----\n")), "", "", 0},
		{"a public key", "etc/app/pub.pem", []byte(pemString("PUBLIC KEY", m.pubDER) + pemString("RSA PUBLIC KEY", x509.MarshalPKCS1PublicKey(&m.rsaKey.PublicKey))), "", "", 0},
		{"a certificate", "etc/ssl/certs/node.pem", []byte(pemString("CERTIFICATE", m.certDER)), "", "", 0},
		{"a DER certificate", "usr/share/ca-certificates/node.der", m.certDER, "", "", 0},
		{"a DER public key", "etc/app/pub.der", m.pubDER, "", "", 0},
		{"a PKCS #12 trust store (certificates only)", "etc/ssl/certs/java/cacerts", testdata(t, "truststore.p12"), "", "", 0},
		{"a PGP public key", "usr/share/keyrings/app.asc", testdata(t, "pgp-public.asc"), "", "", 0},
		{"a PGP block of something else", "usr/share/app/x.asc", []byte("-----BEGIN PGP PRIVATE KEY BLOCK-----\n\n" + base64.StdEncoding.EncodeToString(m.pubDER) + "\n-----END PGP PRIVATE KEY BLOCK-----\n"), "", "", 0},
		{"invalid base64 client-key-data", "root/.kube/bad", []byte(kubeconfig("    client-key-data: LS0tLS1CRUdJTi!!!notbase64\n    token: <your token here>\n")), "", "", 0},
		{"client-key-data that is no key", "root/.kube/cert-only", []byte(kubeconfig("    client-key-data: " + b64([]byte("-----BEGIN EC PRIVATE KEY-----\n...\n-----END EC PRIVATE KEY-----\n")) + "\n    token: REDACTED\n")), "", "", 0},
		{"a Secret of another type", "opt/manifests/opaque.yaml", []byte(strings.Replace(m.secretYAML, "bootstrap.kubernetes.io/token", "Opaque", 1)), "", "", 0},
		{"a bootstrap token Secret with placeholders", "opt/manifests/tmpl.yaml", []byte(strings.NewReplacer(b64([]byte("07401b")), "${TOKEN_ID}", b64([]byte("f395accd246ae52d")), "${TOKEN_SECRET}").Replace(m.secretYAML)), "", "", 0},
		{"a token's shape out of context", "usr/share/app/hosts.txt", []byte("mirror abcdef.0123456789abcdef\n"), "", "", 0},
		{"a program carrying a key", "usr/lib/x86_64-linux-gnu/libgnutls.so.30", append(program(t), m.ecPEM...), "", "", 0},
		{"a program compressed (a kernel module)", "usr/lib/modules/6.1.0/kernel/fake.ko.xz", testkit.Compress(t, "xz", tinyELF(t, []byte(m.ecPEM))), "", "", 0},
		{"a pre-pulled image's program with a token's shape", "usr/lib/kiln/snapshots/" + strings.Repeat("5e", 32) + "/usr/local/bin/kube-apiserver", append(program(t), []byte(" abcdef.0123456789abcdef ")...), "", "", 0},
		{"a token's shape in a pre-pulled image's data", "usr/lib/kiln/snapshots/" + strings.Repeat("5e", 32) + "/usr/share/app/hosts.txt", []byte("mirror abcdef.0123456789abcdef\n"), "", "", 0},
		{"corrupt gzip", "usr/share/app/broken.gz", []byte("\x1f\x8b\x08\x00garbage" + m.ecPEM), "", "", 0},
	}
}

// TestScanSecretsCorpus: one real secret of each form the guard knows, each reported with the
// file (and where in it) named in the bake's error; and near misses that are not reported.
func TestScanSecretsCorpus(t *testing.T) {
	m := newSecretMaterial(t)
	// Other findings of a case, sorted before its own.
	also := map[string][]Finding{
		"kubeconfig in JSON, bootstrap token": {{"/opt/kube/kubelet.json", 1, "Kubernetes bootstrap token", ""}},
	}
	for _, tc := range append(secretCorpus(t, m), secretNearMisses(t, m)...) {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ScanSecrets(fstest.MapFS{tc.path: {Data: tc.data}})
			if err != nil {
				t.Fatal(err)
			}
			want := also[tc.name]
			if tc.kind != "" {
				want = append(want, Finding{"/" + tc.path, tc.line, tc.kind, tc.in})
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("findings:\n got %v\nwant %v", got, want)
			}
			if len(got) > 0 {
				if msg := secretsError(got).Error(); !strings.Contains(msg, "/"+tc.path) {
					t.Errorf("the bake's error does not name /%s:\n%s", tc.path, msg)
				}
			}
		})
	}
}

// TestScanSecretsPackagedFiles: a key in a file that a dpkg package installed unchanged (a
// published example, as cloud-init's documentation ships) is not reported; the same file
// changed, or a key in a file no package has, is.
func TestScanSecretsPackagedFiles(t *testing.T) {
	example := []byte("#cloud-config\nssh_keys:\n  rsa_private: |\n" + indent("    ", ecKeyPEM(t, "EC PRIVATE KEY")))
	conf := []byte(ecKeyPEM(t, "EC PRIVATE KEY"))
	sum := func(b []byte) string { s := md5.Sum(b); return hex.EncodeToString(s[:]) }
	files := fstest.MapFS{
		"usr/share/doc/cloud-init/examples/cloud-config-ssh-keys.txt": {Data: example},
		"usr/share/doc/cloud-init/examples/changed.txt":               {Data: append(bytes.Clone(example), '\n')},
		"usr/lib/app/example.key":                                     {Data: example}, // under /lib in the package: merged /usr
		"etc/app/default.key":                                         {Data: conf},
		"etc/ssl/private/node.key":                                    {Data: example},
		"lib":                                                         {Data: []byte("usr/lib"), Mode: os.ModeSymlink},
		"var/lib/dpkg/info/cloud-init.md5sums": {Data: []byte(
			sum(example) + "  usr/share/doc/cloud-init/examples/cloud-config-ssh-keys.txt\n" +
				sum(example) + "  usr/share/doc/cloud-init/examples/changed.txt\n" +
				sum(example) + "  lib/app/example.key\n")},
		"var/lib/dpkg/status": {Data: []byte("Package: app\nStatus: install ok installed\nConffiles:\n /etc/app/default.key " + sum(conf) + "\nDescription: x\n")},
	}
	got, err := ScanSecrets(files)
	if err != nil {
		t.Fatal(err)
	}
	want := []Finding{
		{"/etc/ssl/private/node.key", 4, "private key (EC PRIVATE KEY)", ""},
		{"/usr/share/doc/cloud-init/examples/changed.txt", 4, "private key (EC PRIVATE KEY)", ""},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("findings:\n got %v\nwant %v", got, want)
	}
}
