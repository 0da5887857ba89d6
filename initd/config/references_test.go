package config

import (
	"bytes"
	"context"
	"crypto/sha512"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vincent-petithory/dataurl"

	"github.com/kilnproject/kiln/internal/testkit"
)

func sha512Of(data []byte) string {
	s := sha512.Sum512(data)
	return "sha512-" + hex.EncodeToString(s[:])
}

// remote serves configs by path.
type remote struct {
	*httptest.Server
	mu      sync.Mutex
	configs map[string]string
}

func remoteConfigs(t *testing.T) *remote {
	t.Helper()
	r := &remote{configs: map[string]string{}}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		c, ok := r.configs[req.URL.Path]
		r.mu.Unlock()
		if !ok {
			http.NotFound(w, req)
			return
		}
		w.Write([]byte(c))
	}))
	t.Cleanup(r.Close)
	return r
}

// set serves contents at p and returns their sha512 verification hash.
func (r *remote) set(p, contents string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.configs[p] = contents
	return sha512Of([]byte(contents))
}

// fileContents is what a rendered config writes at p ("" when it writes nothing there).
func fileContents(t *testing.T, c *Config, p string) string {
	t.Helper()
	files, err := c.Files()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if f.Path == p {
			return string(f.Contents)
		}
	}
	return ""
}

// A pointer config in user data that replaces or merges configs kept elsewhere renders to what
// those configs say, in Ignition's order: replace takes the place of the pointer, merges go
// over it one after the other, and references inside fetched configs are followed.
func TestRender(t *testing.T) {
	file := func(p, text string) string {
		return fmt.Sprintf(`{"path":%q,"overwrite":true,"contents":{"source":"data:,%s"}}`, p, text)
	}
	site := `{"ignition":{"version":"3.4.0"},"storage":{"files":[` + file("/etc/motd", "site") + `,` + file("/etc/hostname", "site") + `]}}`
	node := `{"ignition":{"version":"3.0.0"},"storage":{"files":[` + file("/etc/hostname", "node-1") + `]}}`
	replaced := `{"ignition":{"version":"3.0.0"},"storage":{"files":[` + file("/etc/motd", "replaced") + `]}}`
	srv := remoteConfigs(t)
	siteHash, nodeHash, replacedHash := srv.set("/site.ign", site), srv.set("/node.ign", node), srv.set("/config.json", replaced)
	// A fetched config that merges another one in turn.
	layered := `{"ignition":{"version":"3.4.0","config":{"merge":[{"source":"` + srv.URL + `/node.ign","verification":{"hash":"` + nodeHash + `"}}]}},` +
		`"storage":{"files":[` + file("/etc/motd", "layered") + `]}}`
	layeredHash := srv.set("/layered.ign", layered)
	gz := testkit.Gzip(t, []byte(node))

	tests := []struct {
		name       string
		config     string
		files      map[string]string // path: contents, "" for absent
		referenced []string
	}{
		{name: "Ignition docs: replace with a sha512", referenced: []string{srv.URL + "/config.json"},
			config: `{"ignition":{"version":"3.0.0","config":{"replace":{"source":"` + srv.URL + `/config.json","verification":{"hash":"` + replacedHash + `"}}}},` +
				`"storage":{"files":[` + file("/etc/pointer", "gone") + `]}}`,
			files: map[string]string{"/etc/motd": "replaced", "/etc/pointer": ""}},
		{name: "merges in order over the pointer", referenced: []string{srv.URL + "/site.ign", srv.URL + "/node.ign"},
			config: `{"ignition":{"version":"3.4.0","config":{"merge":[` +
				`{"source":"` + srv.URL + `/site.ign","verification":{"hash":"` + siteHash + `"}},` +
				`{"source":"` + srv.URL + `/node.ign","verification":{"hash":"` + nodeHash + `"}}]}},` +
				`"storage":{"files":[` + file("/etc/motd", "pointer") + `,` + file("/etc/issue", "pointer") + `]}}`,
			files: map[string]string{"/etc/motd": "site", "/etc/hostname": "node-1", "/etc/issue": "pointer"}},
		{name: "a fetched config's own merge", referenced: []string{srv.URL + "/layered.ign", srv.URL + "/node.ign"},
			config: `{"ignition":{"version":"3.4.0","config":{"merge":[{"source":"` + srv.URL + `/layered.ign","verification":{"hash":"` + layeredHash + `"}}]}}}`,
			files:  map[string]string{"/etc/motd": "layered", "/etc/hostname": "node-1"}},
		{name: "gzip'd, hash of the decompressed config", referenced: []string{"data: URL"},
			config: `{"ignition":{"version":"3.4.0","config":{"merge":[{"source":"` + dataurl.EncodeBytes(gz) + `","compression":"gzip","verification":{"hash":"` + sha512Of([]byte(node)) + `"}}]}}}`,
			files:  map[string]string{"/etc/hostname": "node-1"}},
		{name: "Butane docs: inline", referenced: []string{"data: URL"},
			config: "variant: fcos\nversion: 1.6.0\nignition:\n  config:\n    merge:\n    - inline: '{\"ignition\": {\"version\": \"3.5.0\"}}'\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := mustValidate(t, tc.config)
			out, err := cfg.Render(context.Background(), RenderOptions{Get: URLGetter(FetchOptions{})})
			if err != nil {
				t.Fatalf("Render: %v", err)
			}
			if err := out.Validate(); err != nil {
				t.Fatalf("the rendered config does not validate: %v", err)
			}
			for p, want := range tc.files {
				if got := fileContents(t, out, p); got != want {
					t.Errorf("%s = %q, want %q", p, got, want)
				}
			}
			if fmt.Sprint(out.Referenced) != fmt.Sprint(tc.referenced) {
				t.Errorf("Referenced = %q, want %q", out.Referenced, tc.referenced)
			}
		})
	}
}

