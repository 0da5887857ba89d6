package bake

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/kilnproject/kiln/builder/artifact"
	"github.com/kilnproject/kiln/builder/disk"
	"github.com/kilnproject/kiln/internal/nodeimage"
	"github.com/kilnproject/kiln/internal/testkit"
)

// k8sRepo is a test repository whose worker profile carries stand-in Kubernetes binaries (Go
// programs whose build information records the versions) and two images from a registry on
// 127.0.0.1 that share a layer.
type k8sRepo struct {
	*testRepo
	registry string // host:port
	hits     *atomic.Int32
	digests  map[string]string // image name -> manifest digest
	blobs    int               // distinct blobs of the two images, 2 manifests and 2 configs among them
}

func newK8sRepo(t *testing.T, profileExtra string) *k8sRepo {
	t.Helper()
	var hits atomic.Int32
	h := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")

	shared, err := random.Layer(2048, types.OCILayer)
	if err != nil {
		t.Fatal(err)
	}
	digests := map[string]string{}
	blobs := map[v1.Hash]bool{}
	for _, repo := range []string{"pause:3.10.2", "kube-proxy:v1.37.2"} {
		img, err := random.Image(1024, 1)
		if err != nil {
			t.Fatal(err)
		}
		if img, err = mutate.AppendLayers(img, shared); err != nil {
			t.Fatal(err)
		}
		cf, _ := img.ConfigFile()
		cf = cf.DeepCopy()
		cf.OS, cf.Architecture = "linux", "amd64"
		if img, err = mutate.ConfigFile(img, cf); err != nil {
			t.Fatal(err)
		}
		ref, _ := name.ParseReference(host + "/" + repo)
		if err := remote.Write(ref, img); err != nil {
			t.Fatal(err)
		}
		d, _ := img.Digest()
		digests["registry.k8s.io/"+repo] = d.String()
		blobs[d] = true
		m, _ := img.Manifest()
		blobs[m.Config.Digest] = true
		for _, l := range m.Layers {
			blobs[l.Digest] = true
		}
	}

	dir := t.TempDir()
	bins := map[string]string{"kubelet": kubelet1372, "containerd": containerd242, "runc": runc153}
	var arts strings.Builder
	for _, n := range []string{"kubelet", "containerd", "runc"} {
		body := string(goBinary(t, bins[n]))
		write(t, filepath.Join(dir, n), body)
		dest := "/usr/bin/" + n
		if n == "runc" {
			dest = "/usr/sbin/runc"
		}
		fmt.Fprintf(&arts, "  - {name: %s, path: %s, sha256: %s, dest: %s, mode: \"0755\"}\n", n, filepath.Join(dir, n), sum(body), dest)
	}
	profile := fmt.Sprintf(`role: worker
artifacts:
%skubernetes:
  version: v1.37.2
images:
  - name: registry.k8s.io/pause:3.10.2
    source: %[2]s/pause:3.10.2
  - name: registry.k8s.io/kube-proxy:v1.37.2
    source: %[2]s/kube-proxy:v1.37.2
    digest: %[3]s
overlays: [kubernetes]
%[4]s`, arts.String(), host, digests["registry.k8s.io/kube-proxy:v1.37.2"], profileExtra)
	r := newRepo(t, fakeBase(true), profile)
	write(t, filepath.Join(r.dir, "profiles/control-plane.yaml"), "role: control-plane\nartifacts:\n  - {name: kubectl, url: https://dl.k8s.io/kubectl, sha256: "+sum("kubectl")+", dest: /usr/bin/kubectl}\n")
	unit := filepath.Join(r.dir, "overlays/kubernetes/usr/lib/systemd/system/containerd.service")
	os.MkdirAll(filepath.Dir(unit), 0o755)
	write(t, unit, "[Service]\nExecStart=/usr/bin/containerd\n[Install]\nWantedBy=multi-user.target\n")
	return &k8sRepo{testRepo: r, registry: host, hits: &hits, digests: digests, blobs: len(blobs)}
}

func (r *k8sRepo) bakeWith(t *testing.T, overlays ...string) (*Result, error) {
	t.Helper()
	return Bake(context.Background(), Options{Definition: r.def, Role: "worker", OutDir: r.out,
		KilnInit: r.init, Stage1: r.init, Cache: r.cache, Version: "test", Created: time.Unix(0, 0), ProfileOverlays: overlays})
}

