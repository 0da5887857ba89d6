package firstboot

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kilnproject/kiln/initd/source"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

// TestAttackStatusLeaksSecretDigest: status.json lists the SHA-256 of every file the
// config wrote. For a short secret (a token, a password) that digest gives the secret
// away to anyone who can read the file, so only root may read it: on a fresh first boot,
// and on a node whose status.json an older kiln left world-readable.
func TestAttackStatusLeaksSecretDigest(t *testing.T) {
	cfg := ignition(`{"path":"/etc/kiln/token","mode":384,"contents":{"source":"data:,s3cr3t"}}`)
	tests := []struct {
		name string
		// before prepares the root (an earlier first boot); nil means a fresh node.
		before func(t *testing.T, root string)
	}{
		{name: "fresh first boot"},
		{name: "status.json left 0644 by an older kiln", before: func(t *testing.T, root string) {
			if _, err := Run(context.Background(), Options{Root: root, Providers: []source.Provider{fwcfg(t, cfg)}}); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(filepath.Join(root, nodeimage.StatusPath), 0o644); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			if tc.before != nil {
				tc.before(t, root)
			}
			st, err := Run(context.Background(), Options{Root: root, Providers: []source.Provider{fwcfg(t, cfg)}})
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
			if tc.before != nil && !st.Skipped {
				t.Fatal("the second boot ran first boot again")
			}
			p := filepath.Join(root, nodeimage.StatusPath)
			data, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(data), sha256hex([]byte("s3cr3t"))) {
				t.Fatalf("status.json does not record the token's digest; the test proves nothing:\n%s", data)
			}
			fi, err := os.Stat(p)
			if err != nil {
				t.Fatal(err)
			}
			if perm := fi.Mode().Perm(); perm != 0o600 {
				t.Errorf("%s has mode %04o: the digest of /etc/kiln/token is readable by others; want 0600", nodeimage.StatusPath, perm)
			}
		})
	}
}
