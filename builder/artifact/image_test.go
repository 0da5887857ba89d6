package artifact

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/kilnproject/kiln/builder/spec"
)

// testRegistry is an in-memory registry on 127.0.0.1 that counts requests and can be told to
// corrupt one blob.
type testRegistry struct {
	*httptest.Server
	host string
	mu   sync.Mutex
	reqs []string
	bad  string // a digest whose blob is served with a flipped byte
}

func newRegistry(t *testing.T) *testRegistry {
	t.Helper()
	r := &testRegistry{}
	h := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		r.reqs = append(r.reqs, req.Method+" "+req.URL.Path)
		bad := r.bad
		r.mu.Unlock()
		if bad != "" && strings.HasSuffix(req.URL.Path, "/blobs/"+bad) && req.Method == http.MethodGet {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			body := rec.Body.Bytes()
			body[len(body)/2] ^= 0xff
			w.WriteHeader(rec.Code)
			w.Write(body)
			return
		}
		h.ServeHTTP(w, req)
	}))
	t.Cleanup(r.Close)
	r.host = strings.TrimPrefix(r.URL, "http://")
	return r
}

func (r *testRegistry) requests() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.reqs
	r.reqs = nil
	return out
}

func (r *testRegistry) push(t *testing.T, ref string, img v1.Image) string {
	t.Helper()
	tag, err := name.ParseReference(r.host + "/" + ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(tag, img); err != nil {
		t.Fatal(err)
	}
	return digestOf(t, img)
}

// amd64 sets an image's platform, as real images have.
func amd64(t *testing.T, img v1.Image, arch string) v1.Image {
	t.Helper()
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", arch
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func TestParseReferenceLoopbackIsPlainHTTP(t *testing.T) {
	for _, tt := range []struct{ ref, scheme string }{
		{"127.0.0.1:5000/pause:3.10.2", "http"},
		{"127.0.0.2:5000/pause:3.10.2", "http"},
		{"localhost:5000/pause:3.10.2", "http"},
		{"[::1]:5000/pause:3.10.2", "http"},
		{"registry.k8s.io/pause:3.10.2", "https"},
		{"registry.k8s.io:443/pause@sha256:" + strings.Repeat("a", 64), "https"},
		{"localhost.example.com/pause:3.10.2", "https"},
	} {
		ref, err := parseReference(tt.ref)
		if err != nil {
			t.Errorf("%s: %v", tt.ref, err)
			continue
		}
		if got := ref.Context().Registry.Scheme(); got != tt.scheme {
			t.Errorf("%s: scheme %s, want %s", tt.ref, got, tt.scheme)
		}
	}
}

// fetchRegistry is a registry holding two images that share a layer, an arm64 image and a
// multi-platform index.
type fetchRegistry struct {
	reg                                          *testRegistry
	shared                                       v1.Layer
	proxy                                        v1.Image
	apiDigest, proxyDigest, armDigest, idxDigest string
}

func newFetchRegistry(t *testing.T) fetchRegistry {
	t.Helper()
	f := fetchRegistry{reg: newRegistry(t)}
	var err error
	if f.shared, err = random.Layer(4096, "application/vnd.oci.image.layer.v1.tar+gzip"); err != nil {
		t.Fatal(err)
	}
	withShared := func() v1.Image {
		img, err := mutate.AppendLayers(amd64(t, randomImage(t), "amd64"), f.shared)
		if err != nil {
			t.Fatal(err)
		}
		return img
	}
	apiserver := withShared()
	f.proxy = withShared()
	f.apiDigest = f.reg.push(t, "kube-apiserver:v1.37.2", apiserver)
	f.proxyDigest = f.reg.push(t, "kube-proxy:v1.37.2", f.proxy)
	f.armDigest = f.reg.push(t, "arm:1", amd64(t, randomImage(t), "arm64"))
	idx, _ := multiPlatform(t)
	idxRef, _ := name.ParseReference(f.reg.host + "/multi:1")
	if err := remote.WriteIndex(idxRef, idx); err != nil {
		t.Fatal(err)
	}
	f.idxDigest = digestOf(t, idx)
	f.reg.requests()
	return f
}

// fetchFailure is an image FetchImage must refuse, and what its error says.
type fetchFailure struct {
	name, source, digest, corrupt, want string
}

func TestFetchImage(t *testing.T) {
	f := newFetchRegistry(t)
	checkFetchCaches(t, f)
	bogus := "sha256:" + strings.Repeat("0", 64)
	for _, tt := range []fetchFailure{
		{"index", "multi:1", f.idxDigest, "", "is a multi-platform index, not an image manifest; pin the linux/amd64 image's digest (kiln lock does)"},
		{"other platform", "arm:1", f.armDigest, "", "is a linux/arm64 image; nodes need linux/amd64"},
		{"missing manifest", "kube-apiserver:v1.37.2", bogus, "", "MANIFEST_UNKNOWN"},
		{"bad digest", "kube-apiserver:v1.37.2", "sha256:abc", "", `digest "sha256:abc" is not sha256:<64 hex>`},
		{"corrupt layer", "kube-proxy:v1.37.2", f.proxyDigest, "layer", "sha256"},
	} {
		t.Run(tt.name, func(t *testing.T) { checkFetchFails(t, f, tt) })
	}
}

// checkFetchCaches fetches an image into a cache, fetches it again without asking the
// registry, and fetches a second image without downloading the layer they share again.
func checkFetchCaches(t *testing.T, f fetchRegistry) {
	t.Helper()
	reg := f.reg
	c := NewCache(t.TempDir())
	ctx := context.Background()
	src := ImageSource{Name: "registry.k8s.io/kube-apiserver:v1.37.2", Source: reg.host + "/kube-apiserver:v1.37.2", Digest: f.apiDigest}
	ci, err := c.FetchImage(ctx, src, ImageFetch{})
	if err != nil {
		t.Fatal(err)
	}
	if ci.Manifest.Digest.String() != f.apiDigest || ci.Platform == nil || ci.Platform.Architecture != "amd64" || len(ci.Layers) != 2 {
		t.Errorf("CachedImage = %+v", ci)
	}
	for _, b := range ci.Blobs() {
		if _, ok := c.Has(b.Digest.Hex); !ok {
			t.Errorf("blob %s not in the cache", b.Digest)
		}
	}
	if n := len(reg.requests()); n == 0 {
		t.Error("the first fetch made no request")
	}
	// Fetched again: nothing from the registry.
	if _, err := c.FetchImage(ctx, src, ImageFetch{}); err != nil {
		t.Fatal(err)
	}
	if r := reg.requests(); len(r) != 0 {
		t.Errorf("second fetch of a cached image contacted the registry: %v", r)
	}
	// A second image sharing a layer downloads it only once.
	if _, err := c.FetchImage(ctx, ImageSource{Name: "registry.k8s.io/kube-proxy:v1.37.2", Source: reg.host + "/kube-proxy:v1.37.2", Digest: f.proxyDigest}, ImageFetch{}); err != nil {
		t.Fatal(err)
	}
	sharedDigest, _ := f.shared.Digest()
	for _, r := range reg.requests() {
		if strings.HasSuffix(r, sharedDigest.String()) {
			t.Errorf("shared layer fetched again: %s", r)
		}
	}
}

// checkFetchFails fetches a refused image into a new cache: the error names the image and
// the reason, and nothing partial or corrupt is left in the cache.
func checkFetchFails(t *testing.T, f fetchRegistry, tt fetchFailure) {
	reg := f.reg
	c := NewCache(t.TempDir())
	if tt.corrupt != "" {
		layers, _ := f.proxy.Layers()
		d, _ := layers[0].Digest()
		reg.mu.Lock()
		reg.bad = d.String()
		reg.mu.Unlock()
		defer func() { reg.mu.Lock(); reg.bad = ""; reg.mu.Unlock() }()
		defer func() {
			if _, ok := c.Has(d.Hex); ok {
				t.Errorf("corrupt layer %s is in the cache", d)
			}
		}()
	}
	_, err := c.FetchImage(context.Background(), ImageSource{Name: "registry.k8s.io/x:1", Source: reg.host + "/" + tt.source, Digest: tt.digest}, ImageFetch{})
	if err == nil || !strings.HasPrefix(err.Error(), `image "registry.k8s.io/x:1": `) || !strings.Contains(err.Error(), tt.want) {
		t.Errorf("error %v, want one naming the image and %q", err, tt.want)
	}
	for _, f := range cacheFiles(t, c) {
		if strings.HasPrefix(f, ".partial") || strings.HasPrefix(f, ".kiln-") {
			t.Errorf("left %s in the cache", f)
		}
	}
}

// imagesRepo writes an image definition and a worker profile whose images are pause and
// coredns from host, unpinned, and kube-proxy pinned to pinned; it returns them and the
// profile's path.
func imagesRepo(t *testing.T, host, pinned string) (*spec.Definition, *spec.Profile, string) {
	t.Helper()
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "images"), 0o755)
	os.MkdirAll(filepath.Join(root, "profiles"), 0o755)
	os.WriteFile(filepath.Join(root, "images", "qemu.yaml"), []byte("name: qemu\nplatform: qemu\nbase:\n  image: example.com/base:1\n  digest: "+pinned+"\n"), 0o644)
	prof := filepath.Join(root, "profiles", "worker.yaml")
	os.WriteFile(prof, []byte(fmt.Sprintf(`role: worker
kubernetes: {version: v1.37.2}
images:
  - name: registry.k8s.io/pause:3.10.2
    source: %[1]s/pause:3.10.2
  - name: registry.k8s.io/coredns/coredns:v1.15.0
    source: %[1]s/coredns/coredns:v1.15.0
  - name: registry.k8s.io/kube-proxy:v1.37.2
    digest: %[2]s
`, host, pinned)), 0o644)
	def, err := spec.LoadDefinition(filepath.Join(root, "images", "qemu.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	p, err := def.Profile("worker")
	if err != nil {
		t.Fatal(err)
	}
	return def, p, prof
}

func TestPinImages(t *testing.T) {
	reg := newRegistry(t)
	single := reg.push(t, "pause:3.10.2", amd64(t, randomImage(t), "amd64"))
	idx, amd := multiPlatform(t)
	idxRef, _ := name.ParseReference(reg.host + "/coredns/coredns:v1.15.0")
	if err := remote.WriteIndex(idxRef, idx); err != nil {
		t.Fatal(err)
	}
	pinned := "sha256:" + strings.Repeat("e", 64)

	def, p, prof := imagesRepo(t, reg.host, pinned)
	old, _ := ReadLock(LockPath(def))
	wantUnpinned := []string{
		prof + `:4: images: "registry.k8s.io/pause:3.10.2" (` + reg.host + `/pause:3.10.2) is not pinned: no digest here or in the lock file (run kiln lock)`,
		prof + `:6: images: "registry.k8s.io/coredns/coredns:v1.15.0" (` + reg.host + `/coredns/coredns:v1.15.0) is not pinned: no digest here or in the lock file (run kiln lock)`,
	}
	if got := Unpinned(def, p, old); !reflect.DeepEqual(got, wantUnpinned) {
		t.Errorf("Unpinned:\n got %q\nwant %q", got, wantUnpinned)
	}

	pn := &Pinner{Cache: NewCache(t.TempDir()), Resolver: OCIResolver{}}
	reg.requests()
	l, notes, err := pn.Pin(context.Background(), def, []*spec.Profile{p}, old)
	if err != nil {
		t.Fatal(err)
	}
	wantImages := map[string]LockedImage{
		"worker/registry.k8s.io/pause:3.10.2":            {Source: reg.host + "/pause:3.10.2", Digest: single},
		"worker/registry.k8s.io/coredns/coredns:v1.15.0": {Source: reg.host + "/coredns/coredns:v1.15.0", Digest: digestOf(t, amd)},
	}
	if !reflect.DeepEqual(l.Images, wantImages) {
		t.Errorf("lock images:\n got %v\nwant %v", l.Images, wantImages)
	}
	if len(notes) != 2 || !strings.Contains(notes[1], "pinned worker/registry.k8s.io/coredns/coredns:v1.15.0: "+reg.host+"/coredns/coredns:v1.15.0 is "+digestOf(t, amd)) {
		t.Errorf("notes %q", notes)
	}
	for _, r := range reg.requests() {
		if strings.Contains(r, "/blobs/") || !strings.HasPrefix(r, "HEAD ") && !strings.HasPrefix(r, "GET /v2/coredns/coredns/manifests/sha256:") && r != "GET /v2/" {
			t.Errorf("kiln lock downloaded a blob: %s", r)
		}
	}
	if u := Unpinned(def, p, l); len(u) != 0 {
		t.Errorf("still unpinned: %q", u)
	}
	srcs, err := ImageSources(p, l)
	if err != nil || len(srcs) != 3 || srcs[2].Digest != pinned || srcs[0].Digest != single {
		t.Errorf("ImageSources = %+v, %v", srcs, err)
	}
	// Written and read back; locking again asks nothing.
	path := LockPath(def)
	if err := l.Write(path); err != nil {
		t.Fatal(err)
	}
	l2, err := ReadLock(path)
	if err != nil || !reflect.DeepEqual(l2.Images, wantImages) {
		t.Fatalf("ReadLock = %+v, %v", l2, err)
	}
	if _, notes, err := pn.Pin(context.Background(), def, []*spec.Profile{p}, l2); err != nil || len(notes) != 0 {
		t.Errorf("second Pin: %q, %v", notes, err)
	}
	if r := reg.requests(); len(r) != 0 {
		t.Errorf("second Pin contacted the registry: %v", r)
	}
	// A changed source unpins the image.
	moved := *p
	moved.Images = append([]spec.Image(nil), p.Images...)
	moved.Images[0].Source = reg.host + "/mirror/pause:3.10.2"
	if u := Unpinned(nil, &moved, l2); len(u) != 1 || !strings.Contains(u[0], "pause") {
		t.Errorf("moved source: Unpinned = %q", u)
	}
	// A missing tag fails naming the profile line and the image.
	moved.Images[0].Source = reg.host + "/pause:nope"
	_, _, err = pn.Pin(context.Background(), def, []*spec.Profile{&moved}, l2)
	if err == nil || !strings.HasPrefix(err.Error(), prof+`:4: image "registry.k8s.io/pause:3.10.2": `) {
		t.Errorf("Pin of a missing tag: %v", err)
	}
}

func TestFetchImageCorruptErrorMessage(t *testing.T) {
	reg := newRegistry(t)
	img := amd64(t, randomImage(t), "amd64")
	dg := reg.push(t, "pause:3.10.2", img)
	layers, _ := img.Layers()
	d, _ := layers[0].Digest()
	reg.bad = d.String()
	_, err := NewCache(t.TempDir()).FetchImage(context.Background(), ImageSource{Name: "registry.k8s.io/pause:3.10.2", Source: reg.host + "/pause:3.10.2", Digest: dg}, ImageFetch{})
	if err == nil || !strings.Contains(err.Error(), d.String()) {
		t.Errorf("error %v does not name the corrupt blob %s", err, d)
	}
}