func TestBakeKubernetes(t *testing.T) {
	r := newK8sRepo(t, "")
	// An overlay replaces a file of the base, whose flattened tree the cache shares by links.
	os.MkdirAll(filepath.Join(r.dir, "overlays/kubernetes/etc"), 0o755)
	write(t, filepath.Join(r.dir, "overlays/kubernetes/etc/os-release"), "ID=kiln-overlay\n")
	r.lock(t) // pins pause (a HEAD request), no blob
	hitsAfterLock := r.hits.Load()
	res, err := r.bakeWith(t)
	if err != nil {
		t.Fatal(err)
	}
	if r.hits.Load() == hitsAfterLock {
		t.Error("the first bake did not fetch the images")
	}

	// image.json's kubernetes section.
	k := res.Metadata.Kubernetes
	if k == nil || k.Version != "v1.37.2" || k.Runtime != "containerd" || k.Containerd != "v2.4.2" || len(k.Images) != 2 ||
		k.Images[0] != (nodeimage.ImageInfo{Name: "registry.k8s.io/pause:3.10.2", Digest: r.digests["registry.k8s.io/pause:3.10.2"], Unpacked: true}) ||
		k.Images[1] != (nodeimage.ImageInfo{Name: "registry.k8s.io/kube-proxy:v1.37.2", Digest: r.digests["registry.k8s.io/kube-proxy:v1.37.2"], Unpacked: true}) {
		t.Errorf("metadata kubernetes = %+v", k)
	}
	raw := filepath.Join(r.out, "test-worker.raw")
	parts, _, err := disk.Read(raw)
	if err != nil {
		t.Fatal(err)
	}
	root, _ := parts.Partition("root-a")
	var inImage nodeimage.Metadata
	if err := json.Unmarshal([]byte(unsquash(t, raw, root.Start, "-cat", "/etc/kiln/image.json")), &inImage); err != nil || inImage.Kubernetes == nil || inImage.Kubernetes.Images[0].Digest != k.Images[0].Digest {
		t.Errorf("/etc/kiln/image.json kubernetes = %+v (%v)", inImage.Kubernetes, err)
	}
	ls := unsquash(t, raw, root.Start, "-lln")
	if !strings.Contains(ls, "multi-user.target.wants/containerd.service -> /usr/lib/systemd/system/containerd.service") {
		t.Errorf("containerd.service is not enabled:\n%s", ls)
	}

	// Both images are ready in containerd's store: the layout keeps their manifests and
	// configs, not the compressed layers the store has applied.
	checkImagesLayout(t, r, raw, root.Start, 4)
	checkStore(t, ls)

	// A second bake takes everything from the cache (the images' applied layers too) and
	// gives the same image.
	first := fileSum(t, raw)
	sbomFile := filepath.Join(r.out, "test-worker.spdx.json")
	firstSBOM := testkit.ReadFile(t, sbomFile)
	if k := res.Metadata.SBOM; k == nil || k.Packages["image"] != 2 ||
		!strings.Contains(firstSBOM, `"referenceLocator": "pkg:oci/pause@sha256%3A`+strings.TrimPrefix(r.digests["registry.k8s.io/pause:3.10.2"], "sha256:")+`?repository_url=registry.k8s.io/pause"`) {
		t.Errorf("sbom %+v does not list the images:\n%s", k, firstSBOM)
	}
	os.RemoveAll(r.out)
	before := r.hits.Load()
	if _, err := r.bakeWith(t); err != nil {
		t.Fatal(err)
	}
	if n := r.hits.Load() - before; n != 0 {
		t.Errorf("the second bake made %d registry requests", n)
	}
	if fileSum(t, raw) != first {
		t.Error("the second bake, from the cache, gave another raw image")
	}
	if testkit.ReadFile(t, sbomFile) != firstSBOM {
		t.Error("the second bake gave another SBOM")
	}
	if got := unsquash(t, raw, root.Start, "-cat", "/etc/os-release"); got != "ID=kiln-overlay\n" {
		t.Errorf("/etc/os-release in the image = %q, want the overlay's", got)
	}
	// The flattened base in the cache is still the base's: the overlay replaced the tree's
	// entry, it did not write through the shared link.
	cached, _ := filepath.Glob(filepath.Join(r.cache.Root, "base-trees", "*", "tree", "etc", "os-release"))
	if len(cached) != 1 {
		t.Fatalf("cached base trees: %v, want one", cached)
	}
	if data, err := os.ReadFile(cached[0]); err != nil || string(data) != "ID=fake\n" {
		t.Errorf("the cached base's /etc/os-release = %q (%v), want the base's", data, err)
	}
}

