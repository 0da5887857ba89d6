package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha1"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// Validity periods, as kubeadm uses them.
const (
	caValidity   = 10 * 365 * 24 * time.Hour
	leafValidity = 365 * 24 * time.Hour
	// renewBefore: a certificate with less than this left is re-issued.
	renewBefore = 30 * 24 * time.Hour
	// backdate tolerates clocks that lag the machine that signed.
	backdate = 5 * time.Minute
)

// PEM block types.
const (
	blockCert   = "CERTIFICATE"
	blockKey    = "PRIVATE KEY"
	blockPublic = "PUBLIC KEY"
)

// KeyPair is a PEM certificate and its PEM private key (PKCS#8 "PRIVATE KEY"). For the
// service-account key (NewServiceAccountKey) CertPEM is the public key ("PUBLIC KEY").
type KeyPair struct{ CertPEM, KeyPEM []byte }

// CA is a parsed certificate authority.
type CA struct {
	Cert    *x509.Certificate
	Key     crypto.Signer
	CertPEM []byte
}

// Cert describes a leaf certificate to issue.
type Cert struct {
	CommonName   string
	Organization []string
	DNSNames     []string
	IPs          []net.IP
	Server       bool // extended key usage serverAuth
	Client       bool // extended key usage clientAuth
}

func newECKey() (*ecdsa.PrivateKey, error) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate ECDSA P-256 key: %w", err)
	}
	return k, nil
}

func serial() (*big.Int, error) {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("certificate serial: %w", err)
	}
	return n.Add(n, big.NewInt(1)), nil
}

func keyID(pub crypto.PublicKey) ([]byte, error) {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return nil, fmt.Errorf("marshal public key: %w", err)
	}
	sum := sha1.Sum(der)
	return sum[:], nil
}

func encodeKey(k crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return nil, fmt.Errorf("marshal private key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: blockKey, Bytes: der}), nil
}

func encodeCert(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: blockCert, Bytes: der})
}

// NewCA makes a self-signed CA valid for 10 years from now, with an ECDSA P-256 key.
func NewCA(commonName string, now time.Time) (KeyPair, error) {
	if commonName == "" {
		return KeyPair{}, errors.New("new CA: empty common name")
	}
	key, err := newECKey()
	if err != nil {
		return KeyPair{}, fmt.Errorf("new CA %s: %w", commonName, err)
	}
	sn, err := serial()
	if err != nil {
		return KeyPair{}, err
	}
	skid, err := keyID(key.Public())
	if err != nil {
		return KeyPair{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          sn,
		Subject:               pkix.Name{CommonName: commonName},
		NotBefore:             now.Add(-backdate).UTC(),
		NotAfter:              now.Add(caValidity).UTC(),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		SubjectKeyId:          skid,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return KeyPair{}, fmt.Errorf("new CA %s: %w", commonName, err)
	}
	keyPEM, err := encodeKey(key)
	if err != nil {
		return KeyPair{}, err
	}
	return KeyPair{CertPEM: encodeCert(der), KeyPEM: keyPEM}, nil
}

// ParseCertPEM parses the first CERTIFICATE block of data.
func ParseCertPEM(data []byte) (*x509.Certificate, error) {
	for rest := data; ; {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			return nil, errors.New("no CERTIFICATE PEM block")
		}
		if b.Type == blockCert {
			return x509.ParseCertificate(b.Bytes)
		}
	}
}

// parseKeyPEM parses a PEM private key: PKCS#8 "PRIVATE KEY", or the older
// "EC PRIVATE KEY" and "RSA PRIVATE KEY" that other tools (kubeadm, openssl) write.
func parseKeyPEM(data []byte) (crypto.Signer, error) {
	for rest := data; ; {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			return nil, errors.New("no private key PEM block")
		}
		var (
			k   any
			err error
		)
		switch b.Type {
		case blockKey:
			k, err = x509.ParsePKCS8PrivateKey(b.Bytes)
		case "EC PRIVATE KEY":
			k, err = x509.ParseECPrivateKey(b.Bytes)
		case "RSA PRIVATE KEY":
			k, err = x509.ParsePKCS1PrivateKey(b.Bytes)
		default:
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", b.Type, err)
		}
		s, ok := k.(crypto.Signer)
		if !ok {
			return nil, fmt.Errorf("%s: %T is not a signing key", b.Type, k)
		}
		return s, nil
	}
}

type publicKey interface{ Equal(crypto.PublicKey) bool }

// keyMatches reports whether key is the private half of cert's public key.
func keyMatches(cert *x509.Certificate, key crypto.Signer) bool {
	pub, ok := key.Public().(publicKey)
	return ok && pub.Equal(cert.PublicKey)
}

