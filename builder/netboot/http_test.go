package netboot

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kilnproject/kiln/initd/config"
)

// get sends GET path to ts with Host host ("" keeps the server's own) and returns the
// response with its body read.
func get(t *testing.T, url, host string, header ...string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if host != "" {
		req.Host = host
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(body)
}

// What iPXE is answered: the chain script, each machine's script, and a 404 naming the
// MAC for a machine nobody declared.
func TestBootScripts(t *testing.T) {
	dir := fixture(t)
	ts, logs := startServer(t, Options{Dir: dir})
	adv, _ := startServer(t, Options{Dir: dir, AdvertiseURL: "https://boot.example.com/rack1/"})
	for _, tc := range []struct {
		name, server, query, golden string
		status                      int
	}{
		{"chain script", ts.URL, "", "chain.ipxe", 200},
		{"chain script, empty selectors as iPXE sends them", ts.URL, "?mac=&uuid=&hostname=", "chain.ipxe", 200},
		{"live worker by the group's MAC, hyphenated", ts.URL, "?mac=52-54-00-00-00-01&uuid=&hostname=", "live-worker.ipxe", 200},
		{"live worker by its own UUID, upper case", ts.URL, "?mac=52-54-00-aa-aa-aa&uuid=8A4E3C2B-0000-4000-8000-000000000003", "live-worker-3.ipxe", 200},
		{"install by MAC", ts.URL, "?mac=52-54-00-00-01-01&uuid=00000000-0000-0000-0000-000000000000&hostname=", "install-cp-1.ipxe", 200},
		{"install by DHCP hostname", ts.URL, "?mac=52-54-00-00-01-99&hostname=CP-2", "install-cp-2.ipxe", 200},
		{"advertised https URL", adv.URL, "?mac=52:54:00:00:00:02", "live-worker-advertised.ipxe", 200},
		{"unknown machine", ts.URL, "?mac=52-54-00-99-99-99&uuid=&hostname=stray", "unknown.ipxe", 404},
		{"malformed MAC", ts.URL, "?mac=52-54-00", "bad-mac.ipxe", 400},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := get(t, tc.server+"/boot.ipxe"+tc.query, "boot.example:8080")
			if resp.StatusCode != tc.status {
				t.Errorf("status %d, want %d:\n%s", resp.StatusCode, tc.status, body)
			}
			golden(t, tc.golden, body)
		})
	}
	logged(t, logs, `msg="unknown machine" mac=52:54:00:99:99:99 uuid="" hostname=stray`,
		`path=/boot.ipxe status=404`, `mac=52-54-00-99-99-99`)
}

// A request with a Host that cannot go into a script is refused, not echoed.
func TestBootScriptBadHost(t *testing.T) {
	ts, _ := startServer(t, Options{Dir: fixture(t)})
	resp, body := get(t, ts.URL+"/boot.ipxe", "evil.example\nkernel")
	if resp.StatusCode != http.StatusBadRequest || strings.Contains(body, "chain") {
		t.Errorf("status %d, body %q; want 400 without a script", resp.StatusCode, body)
	}
}

// Each machine's config is its group's with its own hostname and etcd member; the group's
// other settings stay.
func TestConfigs(t *testing.T) {
	ts, _ := startServer(t, Options{Dir: fixture(t)})
	for _, tc := range []struct {
		id, golden string
		files      map[string]string // path → contents that must be there
	}{
		{"workers", "config-workers.json", nil},
		{"worker-3", "config-worker-3.json", map[string]string{"/etc/hostname": "worker-3\n"}},
		{"cp-1", "config-cp-1.json", map[string]string{"/etc/kiln/node.yaml": "hostname: cp-1"}},
		{"cp-2", "config-cp-2.json", map[string]string{"/etc/kiln/node.yaml": "member: b"}},
	} {
		t.Run(tc.id, func(t *testing.T) {
			resp, body := get(t, ts.URL+"/config/"+tc.id, "")
			if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" || resp.Header.Get("ETag") == "" {
				t.Fatalf("status %d, Content-Type %q, ETag %q", resp.StatusCode, resp.Header.Get("Content-Type"), resp.Header.Get("ETag"))
			}
			var pretty bytes.Buffer
			json.Indent(&pretty, []byte(body), "", "  ")
			golden(t, tc.golden, pretty.String()+"\n")
			files := parsedFiles(t, body)
			for p, want := range tc.files {
				contains(t, p, files[p], want)
			}
			if tc.id == "cp-1" {
				node, err := config.ParseNode([]byte(files["/etc/kiln/node.yaml"]), "node.yaml")
				if err != nil || node.Hostname != "cp-1" || node.Etcd.Member != "a" || node.Cluster.Name != "rack1" {
					t.Errorf("node.yaml: %+v, %v", node, err)
				}
			}
			again, _ := get(t, ts.URL+"/config/"+tc.id, "", "If-None-Match", resp.Header.Get("ETag"))
			if again.StatusCode != http.StatusNotModified {
				t.Errorf("If-None-Match with its ETag: status %d, want 304", again.StatusCode)
			}
		})
	}
	if resp, _ := get(t, ts.URL+"/config/nobody", ""); resp.StatusCode != 404 {
		t.Errorf("/config/nobody: status %d, want 404", resp.StatusCode)
	}
}

