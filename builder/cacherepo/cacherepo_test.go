package cacherepo

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"

	"github.com/kilnproject/kiln/internal/testkit"
)

// fault is what the proxy in front of the registry does to the layer blobs it serves.
type fault int

const (
	none fault = iota
	flipByte
	cutShort
)

// proxiedRegistry is a real registry behind a proxy that can spoil the entry layers it serves.
type proxiedRegistry struct {
	host  string
	mu    sync.Mutex
	fault fault
}

func (p *proxiedRegistry) setFault(f fault) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.fault = f
}

func newProxiedRegistry(t *testing.T) *proxiedRegistry {
	t.Helper()
	backend := &url.URL{Scheme: "http", Host: testkit.Registry(t)}
	p := &proxiedRegistry{}
	rp := httputil.NewSingleHostReverseProxy(backend)
	rp.ModifyResponse = func(resp *http.Response) error {
		p.mu.Lock()
		f := p.fault
		p.mu.Unlock()
		// Only the large blob: the config blobs are a few dozen bytes.
		if f == none || resp.Request.Method != http.MethodGet || !strings.Contains(resp.Request.URL.Path, "/blobs/") || resp.ContentLength < 1024 {
			return nil
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return err
		}
		switch f {
		case flipByte:
			body[len(body)/2] ^= 0xff
		case cutShort:
			body = body[:len(body)/2]
		}
		resp.Body = io.NopCloser(bytes.NewReader(body))
		resp.ContentLength = int64(len(body))
		resp.Header.Set("Content-Length", fmt.Sprint(len(body)))
		return nil
	}
	srv := httptest.NewServer(rp)
	t.Cleanup(srv.Close)
	p.host = strings.TrimPrefix(srv.URL, "http://")
	return p
}

// logged collects what a Repo logs.
type logged struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logged) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logged) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Count(l.buf.String(), s)
}

func (l *logged) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func newRepo(t *testing.T, repo string) (*Repo, *logged) {
	t.Helper()
	var l logged
	r, err := New(repo, nil, slog.New(slog.NewTextHandler(&l, nil)))
	if err != nil {
		t.Fatal(err)
	}
	return r, &l
}

// entryData is an entry's stream: incompressible bytes, so that the layer is large.
func entryData(t *testing.T) []byte {
	t.Helper()
	data := make([]byte, 256<<10)
	if _, err := rand.Read(data); err != nil {
		t.Fatal(err)
	}
	return data
}

func put(e Entries, key string, data []byte) {
	e.Put(key, func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	})
}

// get pulls key; it returns what the read function took and whether Get reported a hit.
func get(e Entries, key string) ([]byte, bool) {
	var got bytes.Buffer
	ok := e.Get(key, func(r io.Reader) error {
		_, err := got.ReadFrom(r)
		return err
	})
	return got.Bytes(), ok
}

const key = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// TestPushThenPull: what one process pushes, another pulls byte for byte, as an OCI artifact
// of kiln's media types; an entry never pushed is a quiet miss.
func TestPushThenPull(t *testing.T) {
	host := testkit.Registry(t)
	a, alog := newRepo(t, host+"/kiln-cache")
	data := entryData(t)
	put(a.Entries("base-trees"), key, data)
	if alog.count("cache entry pushed") != 1 || alog.count("level=WARN") != 0 {
		t.Fatalf("push log:\n%s", alog)
	}

	b, blog := newRepo(t, host+"/kiln-cache")
	got, ok := get(b.Entries("base-trees"), key)
	if !ok || !bytes.Equal(got, data) {
		t.Fatalf("pulled %d bytes (hit %v), pushed %d\n%s", len(got), ok, len(data), blog)
	}
	if _, ok := get(b.Entries("trees"), key); ok {
		t.Error("an entry of another kind under the same key was a hit")
	}
	if _, ok := get(b.Entries("base-trees"), strings.Repeat("f", 64)); ok {
		t.Error("an entry never pushed was a hit")
	}
	if blog.count("level=WARN") != 0 {
		t.Errorf("misses warned:\n%s", blog)
	}

	desc, err := remote.Get(mustRef(t, host+"/kiln-cache:base-trees-"+key))
	if err != nil {
		t.Fatal(err)
	}
	m, err := v1.ParseManifest(bytes.NewReader(desc.Manifest))
	if err != nil {
		t.Fatal(err)
	}
	if m.ArtifactType != ArtifactType || m.Config.MediaType != ConfigMediaType || len(m.Layers) != 1 || m.Layers[0].MediaType != LayerMediaType {
		t.Errorf("manifest %s", desc.Manifest)
	}
}

