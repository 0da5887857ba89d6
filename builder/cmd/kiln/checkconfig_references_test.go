package main

import (
	"crypto/sha512"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/kilnproject/kiln/internal/nodeimage"
	"github.com/kilnproject/kiln/internal/testkit"
)

// kiln check-config follows a pointer config's references as first boot does, from a real
// HTTP server with real hashes, and checks what they add up to against the image: a bad
// reference is named by its JSON path (behind the references that led to it), a source it
// cannot reach is named as not checked, and --offline fetches nothing.
func TestCheckConfigReferences(t *testing.T) {
	dir := t.TempDir()
	md := nodeimage.Metadata{Name: "qemu", Role: "worker", Platform: "qemu", Contents: &nodeimage.Contents{
		Writable: []string{"/etc", "/var", "/usr/local", "/opt", "/home", "/root"},
		Users:    []string{"root"}, Groups: []string{"root"}, Units: []string{"containerd.service"}}}
	data, _ := json.Marshal(md)
	img := filepath.Join(dir, "qemu-worker.json")
	os.WriteFile(img, data, 0o644)

	served := map[string]string{
		"/good.ign":  `{"ignition":{"version":"3.4.0"},"storage":{"files":[{"path":"/etc/motd","contents":{"source":"data:,hi"}}]}}`,
		"/usr.ign":   `{"ignition":{"version":"3.4.0"},"storage":{"files":[{"path":"/usr/lib/app.conf","contents":{"source":"data:,x"}}]}}`,
		"/raid5.ign": `{"ignition":{"version":"3.4.0"},"storage":{"raid":[{"name":"r","level":"raid5","devices":["/dev/vdb","/dev/vdc","/dev/vdd"]}]}}`,
	}
	var requests atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		body, ok := served[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Write([]byte(body))
	}))
	defer srv.Close()
	hash := func(p string) string {
		s := sha512.Sum512([]byte(served[p]))
		return "sha512-" + hex.EncodeToString(s[:])
	}
	// nested merges the served config at p, itself merging /raid5.ign.
	served["/nested.ign"] = `{"ignition":{"version":"3.4.0","config":{"merge":[{"source":"` + srv.URL + `/raid5.ign","verification":{"hash":"` + hash("/raid5.ign") + `"}}]}}}`
	pointer := func(name, source, hash string) string {
		p := filepath.Join(dir, name)
		bu := "variant: fcos\nversion: 1.6.0\nignition:\n  config:\n    merge:\n      - source: " + source + "\n"
		if hash != "" {
			bu += "        verification:\n          hash: " + hash + "\n"
		}
		os.WriteFile(p, []byte(bu), 0o644)
		return p
	}
	inline := filepath.Join(dir, "inline.bu")
	os.WriteFile(inline, []byte("variant: fcos\nversion: 1.6.0\nignition:\n  config:\n    merge:\n      - inline: '"+served["/raid5.ign"]+"'\n"), 0o644)
	closed := "http://" + testkit.ClosedAddr(t) + "/good.ign"

	tests := []struct {
		name     string
		args     []string
		want     []string // in the output, or in the error when fails
		fails    bool
		requests int32 // -1: any
	}{
		{name: "reachable and good", args: []string{pointer("good.bu", srv.URL+"/good.ign", hash("/good.ign"))}, requests: 1,
			want: []string{"good.bu: ok for qemu-worker.json (qemu, role worker) with " + srv.URL + "/good.ign"}},
		{name: "the merged result is checked against the image", args: []string{pointer("usr.bu", srv.URL+"/usr.ign", hash("/usr.ign"))}, fails: true, requests: 1,
			want: []string{"usr.bu against " + img, "storage.files[0].path: /usr/lib/app.conf is on the image's read-only root"}},
		{name: "wrong hash", args: []string{pointer("hash.bu", srv.URL+"/good.ign", hash("/usr.ign"))}, fails: true, requests: 1,
			want: []string{"hash.bu: ignition.config.merge[0].verification.hash: sha512 mismatch"}},
		{name: "a nested reference's config refused", args: []string{pointer("nested.bu", srv.URL+"/nested.ign", hash("/nested.ign"))}, fails: true, requests: 2,
			want: []string{"nested.bu: ignition.config.merge[0] (" + srv.URL + "/nested.ign): ignition.config.merge[0] (" + srv.URL + `/raid5.ign): storage.raid[0].level: level "raid5" is not supported`}},
		{name: "inline", args: []string{inline}, fails: true, requests: 0,
			want: []string{`inline.bu: ignition.config.merge[0] (data: URL): storage.raid[0].level: level "raid5" is not supported`}},
		{name: "remote without a hash", args: []string{pointer("nohash.bu", srv.URL+"/good.ign", "")}, fails: true, requests: 0,
			want: []string{"nohash.bu: ignition.config.merge[0].verification.hash: required for a http source"}},
		{name: "unreachable: named, not checked", args: []string{pointer("closed.bu", closed, hash("/good.ign"))}, requests: 0,
			want: []string{"closed.bu: ignition.config.merge[0] (" + closed + ") not checked: ",
				"closed.bu: ok for qemu-worker.json (qemu, role worker); not checked: ignition.config.merge[0] (" + closed + ")"}},
		{name: "not found: named, not checked", args: []string{pointer("gone.bu", srv.URL+"/gone.ign", hash("/good.ign"))}, requests: 1,
			want: []string{"/gone.ign) not checked: server answered 404 Not Found"}},
		{name: "offline", args: []string{pointer("offline.bu", srv.URL+"/usr.ign", hash("/usr.ign")), "--offline"}, requests: 0,
			want: []string{"offline.bu: ignition.config.merge[0] (" + srv.URL + "/usr.ign) not checked: not fetched (--offline)",
				"offline.bu: ok for qemu-worker.json (qemu, role worker); not checked: ignition.config.merge[0] (" + srv.URL + "/usr.ign)"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			requests.Store(0)
			out, err := kiln(t, append([]string{"check-config", "--image", img}, tc.args...)...)
			if tc.fails != (err != nil) {
				t.Fatalf("check-config: %v\n%s", err, out)
			}
			if err != nil {
				out = err.Error()
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("check-config said\n%s\nwant it to say %q", out, w)
				}
			}
			if got := requests.Load(); got != tc.requests {
				t.Errorf("%d requests to the config server, want %d", got, tc.requests)
			}
		})
	}
}