// parsedFiles parses an Ignition config as the node does and returns its files' contents.
func parsedFiles(t *testing.T, js string) map[string]string {
	t.Helper()
	cfg, err := config.Parse([]byte(js))
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	files, err := cfg.Files()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, f := range files {
		out[f.Path] = string(f.Contents)
	}
	return out
}

// Images go out whole, by range and not at all when the client has them (strong ETag).
func TestImageFiles(t *testing.T) {
	dir := fixture(t)
	ts, _ := startServer(t, Options{Dir: dir})
	kernel, err := os.ReadFile(filepath.Join(dir, "metal-worker-pxe", "vmlinuz"))
	if err != nil {
		t.Fatal(err)
	}
	full, body := get(t, ts.URL+"/images/metal-worker-pxe/vmlinuz", "")
	etag := full.Header.Get("ETag")
	if full.StatusCode != 200 || body != string(kernel) || !strings.HasPrefix(etag, `"sha256-`) {
		t.Fatalf("GET: status %d, %d bytes, ETag %q", full.StatusCode, len(body), etag)
	}
	for _, tc := range []struct {
		name   string
		header []string
		status int
		body   string
	}{
		{"range", []string{"Range", "bytes=100-199"}, 206, string(kernel[100:200])},
		{"open range", []string{"Range", "bytes=2990-"}, 206, string(kernel[2990:])},
		{"if-none-match", []string{"If-None-Match", etag}, 304, ""},
		{"if-none-match, other etag", []string{"If-None-Match", `"sha256-00"`}, 200, string(kernel)},
		{"if-range matching", []string{"Range", "bytes=0-9", "If-Range", etag}, 206, string(kernel[:10])},
		{"if-range stale", []string{"Range", "bytes=0-9", "If-Range", `"sha256-00"`}, 200, string(kernel)},
		{"range past the end", []string{"Range", "bytes=5000-"}, 416, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := get(t, ts.URL+"/images/metal-worker-pxe/vmlinuz", "", tc.header...)
			if resp.StatusCode != tc.status || (tc.status != 416 && body != tc.body) {
				t.Errorf("status %d (want %d), %d bytes (want %d)", resp.StatusCode, tc.status, len(body), len(tc.body))
			}
		})
	}
	if resp, _ := get(t, ts.URL+"/images/metal-control-plane.raw", ""); resp.StatusCode != 200 {
		t.Errorf("install image: status %d", resp.StatusCode)
	}
	// An image's metadata is what kiln-init update --from reads first.
	md, _ := os.ReadFile(filepath.Join(dir, "metal-worker.json"))
	if resp, body := get(t, ts.URL+"/images/metal-worker.json", ""); resp.StatusCode != 200 || body != string(md) {
		t.Errorf("metadata: status %d, %d bytes (want %d)", resp.StatusCode, len(body), len(md))
	}
}

// Only files checked at startup are served: no path leads to anything else in the
// directory or outside it.
func TestNoTraversal(t *testing.T) {
	dir := fixture(t)
	writeFile(t, filepath.Join(dir, "secret.key"), "SECRET")
	ts, _ := startServer(t, Options{Dir: dir})
	for _, p := range []string{
		"/images/secret.key",
		"/images/machines.yaml",
		"/images/metal-worker-pxe/boot.ipxe", // the bake's own script: kiln serve renders its own
		"/images/../secret.key",
		"/images/metal-worker-pxe/../../secret.key",
		"/images/%2e%2e/secret.key",
		"/images/..%2fsecret.key",
		"/images/metal-worker-pxe%2f..%2f..%2fsecret.key",
		"/images//etc/passwd",
		"/images/%2fetc%2fpasswd",
		"/config/..%2fmachines.yaml",
		"/config/../secret.key",
		"/secret.key",
	} {
		resp, body := get(t, ts.URL+p, "")
		if resp.StatusCode == 200 || strings.Contains(body, "SECRET") || strings.Contains(body, "root:") || strings.Contains(body, "groups:") {
			t.Errorf("GET %s: status %d, body %.40q", p, resp.StatusCode, body)
		}
	}
}

// /healthz answers, and every request leaves one access-log line.
func TestHealthzAndAccessLog(t *testing.T) {
	ts, logs := startServer(t, Options{Dir: fixture(t)})
	resp, body := get(t, ts.URL+"/healthz", "")
	if resp.StatusCode != 200 || body != "ok\n" {
		t.Errorf("/healthz: %d %q", resp.StatusCode, body)
	}
	get(t, ts.URL+"/images/metal-worker-pxe/initrd.img", "")
	logged(t, logs,
		"msg=http method=GET path=/healthz status=200 bytes=3 duration=",
		"msg=http method=GET path=/images/metal-worker-pxe/initrd.img status=200 bytes=5000 duration=", "remote=127.0.0.1:")
}

