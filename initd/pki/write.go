package pki

import (
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"

	"github.com/kilnproject/kiln/internal/atomicfile"
)

// File modes kubeadm uses.
const (
	ModeCert   os.FileMode = 0o644
	ModeSecret os.FileMode = 0o600
	modeDir    os.FileMode = 0o755
)

// WriteKeyPair writes <dir>/<name>.key (0600) and <dir>/<name>.crt (0644), each
// atomically, creating directories (0755) as needed; name may hold a directory
// ("etcd/ca"). The key is written first, so a crash between the two leaves a pair that
// does not match and is re-issued. When CertPEM is a "PUBLIC KEY" block (the
// service-account key) it goes to <name>.pub instead of <name>.crt.
func WriteKeyPair(dir, name string, kp KeyPair) error {
	if len(kp.KeyPEM) == 0 || len(kp.CertPEM) == 0 {
		return fmt.Errorf("write %s: empty key pair", filepath.Join(dir, name))
	}
	ext := ".crt"
	if b, _ := pem.Decode(kp.CertPEM); b != nil && b.Type == blockPublic {
		ext = ".pub"
	}
	if err := writeFile(filepath.Join(dir, name+".key"), kp.KeyPEM, ModeSecret); err != nil {
		return err
	}
	return writeFile(filepath.Join(dir, name+ext), kp.CertPEM, ModeCert)
}

// writeFile writes data to path atomically (atomicfile) with mode, creating missing
// parent directories 0755.
func writeFile(path string, data []byte, mode os.FileMode) error {
	return atomicfile.Write(path, data, atomicfile.Options{Mode: mode, DirMode: modeDir})
}