// TestPullRefusesSpoiledEntries: an entry whose layer arrives changed or cut short, whose
// stream is not the one its config names, that is not a kiln entry at all, or that the
// reader refuses, is reported and missed, and the repository stays in use.
func TestPullRefusesSpoiledEntries(t *testing.T) {
	reg := newProxiedRegistry(t)
	repo := reg.host + "/kiln-cache"
	r, log := newRepo(t, repo)
	data := entryData(t)
	e := r.Entries("trees")
	put(e, key, data)

	// An entry whose config names another stream: pushed by hand.
	wrong := strings.Repeat("e", 64)
	put(e, wrong, data)
	ref := mustRef(t, repo+":trees-"+wrong)
	desc, err := remote.Get(ref)
	if err != nil {
		t.Fatal(err)
	}
	m, _ := v1.ParseManifest(bytes.NewReader(desc.Manifest))
	cfg, _ := json.Marshal(entryConfig{Kind: "trees", Key: wrong, StreamSHA256: strings.Repeat("0", 64)})
	cfgBlob := static.NewLayer(cfg, ConfigMediaType)
	if err := remote.WriteLayer(ref.Context(), cfgBlob); err != nil {
		t.Fatal(err)
	}
	m.Config.Digest, _ = cfgBlob.Digest()
	m.Config.Size = int64(len(cfg))
	raw, _ := json.Marshal(m)
	if err := remote.Put(ref, rawManifest(raw)); err != nil {
		t.Fatal(err)
	}
	// A plain image under an entry's tag.
	image := strings.Repeat("d", 64)
	img, err := random.Image(2048, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(mustRef(t, repo+":trees-"+image), img); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name  string
		key   string
		fault fault
		read  func(io.Reader) error
		want  string
	}{
		{"layer changed in transit", key, flipByte, nil, "sha256 checksum"},
		{"layer cut short", key, cutShort, nil, "cache entry refused"},
		{"stream not the config's", wrong, none, nil, "stream sha256"},
		{"not a kiln entry", image, none, nil, "not a kiln cache entry"},
		{"refused by the reader", key, none, func(io.Reader) error { return errors.New("listing differs") }, "listing differs"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg.setFault(tc.fault)
			defer reg.setFault(none)
			before := log.count("cache entry refused")
			read := tc.read
			if read == nil {
				read = func(r io.Reader) error { _, err := io.Copy(io.Discard, r); return err }
			}
			if e.Get(tc.key, read) {
				t.Fatal("a spoiled entry was a hit")
			}
			if log.count("cache entry refused") != before+1 || !strings.Contains(log.String(), tc.want) {
				t.Fatalf("log does not say %q once more:\n%s", tc.want, log)
			}
		})
	}
	if got, ok := get(e, key); !ok || !bytes.Equal(got, data) {
		t.Fatalf("the good entry after refusals: hit %v\n%s", ok, log)
	}
	if log.count("not used from here on") != 0 {
		t.Errorf("a spoiled entry stopped the repository's use:\n%s", log)
	}
}

// TestRegistryDown: a repository nothing answers for is one warning, whatever is pulled and
// pushed after it, and every pull a miss.
func TestRegistryDown(t *testing.T) {
	r, log := newRepo(t, fmt.Sprintf("127.0.0.1:%d/kiln-cache", testkit.FreePort(t)))
	for _, kind := range []string{"base-trees", "trees", "initramfs"} {
		e := r.Entries(kind)
		if _, ok := get(e, key); ok {
			t.Fatal("a hit from a registry that is down")
		}
		put(e, key, []byte("x"))
	}
	if n := log.count("level=WARN"); n != 1 || log.count("not used from here on") != 1 {
		t.Fatalf("%d warnings, want 1:\n%s", n, log)
	}
}

// TestPushRefused: a registry that serves but refuses pushes (read-only, or credentials that
// may only pull) is one warning, and still pulled from.
func TestPushRefused(t *testing.T) {
	store := t.TempDir()
	writable := testkit.RegistryWith(t, testkit.RegistryOptions{Store: store})
	data := entryData(t)
	w, _ := newRepo(t, writable+"/kiln-cache")
	put(w.Entries("trees"), key, data)

	ro, log := newRepo(t, testkit.RegistryWith(t, testkit.RegistryOptions{Store: store, ReadOnly: true})+"/kiln-cache")
	e := ro.Entries("trees")
	other := strings.Repeat("b", 64)
	put(e, other, data)
	put(e, strings.Repeat("c", 64), data)
	if n := log.count("level=WARN"); n != 1 || log.count("refused a push") != 1 {
		t.Fatalf("%d warnings, want the refused push once:\n%s", n, log)
	}
	if got, ok := get(e, key); !ok || !bytes.Equal(got, data) {
		t.Fatalf("a read-only repository's entry was not pulled after a refused push (hit %v)\n%s", ok, log)
	}
	if _, ok := get(e, other); ok {
		t.Error("a refused push left an entry")
	}
}

func TestNewRefusesABadRepository(t *testing.T) {
	for _, repo := range []string{"", "Registry.example.com/UPPER", "host:port:x/y"} {
		if _, err := New(repo, nil, nil); err == nil || !strings.Contains(err.Error(), "cache repository") {
			t.Errorf("New(%q) = %v", repo, err)
		}
	}
}

func mustRef(t *testing.T, s string) name.Reference {
	t.Helper()
	ref, err := name.ParseReference(s)
	if err != nil {
		t.Fatal(err)
	}
	return ref
}