// mustValidate parses and validates raw, as first boot and kiln check-config do before Render.
func mustValidate(t *testing.T, raw string) *Config {
	t.Helper()
	cfg := mustParse(t, raw)
	if err := cfg.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	return cfg
}

// merge is a pointer config merging source (with hash, "" for none).
func merge(source, hash string) string {
	ref := `{"source":"` + source + `"`
	if hash != "" {
		ref += `,"verification":{"hash":"` + hash + `"}`
	}
	return `{"ignition":{"version":"3.4.0","config":{"merge":[` + ref + `}]}}}`
}

// nested is a chain of depth data: URL references, each config merging the next.
func nested(depth int) string {
	c := `{"ignition":{"version":"3.4.0"}}`
	for range depth {
		c = merge(dataurl.EncodeBytes([]byte(c)), "")
	}
	return c
}

// A referenced config that is not what its hash says, not a config kiln takes, a loop, or
// references nested too deep: each is an error naming the reference's JSON path, behind the
// references that led there.
func TestRenderFailures(t *testing.T) {
	bad := `{"ignition":{"version":"3.4.0"},"storage":{"file":[{"path":"/etc/a"}]}}`
	unsupported := `{"ignition":{"version":"3.4.0"},"storage":{"raid":[{"name":"r","level":"raid5","devices":["/dev/vdb","/dev/vdc","/dev/vdd"]}]}}`
	srv := remoteConfigs(t)
	self := merge(srv.URL+"/self.ign", sha512Of([]byte("anything")))
	selfHash, badHash, raidHash := srv.set("/self.ign", self), srv.set("/bad.ign", bad), srv.set("/raid.ign", unsupported)
	tests := []struct {
		name, config, want string
	}{
		{name: "hash mismatch", config: merge(srv.URL+"/bad.ign", sha512Of([]byte("what the author published"))),
			want: "ignition.config.merge[0].verification.hash: sha512 mismatch: config says "},
		{name: "fetched config refused", config: merge(srv.URL+"/raid.ign", raidHash),
			want: "ignition.config.merge[0] (" + srv.URL + `/raid.ign): storage.raid[0].level: level "raid5" is not supported`},
		{name: "fetched config unparsable", config: merge(srv.URL+"/bad.ign", badHash),
			want: "ignition.config.merge[0] (" + srv.URL + "/bad.ign): parse config: storage.file: unused key file"},
		{name: "a config that merges itself", config: merge(srv.URL+"/self.ign", selfHash),
			want: "ignition.config.merge[0] (" + srv.URL + "/self.ign): ignition.config.merge[0].source: " + srv.URL + "/self.ign is one of the configs that led here: a loop (" +
				srv.URL + "/self.ign → " + srv.URL + "/self.ign)"},
		{name: "not found", config: merge(srv.URL+"/gone.ign", sha512Of(nil)),
			want: "ignition.config.merge[0].source: fetch " + srv.URL + "/gone.ign: server answered 404 Not Found"},
		{name: "too deep", config: nested(MaxReferenceDepth + 1),
			want: "ignition.config.merge[0].source: references nest more than 10 deep"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := mustValidate(t, tc.config).Render(context.Background(), RenderOptions{Get: URLGetter(FetchOptions{})})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Render = %v\nwant %q", err, tc.want)
			}
		})
	}
	if _, err := mustValidate(t, nested(MaxReferenceDepth)).Render(context.Background(), RenderOptions{}); err != nil {
		t.Errorf("references %d deep: %v", MaxReferenceDepth, err)
	}
}

