package firstboot

import (
	"context"
	"crypto/sha512"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kilnproject/kiln/initd/source"
)

// First boot follows a pointer config's ignition.config.merge and replace, fetched from a real
// HTTP server and checked against their hashes, before it applies anything: the merged
// configs' files win over the pointer's, a replaced pointer's own files are not written, and
// a config that is not what its hash says fails first boot with nothing written.
func TestRunFollowsReferences(t *testing.T) {
	served := map[string]string{
		"/node.ign": `{"ignition":{"version":"3.4.0"},"storage":{"files":[` +
			`{"path":"/etc/hostname","contents":{"source":"data:,node-1"}},{"path":"/etc/motd","overwrite":true,"contents":{"source":"data:,node"}}]}}`,
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, ok := served[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		fmt.Fprint(w, body)
	}))
	defer srv.Close()
	sum := sha512.Sum512([]byte(served["/node.ign"]))
	good := "sha512-" + hex.EncodeToString(sum[:])
	wrong := "sha512-" + strings.Repeat("ab", 64)
	pointer := func(kind, hash string) string {
		ref := `{"source":"` + srv.URL + `/node.ign","verification":{"hash":"` + hash + `"}}`
		if kind == "merge" {
			ref = "[" + ref + "]"
		}
		return `{"ignition":{"version":"3.4.0","config":{"` + kind + `":` + ref + `}},"storage":{"files":[` +
			`{"path":"/etc/motd","contents":{"source":"data:,pointer"}},{"path":"/etc/pointer","contents":{"source":"data:,pointer"}}]}}`
	}
	tests := []struct {
		name, config string
		files        map[string]string // path: contents, "" for absent
		err          string
	}{
		{name: "merge", config: pointer("merge", good),
			files: map[string]string{"/etc/hostname": "node-1", "/etc/motd": "node", "/etc/pointer": "pointer"}},
		{name: "replace", config: pointer("replace", good),
			files: map[string]string{"/etc/hostname": "node-1", "/etc/motd": "node", "/etc/pointer": ""}},
		{name: "wrong hash", config: pointer("merge", wrong),
			files: map[string]string{"/etc/hostname": "", "/etc/motd": "", "/etc/pointer": ""},
			err:   "config from fw_cfg: ignition.config.merge[0].verification.hash: sha512 mismatch"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			st, err := Run(context.Background(), Options{
				Root:      root,
				Providers: []source.Provider{fwcfg(t, tc.config)},
				Facts:     fakeMachine(t, func() []netip.Prefix { return nil }),
				Now:       clock(time.Second),
			})
			if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
				t.Fatalf("Run = %v, want error %q", err, tc.err)
			}
			for p, want := range tc.files {
				got, err := os.ReadFile(filepath.Join(root, p))
				if want == "" && err == nil || want != "" && string(got) != want {
					t.Errorf("%s = %q (%v), want %q", p, got, err, want)
				}
			}
			if tc.err == "" && (len(st.Referenced) != 1 || st.Referenced[0] != srv.URL+"/node.ign") {
				t.Errorf("status referenced = %q, want [%s/node.ign]", st.Referenced, srv.URL)
			}
		})
	}
}
