package provenance

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/secure-systems-lab/go-securesystemslib/dsse"
	"github.com/secure-systems-lab/go-securesystemslib/signerverifier"
)

// writeKeys writes key's private (PKCS#8) and public (PKIX) PEM files, as openssl writes
// them, and returns their paths.
func writeKeys(t *testing.T, key crypto.Signer) (priv, pub string) {
	t.Helper()
	dir := t.TempDir()
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	pubDER, err := x509.MarshalPKIXPublicKey(key.Public())
	if err != nil {
		t.Fatal(err)
	}
	priv, pub = filepath.Join(dir, "key.pem"), filepath.Join(dir, "key.pub")
	os.WriteFile(priv, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600)
	os.WriteFile(pub, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER}), 0o644)
	return priv, pub
}

func testStatement() Statement {
	return NewStatement([]Subject{{Name: "qemu-worker.raw", Digest: SHA256(strings.Repeat("a", 64))}},
		map[string]string{"definition": "images/qemu.yaml", "role": "worker"},
		[]ResourceDescriptor{{Name: "base", URI: "oci:base:bookworm", Digest: SHA256(strings.Repeat("b", 64))}}, "v-test")
}

// A signed statement verifies with its key, with sigstore's DSSE library as with kiln's own
// check, and not with another key or once its payload is changed.
func TestSignAndVerify(t *testing.T) {
	_, edKey, _ := ed25519.GenerateKey(rand.Reader)
	_, edKey2, _ := ed25519.GenerateKey(rand.Reader)
	ecKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	for _, tc := range []struct {
		name string
		key  crypto.Signer
		sv   func(*signerverifier.SSLibKey) (dsse.Verifier, error)
	}{
		{"ed25519", edKey2, func(k *signerverifier.SSLibKey) (dsse.Verifier, error) {
			return signerverifier.NewED25519SignerVerifierFromSSLibKey(k)
		}},
		{"ecdsa p-256", ecKey, func(k *signerverifier.SSLibKey) (dsse.Verifier, error) {
			return signerverifier.NewECDSASignerVerifierFromSSLibKey(k)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			privFile, pubFile := writeKeys(t, tc.key)
			key, err := LoadPrivateKey(privFile)
			if err != nil {
				t.Fatal(err)
			}
			pub, err := LoadPublicKey(pubFile)
			if err != nil {
				t.Fatal(err)
			}
			data, err := Sign(testStatement(), key)
			if err != nil {
				t.Fatal(err)
			}
			if strings.Count(string(data), "\n") != 1 || !strings.HasSuffix(string(data), "}\n") {
				t.Errorf("envelope is not one JSON line: %q", data)
			}
			st, err := Verify(data, pub)
			if err != nil || st.Subject[0].Name != "qemu-worker.raw" || st.Predicate.RunDetails.Builder.Version["kiln"] != "v-test" {
				t.Fatalf("Verify: %+v, %v", st, err)
			}

			// An independent implementation: the DSSE library in-toto and sigstore use.
			pemPub, _ := os.ReadFile(pubFile)
			sslib, err := signerverifier.LoadKey(pemPub)
			if err != nil {
				t.Fatal(err)
			}
			v, err := tc.sv(sslib)
			if err != nil {
				t.Fatal(err)
			}
			ev, err := dsse.NewEnvelopeVerifier(v)
			if err != nil {
				t.Fatal(err)
			}
			var env dsse.Envelope
			if err := json.Unmarshal(data, &env); err != nil {
				t.Fatal(err)
			}
			if _, err := ev.Verify(context.Background(), &env); err != nil {
				t.Errorf("the DSSE library does not verify kiln's envelope: %v", err)
			}
			payload, _ := base64.StdEncoding.DecodeString(env.Payload)
			var raw map[string]any
			if err := json.Unmarshal(payload, &raw); err != nil || raw["_type"] != StatementType || raw["predicateType"] != PredicateType {
				t.Errorf("payload %s", payload)
			}

			// Another key, and a changed payload, do not verify.
			_, otherPub := writeKeys(t, edKey)
			other, _ := LoadPublicKey(otherPub)
			if _, err := Verify(data, other); !errors.Is(err, ErrBadSignature) {
				t.Errorf("another key: %v, want ErrBadSignature", err)
			}
			changed := strings.Replace(string(payload), "qemu-worker.raw", "qemu-worker.evil", 1)
			env.Payload = base64.StdEncoding.EncodeToString([]byte(changed))
			tampered, _ := json.Marshal(env)
			if _, err := Verify(tampered, pub); !errors.Is(err, ErrBadSignature) {
				t.Errorf("changed payload: %v, want ErrBadSignature", err)
			}
		})
	}
}