// Validate takes the sources kiln fetches and wants a hash for each remote one, as for files.
func TestValidateReferences(t *testing.T) {
	tests := []struct{ name, ref, want string }{
		{name: "https without a hash (Butane docs)", ref: `"merge":[{"source":"https://example.com/sample.ign"}]`,
			want: "ignition.config.merge[0].verification.hash: required for a https source: kiln verifies every downloaded byte (give sha256-<hex> or sha512-<hex> of the decompressed config)"},
		{name: "tftp without a hash", ref: `"replace":{"source":"tftp://10.0.0.1/node.ign"}`,
			want: "ignition.config.replace.verification.hash: required for a tftp source"},
		{name: "s3", ref: `"merge":[{"source":"s3://bucket/node.ign","verification":{"hash":"` + sha512Of(nil) + `"}}]`,
			want: `ignition.config.merge[0].source: scheme "s3" is not supported by kiln yet (data:, http:, https: and tftp: are)`},
		{name: "http headers", ref: `"merge":[{"source":"https://h/a.ign","httpHeaders":[{"name":"Authorization","value":"x"}],"verification":{"hash":"` + sha512Of(nil) + `"}}]`,
			want: "ignition.config.merge[0].httpHeaders is not supported by kiln yet"},
		{name: "tftp with a hash", ref: `"replace":{"source":"tftp://10.0.0.1/node.ign","verification":{"hash":"` + sha512Of(nil) + `"}}`},
		{name: "data", ref: `"merge":[{"source":"data:,%7B%22ignition%22%3A%7B%22version%22%3A%223.4.0%22%7D%7D"}]`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := Parse([]byte(`{"ignition":{"version":"3.4.0","config":{` + tc.ref + `}}}`))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			err = cfg.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate = %v\nwant %q", err, tc.want)
			}
		})
	}
}

// kiln check-config renders what it can reach: a source that does not answer is reported and
// left out, a source that answers wrongly is still an error.
func TestRenderUnreachable(t *testing.T) {
	addr := testkit.ClosedAddr(t)
	cfg := mustValidate(t, merge("http://"+addr+"/node.ign", sha512Of(nil)))
	var told []string
	out, err := cfg.Render(context.Background(), RenderOptions{Get: URLGetter(FetchOptions{}),
		Unreachable: func(field, source string, err error) { told = append(told, field+" "+source+": "+err.Error()) }})
	if err != nil || out != cfg {
		t.Fatalf("Render = %v, %v; want the pointer config itself", out, err)
	}
	if len(told) != 1 || !strings.HasPrefix(told[0], "ignition.config.merge[0] http://"+addr+"/node.ign: ") || !strings.Contains(told[0], "connection refused") {
		t.Errorf("Unreachable told %q", told)
	}
	if _, err := cfg.Render(context.Background(), RenderOptions{Get: URLGetter(FetchOptions{})}); err == nil ||
		!strings.Contains(err.Error(), "ignition.config.merge[0].source: fetch http://"+addr+"/node.ign") {
		t.Errorf("Render without Unreachable = %v, want the fetch error", err)
	}
}

// First boot retries a referenced config as it retries kiln.config.url: the network may come
// up after first boot starts.
func TestURLGetterRetries(t *testing.T) {
	n := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n++; n < 3 {
			http.Error(w, "not yet", http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ok"))
	}))
	defer srv.Close()
	get := URLGetter(FetchOptions{Retry: time.Minute})
	if data, err := get(context.Background(), srv.URL+"/x"); err != nil || string(data) != "ok" || n != 3 {
		t.Errorf("get = %q, %v after %d requests", data, err, n)
	}
	if _, err := URLGetter(FetchOptions{})(context.Background(), srv.URL+"/x"); err != nil {
		t.Errorf("get once: %v", err)
	}
	n = 0
	if _, err := URLGetter(FetchOptions{})(context.Background(), srv.URL+"/x"); err == nil || n != 1 {
		t.Errorf("get once = %v after %d requests, want the 503 of the only one", err, n)
	}
}