// ParseCA parses a CA key pair and checks that it is a CA and that the key belongs to it.
func ParseCA(kp KeyPair) (*CA, error) {
	cert, err := ParseCertPEM(kp.CertPEM)
	if err != nil {
		return nil, fmt.Errorf("CA certificate: %w", err)
	}
	if !cert.IsCA || cert.KeyUsage&x509.KeyUsageCertSign == 0 {
		return nil, fmt.Errorf("CA certificate %q is not a CA (basic constraints or certSign usage missing)", cert.Subject.CommonName)
	}
	key, err := parseKeyPEM(kp.KeyPEM)
	if err != nil {
		return nil, fmt.Errorf("CA key: %w", err)
	}
	if !keyMatches(cert, key) {
		return nil, fmt.Errorf("CA %q: the key does not match the certificate", cert.Subject.CommonName)
	}
	return &CA{Cert: cert, Key: key, CertPEM: kp.CertPEM}, nil
}

// ReadKeyPair reads <dir>/<name>.crt and <dir>/<name>.key.
func ReadKeyPair(dir, name string) (KeyPair, error) {
	var kp KeyPair
	var err error
	crt, key := filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	if kp.CertPEM, err = os.ReadFile(crt); err != nil {
		return KeyPair{}, err
	}
	if kp.KeyPEM, err = os.ReadFile(key); err != nil {
		return KeyPair{}, err
	}
	return kp, nil
}

// LoadCA reads and parses the CA <dir>/<name>.crt and <dir>/<name>.key.
func LoadCA(dir, name string) (*CA, error) {
	kp, err := ReadKeyPair(dir, name)
	if err != nil {
		return nil, fmt.Errorf("load CA: %w", err)
	}
	ca, err := ParseCA(kp)
	if err != nil {
		return nil, fmt.Errorf("load CA %s: %w", filepath.Join(dir, name+".{crt,key}"), err)
	}
	return ca, nil
}

// Issue makes a leaf certificate signed by ca, valid for a year from now (never past the
// CA's own expiry), with a new ECDSA P-256 key.
func (ca *CA) Issue(c Cert, now time.Time) (KeyPair, error) {
	if c.CommonName == "" {
		return KeyPair{}, errors.New("issue certificate: empty common name")
	}
	if !c.Server && !c.Client {
		return KeyPair{}, fmt.Errorf("issue certificate %s: neither server nor client usage", c.CommonName)
	}
	key, err := newECKey()
	if err != nil {
		return KeyPair{}, fmt.Errorf("issue certificate %s: %w", c.CommonName, err)
	}
	sn, err := serial()
	if err != nil {
		return KeyPair{}, err
	}
	notAfter := now.Add(leafValidity)
	if notAfter.After(ca.Cert.NotAfter) {
		notAfter = ca.Cert.NotAfter
	}
	var eku []x509.ExtKeyUsage
	if c.Server {
		eku = append(eku, x509.ExtKeyUsageServerAuth)
	}
	if c.Client {
		eku = append(eku, x509.ExtKeyUsageClientAuth)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          sn,
		Subject:               pkix.Name{CommonName: c.CommonName, Organization: c.Organization},
		DNSNames:              c.DNSNames,
		IPAddresses:           c.IPs,
		NotBefore:             now.Add(-backdate).UTC(),
		NotAfter:              notAfter.UTC(),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           eku,
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		return KeyPair{}, fmt.Errorf("issue certificate %s: %w", c.CommonName, err)
	}
	keyPEM, err := encodeKey(key)
	if err != nil {
		return KeyPair{}, err
	}
	return KeyPair{CertPEM: encodeCert(der), KeyPEM: keyPEM}, nil
}

// NewServiceAccountKey makes the service-account signing key, RSA 2048 as kubeadm uses.
// KeyPEM is the private key (sa.key), CertPEM the "PUBLIC KEY" PEM (sa.pub).
func NewServiceAccountKey() (KeyPair, error) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return KeyPair{}, fmt.Errorf("generate service-account key: %w", err)
	}
	der, err := x509.MarshalPKIXPublicKey(key.Public())
	if err != nil {
		return KeyPair{}, fmt.Errorf("marshal service-account public key: %w", err)
	}
	keyPEM, err := encodeKey(key)
	if err != nil {
		return KeyPair{}, err
	}
	return KeyPair{CertPEM: pem.EncodeToMemory(&pem.Block{Type: blockPublic, Bytes: der}), KeyPEM: keyPEM}, nil
}