// checkStore checks, in the root filesystem's listing ls, containerd's store laid at bake:
// its metadata, content blobs that link into the layout, two committed snapshots that link to
// the images' applied layers, both directories closed to all but root.
func checkStore(t *testing.T, ls string) {
	t.Helper()
	var blobLinks, snapLinks, closed int
	for _, l := range strings.Split(ls, "\n") {
		f := strings.Fields(l)
		if len(f) < 6 {
			continue
		}
		name := f[5]
		switch {
		case strings.HasPrefix(name, "squashfs-root/usr/lib/kiln/containerd/io.containerd.content.v1.content/blobs/sha256/") && strings.HasPrefix(f[0], "l"):
			if len(f) != 8 || !strings.HasPrefix(f[7], "/usr/lib/kiln/images/blobs/sha256/") || path.Base(f[7]) != path.Base(name) {
				t.Errorf("content blob %s links to %v, want its blob in the layout", name, f[6:])
			}
			blobLinks++
		case strings.HasPrefix(name, "squashfs-root/usr/lib/kiln/containerd/io.containerd.snapshotter.v1.overlayfs/snapshots/") && strings.HasSuffix(name, "/fs"):
			if !strings.HasPrefix(f[0], "l") || len(f) != 8 || !strings.HasPrefix(f[7], "/usr/lib/kiln/snapshots/") {
				t.Errorf("snapshot %s is %v, want a symlink into /usr/lib/kiln/snapshots", name, f)
			}
			snapLinks++
		case name == "squashfs-root/usr/lib/kiln/snapshots" || name == "squashfs-root/usr/lib/kiln/containerd":
			if f[0] != "drwx------" || f[1] != "0/0" {
				t.Errorf("%s is %s %s, want drwx------ 0/0", name, f[0], f[1])
			}
			closed++
		}
	}
	// pause and kube-proxy: 2 manifests, 2 configs; their layers are applied, not kept.
	if blobLinks != 4 || snapLinks != 2 || closed != 2 {
		t.Errorf("store has %d content blob links (want 4), %d snapshots (want 2), %d of its 2 directories listed", blobLinks, snapLinks, closed)
	}
	if !strings.Contains(ls, "squashfs-root/usr/lib/kiln/containerd/io.containerd.metadata.v1.bolt/meta.db") {
		t.Error("the store has no metadata database")
	}
}