// A config referenced over tftp is fetched with the tftp client kiln.config.url uses.
func TestRenderTFTP(t *testing.T) {
	node := `{"ignition":{"version":"3.4.0"},"storage":{"files":[{"path":"/etc/hostname","contents":{"source":"data:,node-1"}}]}}`
	addr := serveTFTP(t, "nodes/node-1.ign", []byte(node))
	out, err := mustValidate(t, merge("tftp://"+addr+"/nodes/node-1.ign", sha512Of([]byte(node)))).
		Render(context.Background(), RenderOptions{Get: URLGetter(FetchOptions{})})
	if err != nil {
		t.Fatalf("Render: %v", err)
	}
	if got := fileContents(t, out, "/etc/hostname"); got != "node-1" {
		t.Errorf("/etc/hostname = %q", got)
	}
}

// serveTFTP answers one read request for name with data (under 512 bytes, one DATA packet,
// the requested block size ignored as RFC 2347 allows) and returns its address.
func serveTFTP(t *testing.T, name string, data []byte) string {
	t.Helper()
	conn, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	go func() {
		buf := make([]byte, 1024)
		n, from, err := conn.ReadFromUDP(buf)
		if err != nil || n < 4 || binary.BigEndian.Uint16(buf) != 1 {
			return
		}
		if file, _, _ := bytes.Cut(buf[2:n], []byte{0}); string(file) != name {
			conn.WriteToUDP(append([]byte{0, 5, 0, 1}, "File not found\x00"...), from)
			return
		}
		conn.WriteToUDP(append([]byte{0, 3, 0, 1}, data...), from)
		conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		conn.ReadFromUDP(buf) // the ACK
	}()
	return conn.LocalAddr().String()
}

// All the configs one config references are bounded together, as its files are: gzip'd data:
// URLs that unpack to more than MaxReferencedSize are refused at the entry that goes over.
func TestRenderCap(t *testing.T) {
	var refs []string
	for i := range 3 { // 3 × 44 MiB: each under MaxSize, together over MaxReferencedSize
		padded := testkit.Gzip(t, append([]byte(`{"ignition":{"version":"3.4.0"}}`), bytes.Repeat([]byte(" "), 44<<20+i)...))
		refs = append(refs, `{"source":"`+dataurl.EncodeBytes(padded)+`","compression":"gzip"}`)
	}
	cfg := mustValidate(t, `{"ignition":{"version":"3.4.0","config":{"merge":[`+strings.Join(refs, ",")+`]}}}`)
	_, err := cfg.Render(context.Background(), RenderOptions{})
	var fe *FieldError
	if !errors.As(err, &fe) || fe.Path != "ignition.config.merge[2]" || !strings.Contains(err.Error(), "128 MiB cap on all of them") {
		t.Fatalf("Render = %v, want the cap at ignition.config.merge[2]", err)
	}
}

// A referenced config's size is bounded as a file's contents are, whatever the source says:
// an answer over MaxSize stops the read at the cap, and so does a gzip'd config that
// unpacks to more. Either is an error even where an unreachable source is only reported
// (kiln check-config): the source answered, wrongly.
func TestRenderOversize(t *testing.T) {
	head := []byte(`{"ignition":{"version":"3.4.0"}}`)
	bomb := testkit.GzipBomb(t, head, bytes.Repeat([]byte(" "), 1<<20), MaxSize>>20+1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/big.ign": // a config padded past the cap, streamed
			w.Write(head)
			for range MaxSize>>20 + 1 {
				w.Write(bytes.Repeat([]byte(" "), 1<<20))
			}
		case "/bomb.ign.gz":
			w.Write(bomb)
		}
	}))
	defer srv.Close()
	tests := []struct{ name, ref, want string }{
		{name: "body over the cap", ref: `{"source":"` + srv.URL + `/big.ign","verification":{"hash":"` + sha512Of(nil) + `"}}`,
			want: "ignition.config.merge[0].source: fetch " + srv.URL + "/big.ign: the answer is larger than the 64 MiB cap on a config"},
		{name: "gzip'd over the cap", ref: `{"source":"` + srv.URL + `/bomb.ign.gz","compression":"gzip","verification":{"hash":"` + sha512Of(nil) + `"}}`,
			want: "ignition.config.merge[0]: the contents is larger than the 64 MiB cap"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := mustValidate(t, `{"ignition":{"version":"3.4.0","config":{"merge":[`+tc.ref+`]}}}`)
			for _, unreachable := range []func(string, string, error){nil, func(field, src string, err error) {
				t.Errorf("%s (%s) reported unreachable: %v", field, src, err)
			}} {
				// 64 MiB through loopback on a busy host: no deadline of an attempt on a real node.
				get := URLGetter(FetchOptions{AttemptTimeout: 10 * time.Minute})
				_, err := cfg.Render(context.Background(), RenderOptions{Get: get, Unreachable: unreachable})
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("Render = %v\nwant %q", err, tc.want)
				}
			}
		})
	}
}

