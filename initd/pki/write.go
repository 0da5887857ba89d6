package pki

import (
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
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
	if err := WriteFile(filepath.Join(dir, name+".key"), kp.KeyPEM, ModeSecret); err != nil {
		return err
	}
	return WriteFile(filepath.Join(dir, name+ext), kp.CertPEM, ModeCert)
}

// WriteFile writes data to path atomically: a temporary file in the same directory,
// fsync'd, given mode, renamed over path, then the directory fsync'd. Missing parent
// directories are created 0755.
func WriteFile(path string, data []byte, mode os.FileMode) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, modeDir); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	tmp := f.Name()
	ok := false
	defer func() {
		if !ok {
			f.Close()
			os.Remove(tmp)
		}
	}()
	// CreateTemp makes the file 0600, so a secret is never readable by others.
	if _, err := f.Write(data); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Chmod(mode); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("write %s: fsync: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	ok = true
	if d, err := os.Open(dir); err == nil {
		err = d.Sync()
		d.Close()
		if err != nil {
			return fmt.Errorf("write %s: fsync directory: %w", path, err)
		}
	}
	return nil
}