// A file that changes after startup is refused rather than served under its old ETag, even
// with the same size and modification time; one that is no longer a regular file is refused
// without being opened (a FIFO would hold the request until someone writes to it).
func TestChangedFileRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		// change changes p (the file old describes); regular: it leaves a regular file of
		// old's size and modification time.
		change  func(t *testing.T, p string, old os.FileInfo)
		regular bool
	}{
		{"rewritten, other size", func(t *testing.T, p string, _ os.FileInfo) {
			writeFile(t, p, "changed")
		}, false},
		{"rewritten in place, same size and mtime", func(t *testing.T, p string, old os.FileInfo) {
			f, err := os.OpenFile(p, os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if _, err := f.WriteAt([]byte("CHANGED"), 100); err != nil {
				t.Fatal(err)
			}
			if err := os.Chtimes(p, old.ModTime(), old.ModTime()); err != nil {
				t.Fatal(err)
			}
		}, true},
		{"replaced by rename, same size and mtime", func(t *testing.T, p string, old os.FileInfo) {
			writeFile(t, p+".new", strings.Repeat("x", int(old.Size())))
			if err := os.Chtimes(p+".new", old.ModTime(), old.ModTime()); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(p+".new", p); err != nil {
				t.Fatal(err)
			}
		}, true},
		{"replaced by a FIFO", func(t *testing.T, p string, _ os.FileInfo) {
			mkfifo(t, p)
			t.Cleanup(func() { // frees a request waiting to open it, before the server closes
				if f, err := os.OpenFile(p, os.O_RDWR, 0); err == nil {
					f.Close()
				}
			})
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := fixture(t)
			p := filepath.Join(dir, "metal-worker-pxe", "rootfs.img")
			old, err := os.Stat(p)
			if err != nil {
				t.Fatal(err)
			}
			ts, logs := startServer(t, Options{Dir: dir})
			time.Sleep(20 * time.Millisecond) // past the kernel's clock tick, which ctimes are taken from
			tc.change(t, p, old)
			if tc.regular {
				fi, err := os.Stat(p)
				if err != nil || fi.Size() != old.Size() || !fi.ModTime().Equal(old.ModTime()) {
					t.Fatalf("the change left %v, %v; want %d bytes of %s", fi, err, old.Size(), old.ModTime())
				}
			}
			client := &http.Client{Timeout: 5 * time.Second}
			resp, err := client.Get(ts.URL + "/images/metal-worker-pxe/rootfs.img")
			if err != nil {
				t.Fatalf("GET: %v; want 503", err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusServiceUnavailable {
				t.Errorf("status %d (%d bytes, ETag %s), want 503", resp.StatusCode, len(body), resp.Header.Get("ETag"))
			}
			logged(t, logs, "served file changed since startup")
		})
	}
}

// Following a machine's script works: every URL in it answers, and what the sha256
// parameters promise is what is served.
func TestScriptURLsResolve(t *testing.T) {
	ts, _ := startServer(t, Options{Dir: fixture(t)})
	for _, query := range []string{"?mac=52-54-00-00-00-01", "?mac=52-54-00-00-01-01"} {
		_, script := get(t, ts.URL+"/boot.ipxe"+query, "")
		params := map[string]string{}
		var urls []string
		for _, field := range strings.Fields(script) {
			if k, v, ok := strings.Cut(field, "="); ok && strings.HasPrefix(k, "kiln.") {
				params[k] = v
			}
			if strings.HasPrefix(field, "http://") {
				urls = append(urls, field)
			}
		}
		for _, k := range []string{"kiln.live.rootfs_url", "kiln.install.image_url", "kiln.config.url"} {
			if v := params[k]; v != "" {
				urls = append(urls, v)
			}
		}
		if len(urls) != 4 {
			t.Errorf("%s: %d URLs in the script, want kernel, initrd, image and config:\n%s", query, len(urls), script)
		}
		for _, u := range urls {
			if resp, _ := get(t, u, ""); resp.StatusCode != 200 {
				t.Errorf("%s: GET %s: %d", query, u, resp.StatusCode)
			}
		}
		for url, sum := range map[string]string{params["kiln.live.rootfs_url"]: params["kiln.live.rootfs_sha256"],
			params["kiln.install.image_url"]: params["kiln.install.image_sha256"]} {
			if url == "" {
				continue
			}
			if _, body := get(t, url, ""); sha256Hex(body) != sum {
				t.Errorf("%s: %s does not have the sha256 %s the script gives", query, url, sum)
			}
		}
	}
}