// As Ignition does, a config that replaces itself takes none of its own merges, and the
// replacing config's own references are followed.
func TestRenderReplaceChain(t *testing.T) {
	srv := remoteConfigs(t)
	final := `{"ignition":{"version":"3.4.0"},"storage":{"files":[{"path":"/etc/hostname","contents":{"source":"data:,final"}}]}}`
	finalHash := srv.set("/final.ign", final)
	middle := `{"ignition":{"version":"3.4.0","config":{"replace":{"source":"` + srv.URL + `/final.ign","verification":{"hash":"` + finalHash + `"}}}},` +
		`"storage":{"files":[{"path":"/etc/middle","contents":{"source":"data:,middle"}}]}}`
	middleHash := srv.set("/middle.ign", middle)
	ignored := srv.set("/ignored.ign", `{"ignition":{"version":"3.4.0"},"storage":{"files":[{"path":"/etc/ignored","contents":{"source":"data:,x"}}]}}`)
	cfg := mustValidate(t, `{"ignition":{"version":"3.4.0","config":{`+
		`"replace":{"source":"`+srv.URL+`/middle.ign","verification":{"hash":"`+middleHash+`"}},`+
		`"merge":[{"source":"`+srv.URL+`/ignored.ign","verification":{"hash":"`+ignored+`"}}]}}}`)
	out, err := cfg.Render(context.Background(), RenderOptions{Get: URLGetter(FetchOptions{})})
	if err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]string{"/etc/hostname": "final", "/etc/middle": "", "/etc/ignored": ""} {
		if got := fileContents(t, out, p); got != want {
			t.Errorf("%s = %q, want %q", p, got, want)
		}
	}
	if want := []string{srv.URL + "/middle.ign", srv.URL + "/final.ign"}; fmt.Sprint(out.Referenced) != fmt.Sprint(want) {
		t.Errorf("Referenced = %q, want %q", out.Referenced, want)
	}
}

// Errors, logs and the status name a source without what may be a secret in it.
func TestSourceName(t *testing.T) {
	tests := []struct{ src, want string }{
		{"data:,%7B%7D", "data: URL"},
		{"DATA:;base64,e30=", "data: URL"},
		{"https://user:pass@h/node.ign", "https://user:xxxxx@h/node.ign"},
		{"https://bucket.s3.amazonaws.com/node.ign?X-Amz-Signature=abc&X-Amz-Credential=k", "https://bucket.s3.amazonaws.com/node.ign?…"},
		{"tftp://10.0.0.1/node.ign", "tftp://10.0.0.1/node.ign"},
	}
	for _, tc := range tests {
		if got := sourceName(tc.src); got != tc.want {
			t.Errorf("sourceName(%q) = %q, want %q", tc.src, got, tc.want)
		}
	}
}

// Configs valid alone may clash once merged: the merged config is validated again, as the
// whole, and the error names the configs merged.
func TestRenderMergedClash(t *testing.T) {
	srv := remoteConfigs(t)
	child := `{"ignition":{"version":"3.4.0"},"storage":{"files":[{"path":"/etc/app/conf","contents":{"source":"data:,x"}}]}}`
	hash := srv.set("/child.ign", child)
	cfg := mustValidate(t, `{"ignition":{"version":"3.4.0","config":{"merge":[{"source":"`+srv.URL+`/child.ign","verification":{"hash":"`+hash+`"}}]}},`+
		`"storage":{"links":[{"path":"/etc/app","target":"/var/app"}]}}`)
	_, err := cfg.Render(context.Background(), RenderOptions{Get: URLGetter(FetchOptions{})})
	want := "the config with the configs it references (" + srv.URL + "/child.ign): storage.files[0]: file path includes link in config"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("Render = %v\nwant %q", err, want)
	}
}
