// Package provenance signs and checks what a bake made: an in-toto Statement (v1) whose
// predicate is SLSA Provenance v1 — what went in (the definition and lock files, the base, every
// artifact and image, kiln's own binaries) and who built it (kiln and its version) — naming every
// output with its sha256 as a subject, in a DSSE envelope signed with an ed25519 or ECDSA P-256
// key. The formats are the ecosystem's, so sigstore's and in-toto's tools read the envelope too.
package provenance

import (
	"bytes"
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
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// The types and URIs of the formats.
const (
	StatementType  = "https://in-toto.io/Statement/v1"
	PredicateType  = "https://slsa.dev/provenance/v1"
	PayloadType    = "application/vnd.in-toto+json"
	BuildType      = "https://github.com/kilnproject/kiln/bake/v1"
	BuilderID      = "https://github.com/kilnproject/kiln"
	EnvelopeSuffix = ".intoto.jsonl"
)

// Statement is an in-toto Statement v1 with an SLSA Provenance v1 predicate.
type Statement struct {
	Type          string     `json:"_type"`
	Subject       []Subject  `json:"subject"`
	PredicateType string     `json:"predicateType"`
	Predicate     Provenance `json:"predicate"`
}

// Subject is one output: its file name and digest.
type Subject struct {
	Name   string            `json:"name"`
	Digest map[string]string `json:"digest"`
}

// Provenance is the SLSA Provenance v1 predicate.
type Provenance struct {
	BuildDefinition BuildDefinition `json:"buildDefinition"`
	RunDetails      RunDetails      `json:"runDetails"`
}

// BuildDefinition says what was built from what.
type BuildDefinition struct {
	BuildType            string               `json:"buildType"`
	ExternalParameters   map[string]string    `json:"externalParameters"`
	InternalParameters   map[string]string    `json:"internalParameters,omitempty"`
	ResolvedDependencies []ResourceDescriptor `json:"resolvedDependencies"`
}

// ResourceDescriptor is one input, by name or URI and digest.
type ResourceDescriptor struct {
	Name   string            `json:"name,omitempty"`
	URI    string            `json:"uri,omitempty"`
	Digest map[string]string `json:"digest"`
}

// RunDetails says who built it.
type RunDetails struct {
	Builder Builder `json:"builder"`
}

// Builder is the tool that built it.
type Builder struct {
	ID      string            `json:"id"`
	Version map[string]string `json:"version,omitempty"`
}

// NewStatement is a statement of subjects made by kiln (version) from params and deps.
func NewStatement(subjects []Subject, params map[string]string, deps []ResourceDescriptor, kilnVersion string) Statement {
	return Statement{Type: StatementType, Subject: subjects, PredicateType: PredicateType, Predicate: Provenance{
		BuildDefinition: BuildDefinition{BuildType: BuildType, ExternalParameters: params, ResolvedDependencies: deps},
		RunDetails:      RunDetails{Builder: Builder{ID: BuilderID, Version: map[string]string{"kiln": kilnVersion}}},
	}}
}

// SHA256 is a digest map of one sha256 (hex).
func SHA256(hexSum string) map[string]string { return map[string]string{"sha256": hexSum} }

// Envelope is a DSSE envelope.
type Envelope struct {
	PayloadType string      `json:"payloadType"`
	Payload     string      `json:"payload"`
	Signatures  []Signature `json:"signatures"`
}

// Signature is one signature of a DSSE envelope.
type Signature struct {
	KeyID string `json:"keyid,omitempty"`
	Sig   string `json:"sig"`
}

// PAE is DSSE's pre-authentication encoding of a payload, what is signed.
func PAE(payloadType string, payload []byte) []byte {
	var b bytes.Buffer
	b.WriteString("DSSEv1 ")
	b.WriteString(strconv.Itoa(len(payloadType)))
	b.WriteByte(' ')
	b.WriteString(payloadType)
	b.WriteByte(' ')
	b.WriteString(strconv.Itoa(len(payload)))
	b.WriteByte(' ')
	b.Write(payload)
	return b.Bytes()
}

// Sign puts st in an envelope signed with key (ed25519 or ECDSA P-256) and returns the
// envelope as one line of JSON (the .intoto.jsonl form) with a final newline.
func Sign(st Statement, key crypto.Signer) ([]byte, error) {
	payload, err := json.Marshal(st)
	if err != nil {
		return nil, err
	}
	sig, err := sign(key, PAE(PayloadType, payload))
	if err != nil {
		return nil, err
	}
	// No key ID: DSSE's is an unauthenticated hint whose form each tool derives its own way
	// (in-toto's from its key format, cosign's empty); a verifier then tries its key.
	env := Envelope{PayloadType: PayloadType, Payload: base64.StdEncoding.EncodeToString(payload),
		Signatures: []Signature{{Sig: base64.StdEncoding.EncodeToString(sig)}}}
	out, err := json.Marshal(env)
	if err != nil {
		return nil, err
	}
	return append(out, '\n'), nil
}

func sign(key crypto.Signer, msg []byte) ([]byte, error) {
	switch k := key.(type) {
	case ed25519.PrivateKey:
		return ed25519.Sign(k, msg), nil
	case *ecdsa.PrivateKey:
		if k.Curve != elliptic.P256() {
			return nil, errors.New("ECDSA key: only P-256 is supported")
		}
		h := sha256.Sum256(msg)
		return ecdsa.SignASN1(rand.Reader, k, h[:])
	default:
		return nil, fmt.Errorf("%T: only ed25519 and ECDSA P-256 keys sign", key)
	}
}

// ErrBadSignature says that no signature of an envelope verifies with the key.
var ErrBadSignature = errors.New("no signature verifies with the key")

// Verify checks that one of the envelope's signatures (data, one JSON line) verifies with
// pub and returns its statement.
func Verify(data []byte, pub crypto.PublicKey) (*Statement, error) {
	var env Envelope
	if err := json.Unmarshal(bytes.TrimSpace(data), &env); err != nil {
		return nil, fmt.Errorf("not a DSSE envelope: %w", err)
	}
	if env.PayloadType != PayloadType {
		return nil, fmt.Errorf("payload type %q, want %q", env.PayloadType, PayloadType)
	}
	payload, err := base64.StdEncoding.DecodeString(env.Payload)
	if err != nil {
		return nil, fmt.Errorf("payload: %w", err)
	}
	msg := PAE(env.PayloadType, payload)
	ok := false
	for _, s := range env.Signatures {
		sig, err := base64.StdEncoding.DecodeString(s.Sig)
		if err != nil {
			continue
		}
		switch k := pub.(type) {
		case ed25519.PublicKey:
			ok = ed25519.Verify(k, msg, sig)
		case *ecdsa.PublicKey:
			h := sha256.Sum256(msg)
			ok = ecdsa.VerifyASN1(k, h[:], sig)
		default:
			return nil, fmt.Errorf("%T: only ed25519 and ECDSA P-256 keys verify", pub)
		}
		if ok {
			break
		}
	}
	if !ok {
		return nil, ErrBadSignature
	}
	var st Statement
	if err := json.Unmarshal(payload, &st); err != nil {
		return nil, fmt.Errorf("statement: %w", err)
	}
	if st.Type != StatementType || st.PredicateType != PredicateType {
		return nil, fmt.Errorf("statement of type %q with a %q predicate, want %q and %q", st.Type, st.PredicateType, StatementType, PredicateType)
	}
	return &st, nil
}

// LoadPrivateKey reads a PEM private key: PKCS#8 (ed25519 or ECDSA P-256) or SEC 1 ("EC
// PRIVATE KEY", P-256), as openssl genpkey writes them.
func LoadPrivateKey(path string) (crypto.Signer, error) {
	block, err := readPEM(path)
	if err != nil {
		return nil, err
	}
	var key any
	switch block.Type {
	case "PRIVATE KEY":
		key, err = x509.ParsePKCS8PrivateKey(block.Bytes)
	case "EC PRIVATE KEY":
		key, err = x509.ParseECPrivateKey(block.Bytes)
	default:
		return nil, fmt.Errorf("%s: a PEM %q block, want a PRIVATE KEY (PKCS#8) or EC PRIVATE KEY", path, block.Type)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	switch k := key.(type) {
	case ed25519.PrivateKey:
		return k, nil
	case *ecdsa.PrivateKey:
		if k.Curve != elliptic.P256() {
			return nil, fmt.Errorf("%s: an ECDSA key on %s, want P-256", path, k.Curve.Params().Name)
		}
		return k, nil
	default:
		return nil, fmt.Errorf("%s: a %T key, want ed25519 or ECDSA P-256", path, key)
	}
}

// LoadPublicKey reads a PEM public key (PKIX, "PUBLIC KEY"): ed25519 or ECDSA P-256.
func LoadPublicKey(path string) (crypto.PublicKey, error) {
	block, err := readPEM(path)
	if err != nil {
		return nil, err
	}
	if block.Type != "PUBLIC KEY" {
		return nil, fmt.Errorf("%s: a PEM %q block, want a PUBLIC KEY", path, block.Type)
	}
	key, err := x509.ParsePKIXPublicKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	switch k := key.(type) {
	case ed25519.PublicKey:
		return k, nil
	case *ecdsa.PublicKey:
		if k.Curve != elliptic.P256() {
			return nil, fmt.Errorf("%s: an ECDSA key on %s, want P-256", path, k.Curve.Params().Name)
		}
		return k, nil
	default:
		return nil, fmt.Errorf("%s: a %T key, want ed25519 or ECDSA P-256", path, key)
	}
}

func readPEM(path string) (*pem.Block, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	block, _ := pem.Decode(data)
	if block == nil {
		return nil, fmt.Errorf("%s: no PEM block", path)
	}
	return block, nil
}

// SubjectSHA256 returns the sha256 the statement records for the subject name.
func (s *Statement) SubjectSHA256(name string) (string, bool) {
	for _, sub := range s.Subject {
		if sub.Name == name {
			return sub.Digest["sha256"], true
		}
	}
	return "", false
}

// Signed is an image's provenance, checked: its statement and the sha256 of the envelope file,
// the digest a published image records so the provenance it was checked against can be found
// again.
type Signed struct {
	Statement *Statement
	File      string // the envelope's path
	SHA256    string // hex digest of the envelope file's bytes
}

// VerifyImage checks the provenance of the image whose metadata (<image>-<role>.json) is at
// mdPath and holds mdData: that <image>-<role>.intoto.jsonl beside it is signed by pub and
// names the metadata, with these bytes' sha256, as a subject. Every file the metadata records
// with its sha256 is then as signed as the metadata is: a caller that checks a file against the
// metadata's digest before using it needs no more. Errors name the envelope and what failed.
func VerifyImage(mdPath string, mdData []byte, pub crypto.PublicKey) (*Signed, error) {
	base := filepath.Base(mdPath)
	if filepath.Ext(base) != ".json" {
		return nil, fmt.Errorf("%s: not an image's metadata (<image>-<role>.json)", mdPath)
	}
	env := filepath.Join(filepath.Dir(mdPath), strings.TrimSuffix(base, ".json")+EnvelopeSuffix)
	data, err := os.ReadFile(env)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%s: no signed provenance beside it (%s): bake with --sign-key", mdPath, filepath.Base(env))
	}
	if err != nil {
		return nil, fmt.Errorf("provenance: %w", err)
	}
	st, err := Verify(data, pub)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", env, err)
	}
	sum := sha256.Sum256(mdData)
	got := hex.EncodeToString(sum[:])
	want, ok := st.SubjectSHA256(base)
	switch {
	case !ok:
		return nil, fmt.Errorf("%s: does not name %s among its subjects", env, base)
	case want != got:
		return nil, fmt.Errorf("%s: sha256 %s, the provenance %s says %s: the metadata changed since it was signed", mdPath, got, filepath.Base(env), want)
	}
	es := sha256.Sum256(data)
	return &Signed{Statement: st, File: env, SHA256: hex.EncodeToString(es[:])}, nil
}