// Keys kiln cannot sign with are refused when loaded, naming the file.
func TestLoadKeyRefuses(t *testing.T) {
	dir := t.TempDir()
	p384, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	der, _ := x509.MarshalPKCS8PrivateKey(p384)
	for name, tc := range map[string]struct{ file, want string }{
		"p384":     {string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})), "want P-256"},
		"not pem":  {"hello", "no PEM block"},
		"cert pem": {string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte{1}})), `a PEM "CERTIFICATE" block`},
	} {
		p := filepath.Join(dir, name)
		os.WriteFile(p, []byte(tc.file), 0o600)
		if _, err := LoadPrivateKey(p); err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), p) {
			t.Errorf("%s: %v, want an error naming %s and saying %q", name, err, p, tc.want)
		}
	}
}

// VerifyImage accepts an image's metadata only when the envelope beside it is signed by the
// key and names the metadata with these bytes' sha256; it returns the envelope's own digest.
func TestVerifyImage(t *testing.T) {
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	_, other, _ := ed25519.GenerateKey(rand.Reader)
	md := []byte(`{"name":"qemu","role":"worker"}`)
	write := func(t *testing.T, signer crypto.Signer, named string, signed []byte) string {
		dir := t.TempDir()
		sum := sha256.Sum256(signed)
		env, err := Sign(NewStatement([]Subject{{Name: named, Digest: SHA256(hex.EncodeToString(sum[:]))}}, nil, nil, "test"), signer)
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(dir, "qemu-worker"+EnvelopeSuffix), env, 0o644)
		os.WriteFile(filepath.Join(dir, "qemu-worker.json"), md, 0o644)
		return dir
	}
	dir := write(t, key, "qemu-worker.json", md)
	signed, err := VerifyImage(filepath.Join(dir, "qemu-worker.json"), md, key.Public())
	if err != nil {
		t.Fatal(err)
	}
	env, _ := os.ReadFile(filepath.Join(dir, "qemu-worker"+EnvelopeSuffix))
	if sum := sha256.Sum256(env); signed.SHA256 != hex.EncodeToString(sum[:]) || signed.File != filepath.Join(dir, "qemu-worker"+EnvelopeSuffix) {
		t.Errorf("VerifyImage = %+v, want the envelope and its sha256", signed)
	}
	for _, tc := range []struct {
		name string
		dir  string
		md   string
		want string
	}{
		{"no envelope", t.TempDir(), "qemu-worker.json", "no signed provenance beside it (qemu-worker.intoto.jsonl): bake with --sign-key"},
		{"another key", write(t, other, "qemu-worker.json", md), "qemu-worker.json", "no signature verifies with the key"},
		{"metadata not named", write(t, key, "qemu-worker.raw", md), "qemu-worker.json", "does not name qemu-worker.json among its subjects"},
		{"metadata changed", write(t, key, "qemu-worker.json", []byte(`{}`)), "qemu-worker.json", "the metadata changed since it was signed"},
		{"not metadata", dir, "qemu-worker.raw", "not an image's metadata"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := VerifyImage(filepath.Join(tc.dir, tc.md), md, key.Public())
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("VerifyImage = %v, want an error with %q", err, tc.want)
			}
		})
	}
}