// checkImagesLayout checks the image layout in the root partition at offset of raw: one
// index entry per image, annotated; wantBlobs blobs, each once and whole; readable by ggcr.
func checkImagesLayout(t *testing.T, r *k8sRepo, raw string, offset int64, wantBlobs int) {
	t.Helper()
	out := filepath.Join(t.TempDir(), "root")
	if b, err := exec.Command("unsquashfs", "-o", fmt.Sprint(offset), "-d", out, raw, "/usr/lib/kiln/images").CombinedOutput(); err != nil {
		t.Fatalf("unsquashfs: %v\n%s", err, b)
	}
	lp := filepath.Join(out, nodeimage.ImagesPath)
	blobs, _ := os.ReadDir(filepath.Join(lp, "blobs/sha256"))
	if len(blobs) != wantBlobs {
		t.Errorf("layout holds %d blobs, want %d", len(blobs), wantBlobs)
	}
	for _, b := range blobs {
		if got := sum(testkit.ReadFile(t, filepath.Join(lp, "blobs/sha256", b.Name()))); got != b.Name() {
			t.Errorf("blob %s hashes to %s", b.Name(), got)
		}
	}
	p, err := layout.FromPath(lp)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, d := range im.Manifests {
		got = append(got, fmt.Sprintf("%s %s %s %v", d.Annotations[imageNameAnnotation], d.Annotations[artifact.RefNameAnnotation], d.Digest, d.Platform))
		img, err := idx.Image(d.Digest)
		if err != nil {
			t.Fatal(err)
		}
		if ls, err := img.Layers(); err != nil || len(ls) != 2 {
			t.Errorf("%s in the layout: %d layers, %v", d.Annotations[imageNameAnnotation], len(ls), err)
		}
	}
	want := []string{
		"registry.k8s.io/pause:3.10.2 3.10.2 " + r.digests["registry.k8s.io/pause:3.10.2"] + " linux/amd64",
		"registry.k8s.io/kube-proxy:v1.37.2 v1.37.2 " + r.digests["registry.k8s.io/kube-proxy:v1.37.2"] + " linux/amd64",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("index.json:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// --without-images: no registry request, no layout in the image, and image.json says so.
func TestBakeKubernetesWithoutImages(t *testing.T) {
	r := newK8sRepo(t, "")
	r.lock(t)
	before := r.hits.Load()
	// Asked to leave the images out and to lay them for import: refused, nothing written.
	_, err := Bake(context.Background(), Options{Definition: r.def, Role: "worker", OutDir: r.out,
		KilnInit: r.init, Stage1: r.init, Cache: r.cache, Version: "test", Created: time.Unix(0, 0), WithoutImages: true, ImportImages: true})
	if err == nil || !strings.Contains(err.Error(), "--import-images and --without-images together") {
		t.Errorf("bake --without-images --import-images: %v, want it refused", err)
	}
	if entries, _ := os.ReadDir(r.out); len(entries) != 0 {
		t.Errorf("the refused bake left %d entries in %s", len(entries), r.out)
	}
	res, err := Bake(context.Background(), Options{Definition: r.def, Role: "worker", OutDir: r.out,
		KilnInit: r.init, Stage1: r.init, Cache: r.cache, Version: "test", Created: time.Unix(0, 0), WithoutImages: true})
	if err != nil {
		t.Fatal(err)
	}
	if n := r.hits.Load() - before; n != 0 {
		t.Errorf("a bake without images made %d registry requests", n)
	}
	if k := res.Metadata.Kubernetes; k == nil || !k.ImagesLeftOut || len(k.Images) != 0 || k.Version != "v1.37.2" {
		t.Errorf("metadata kubernetes = %+v, want the images marked left out", k)
	}
	raw := filepath.Join(r.out, "test-worker.raw")
	parts, _, err := disk.Read(raw)
	if err != nil {
		t.Fatal(err)
	}
	root, _ := parts.Partition("root-a")
	if ls := unsquash(t, raw, root.Start, "-lln"); strings.Contains(ls, nodeimage.ImagesPath) {
		t.Errorf("the image holds %s although its images were left out", nodeimage.ImagesPath)
	}
}

// --import-images: no store, and the layout holds every blob, the shared layer once, for
// first boot's import.
func TestBakeKubernetesImportImages(t *testing.T) {
	r := newK8sRepo(t, "")
	r.lock(t)
	res, err := Bake(context.Background(), Options{Definition: r.def, Role: "worker", OutDir: r.out,
		KilnInit: r.init, Stage1: r.init, Cache: r.cache, Version: "test", Created: time.Unix(0, 0), ImportImages: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, im := range res.Metadata.Kubernetes.Images {
		if im.Unpacked || im.ImportReason != "baked with --import-images" {
			t.Errorf("image.json: %+v, want it imported at first boot", im)
		}
	}
	raw := filepath.Join(r.out, "test-worker.raw")
	parts, _, err := disk.Read(raw)
	if err != nil {
		t.Fatal(err)
	}
	root, _ := parts.Partition("root-a")
	checkImagesLayout(t, r, raw, root.Start, r.blobs)
	if ls := unsquash(t, raw, root.Start, "-lln"); strings.Contains(ls, nodeimage.StoreSeedPath) {
		t.Errorf("the image holds %s although every image is imported", nodeimage.StoreSeedPath)
	}
}

func TestBakeKubernetesProfileOverlay(t *testing.T) {
	r := newK8sRepo(t, "")
	// The overlay moves pause to a mirror repository and pins it; kube-proxy keeps its source.
	mirror, _ := name.ParseReference(r.registry + "/mirror/pause:3.10.2")
	src, _ := name.ParseReference(r.registry + "/pause:3.10.2")
	img, err := remote.Image(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(mirror, img); err != nil {
		t.Fatal(err)
	}
	ov := filepath.Join(r.dir, "mirror.yaml")
	write(t, ov, fmt.Sprintf("images:\n  - name: registry.k8s.io/pause:3.10.2\n    source: %s/mirror/pause@%s\n", r.registry, r.digests["registry.k8s.io/pause:3.10.2"]))
	// With the base locked but not the images, pause is unpinned unless the overlay pins it.
	r.lock(t)
	def, _ := mustLoad(t, r.def)
	l, err := artifact.ReadLock(artifact.LockPath(def))
	if err != nil {
		t.Fatal(err)
	}
	l.Images = nil
	if err := l.Write(artifact.LockPath(def)); err != nil {
		t.Fatal(err)
	}
	if _, err := r.bakeWith(t); err == nil || !strings.Contains(err.Error(), `"registry.k8s.io/pause:3.10.2" (`+r.registry+`/pause:3.10.2) is not pinned`) {
		t.Fatalf("bake without the overlay: %v", err)
	}
	res, err := r.bakeWith(t, ov)
	if err != nil {
		t.Fatal(err)
	}
	if d := res.Metadata.Kubernetes.Images[0].Digest; d != r.digests["registry.k8s.io/pause:3.10.2"] {
		t.Errorf("pause digest %s", d)
	}

	for _, tc := range []struct{ name, doc, want string }{
		{"typo", "images:\n  - name: registry.k8s.io/paus:3.10.2\n    digest: " + r.digests["registry.k8s.io/pause:3.10.2"] + "\n",
			`typo.yaml:2: images[0].name: "registry.k8s.io/paus:3.10.2" is not an image of any profile`},
		{"another role's artifact", "artifacts:\n  - {name: kubectl, url: http://127.0.0.1:1/kubectl}\n", ""},
		{"unknown digest", "images:\n  - name: registry.k8s.io/kube-proxy:v1.37.2\n    digest: sha256:" + strings.Repeat("0", 64) + "\n",
			`image "registry.k8s.io/kube-proxy:v1.37.2": ` + r.registry + "/kube-proxy@sha256:" + strings.Repeat("0", 64) + ": GET"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			os.RemoveAll(r.out)
			bad := filepath.Join(r.dir, tc.name+".yaml")
			write(t, bad, tc.doc)
			_, err := r.bakeWith(t, ov, bad)
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("error %v, want %q", err, tc.want)
			}
		})
	}
}

func TestBakeKubernetesRefuses(t *testing.T) {
	key := ecKeyPEM(t, "EC PRIVATE KEY")
	for _, tc := range []struct {
		name, extra string
		mutate      func(t *testing.T, r *k8sRepo)
		want        []string
	}{
		{
			name: "kubelet of another release",
			mutate: func(t *testing.T, r *k8sRepo) {
				p := filepath.Join(r.dir, "profiles/worker.yaml")
				write(t, p, strings.Replace(testkit.ReadFile(t, p), "version: v1.37.2", "version: v1.37.3", 1))
			},
			want: []string{"worker.yaml:7: kubernetes v1.37.3 (runtime containerd): /usr/bin/kubelet reports v1.37.2", "kubernetes.version is v1.37.3"},
		},
		{
			name: "cgroup v1 forced",
			mutate: func(t *testing.T, r *k8sRepo) {
				write(t, r.def, strings.Replace(testkit.ReadFile(t, r.def), "args: [console=ttyS0]", "args: [console=ttyS0, systemd.unified_cgroup_hierarchy=0]", 1))
			},
			want: []string{"test.yaml: kernel.args: \"systemd.unified_cgroup_hierarchy=0\" forces cgroup v1"},
		},
		{
			name: "a private key in an overlay",
			mutate: func(t *testing.T, r *k8sRepo) {
				p := filepath.Join(r.dir, "overlays/kubernetes/etc/ssh/ssh_host_ecdsa_key")
				os.MkdirAll(filepath.Dir(p), 0o755)
				write(t, p, key)
			},
			want: []string{"refusing to bake: secrets in the image", "/etc/ssh/ssh_host_ecdsa_key:1: private key (EC PRIVATE KEY)"},
		},
		{
			name: "a bootstrap token in a template",
			mutate: func(t *testing.T, r *k8sRepo) {
				p := filepath.Join(r.dir, "overlays/kubernetes/usr/lib/kiln/templates/etc/kubernetes/bootstrap-kubelet.conf.tmpl")
				os.MkdirAll(filepath.Dir(p), 0o755)
				write(t, p, "users:\n- name: kubelet-bootstrap\n  user:\n    token: 07401b.f395accd246ae52d\n")
			},
			want: []string{"/usr/lib/kiln/templates/etc/kubernetes/bootstrap-kubelet.conf.tmpl:4: Kubernetes bootstrap token"},
		},
		{
			name: "runtime unit masked", extra: "units:\n  mask: [containerd.service]\n",
			want: []string{"units: containerd.service is disabled or masked, but kubernetes.runtime containerd needs it"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newK8sRepo(t, tc.extra)
			r.lock(t)
			if tc.mutate != nil {
				tc.mutate(t, r)
			}
			_, err := r.bakeWith(t)
			r.wantBakeError(t, err, tc.want)
		})
	}
}

// fileSum is the sha256 of the file at p, streamed.
func fileSum(t *testing.T, p string) string {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}
