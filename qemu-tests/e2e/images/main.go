// Command images builds the end-to-end cluster's container images (pause, etcd, the
// Kubernetes control-plane components, kube-proxy and CoreDNS) from binaries built from source
// by build-components.sh, pushes them to a registry and prints where they went:
//
//	{"registry.k8s.io/pause:3.10.2": {"source": "127.0.0.1:5000/pause:3.10.2", "digest": "sha256:…"}, …}
//
// Images are OCI (manifest, config and gzip layers), amd64/linux, and reproducible: entries are
// sorted, owned by root and stamped with one fixed time, so the same binaries always give the
// same digests. Each image is a shared base layer (/etc/passwd, /etc/group, /etc/nsswitch.conf,
// /tmp, like the distroless bases upstream uses), kube-proxy's iptables userland layer, and a
// layer with the component's binaries. Entrypoint, User and Env follow the upstream images;
// where upstream starts through go-runner (etcd, kube-*), the binary itself is the entrypoint,
// which a pod's command overrides anyway.
//
//	go run ./qemu-tests/e2e/images -registry 127.0.0.1:5000 -o images.json
//
// With -artifacts DIR it also packs the profiles' binary artifacts (kubelet, kubectl, runc as
// plain files; containerd, crictl and the CNI plugins as tarballs with upstream's member
// names), and with -overlay FILE writes the profile overlay that pins them and the pushed
// images, so a bake through the real profiles uses what was built here:
//
//	go run ./qemu-tests/e2e/images -artifacts out/artifacts -overlay out/local.yaml
package main

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// epoch stamps every tar entry, the config and its history: digests depend only on content.
var epoch = time.Unix(0, 0).UTC()

const defaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// image is one container image of the cluster.
type image struct {
	Upstream   string            // the name kubeadm and the static pods use
	Repo, Tag  string            // where it goes in the registry
	Binaries   map[string]string // binary name in the bin dir -> absolute path in the image
	Iptables   bool              // carries the iptables/nft userland layer
	Entrypoint []string
	User       string
}

// Images returns the cluster's images at the pinned versions.
func Images() []image {
	kube := func(c string) image {
		return image{Upstream: "registry.k8s.io/" + c + ":v1.37.2", Repo: c, Tag: "v1.37.2",
			Binaries: map[string]string{c: "/usr/local/bin/" + c}, Entrypoint: []string{"/usr/local/bin/" + c}}
	}
	proxy := kube("kube-proxy")
	proxy.Iptables = true
	return []image{
		{Upstream: "registry.k8s.io/pause:3.10.2", Repo: "pause", Tag: "3.10.2",
			Binaries: map[string]string{"pause": "/pause"}, Entrypoint: []string{"/pause"}, User: "65535:65535"},
		{Upstream: "registry.k8s.io/etcd:3.6.16-0", Repo: "etcd", Tag: "3.6.16-0",
			Binaries:   map[string]string{"etcd": "/usr/local/bin/etcd", "etcdctl": "/usr/local/bin/etcdctl"},
			Entrypoint: []string{"/usr/local/bin/etcd"}},
		kube("kube-apiserver"), kube("kube-controller-manager"), kube("kube-scheduler"), proxy,
		{Upstream: "registry.k8s.io/coredns/coredns:v1.15.0", Repo: "coredns/coredns", Tag: "v1.15.0",
			Binaries: map[string]string{"coredns": "/coredns"}, Entrypoint: []string{"/coredns"}, User: "nonroot:nonroot"},
	}
}

// Pushed is where an image went.
type Pushed struct {
	Source string `json:"source"` // registry/repo:tag
	Digest string `json:"digest"` // the manifest's digest
}

// Options say where the inputs are and where the images go.
type Options struct {
	Bin      string // the binaries (build-components.sh's $KILN_E2E_CACHE/bin)
	Iptables string // a root tree with the iptables userland (…/rootfs/iptables)
	Registry string // host:port; plain HTTP for localhost, 127.0.0.1 and private addresses
	Insecure bool   // plain HTTP for any registry
	Work     string // scratch space for the compressed layers
	Only     []string
}

// Build builds and pushes the images (all, or those whose repo is in Only) and returns them
// by upstream name.
func Build(ctx context.Context, o Options) (map[string]Pushed, error) {
	imgs := Images()
	if len(o.Only) > 0 {
		want := map[string]bool{}
		for _, r := range o.Only {
			want[r] = true
		}
		var sel []image
		for _, im := range imgs {
			if want[im.Repo] {
				sel = append(sel, im)
				delete(want, im.Repo)
			}
		}
		if len(want) > 0 {
			return nil, fmt.Errorf("-only: no image %s (repos: pause, etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kube-proxy, coredns/coredns)", strings.Join(sortedKeys(want), ", "))
		}
		imgs = sel
	}
	for _, im := range imgs {
		for b := range im.Binaries {
			if fi, err := os.Stat(filepath.Join(o.Bin, b)); err != nil || !fi.Mode().IsRegular() {
				return nil, fmt.Errorf("%s: binary %s missing in %s (run qemu-tests/e2e/build-components.sh)", im.Upstream, b, o.Bin)
			}
		}
		if im.Iptables {
			if _, err := os.Stat(filepath.Join(o.Iptables, "usr/sbin/xtables-nft-multi")); err != nil {
				return nil, fmt.Errorf("%s: no iptables userland in %s (run qemu-tests/e2e/build-components.sh iptables_root)", im.Upstream, o.Iptables)
			}
		}
	}

	// Layers are made once each (the base and iptables ones are shared), two at a time per CPU
	// at most: gzip is the slow part.
	jobs := map[string]func(w *tar.Writer) error{
		"base":     writeBase,
		"iptables": func(w *tar.Writer) error { return writeTree(w, o.Iptables) },
	}
	for _, im := range imgs {
		jobs["bin-"+strings.ReplaceAll(im.Repo, "/", "-")] = func(w *tar.Writer) error { return writeBinaries(w, o.Bin, im.Binaries) }
	}
	layers, err := makeLayers(o.Work, jobs, imgs)
	if err != nil {
		return nil, err
	}

	out := map[string]Pushed{}
	for _, im := range imgs {
		start := time.Now()
		lay := []v1.Layer{layers["base"]}
		if im.Iptables {
			lay = append(lay, layers["iptables"])
		}
		lay = append(lay, layers["bin-"+strings.ReplaceAll(im.Repo, "/", "-")])
		img, err := assemble(im, lay)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", im.Upstream, err)
		}
		var nopts []name.Option
		if o.Insecure {
			nopts = append(nopts, name.Insecure)
		}
		src := o.Registry + "/" + im.Repo + ":" + im.Tag
		ref, err := name.NewTag(src, nopts...)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", src, err)
		}
		if err := remote.Write(ref, img, remote.WithContext(ctx)); err != nil {
			return nil, fmt.Errorf("push %s: %w", src, err)
		}
		dg, err := img.Digest()
		if err != nil {
			return nil, err
		}
		out[im.Upstream] = Pushed{Source: src, Digest: dg.String()}
		slog.Info("pushed", "image", im.Upstream, "to", src, "digest", dg.String(), "seconds", time.Since(start).Seconds())
	}
	return out, nil
}

// makeLayers writes each job's tar, gzip'd, into work and opens it as an OCI layer. Only the
// layers some image in imgs uses are made.
func makeLayers(work string, jobs map[string]func(*tar.Writer) error, imgs []image) (map[string]v1.Layer, error) {
	used := map[string]bool{"base": true}
	for _, im := range imgs {
		used["bin-"+strings.ReplaceAll(im.Repo, "/", "-")] = true
		if im.Iptables {
			used["iptables"] = true
		}
	}
	var (
		mu   sync.Mutex
		wg   sync.WaitGroup
		errs []error
		sem  = make(chan struct{}, runtime.NumCPU())
	)
	layers := map[string]v1.Layer{}
	for _, n := range sortedKeys(used) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			start := time.Now()
			p := filepath.Join(work, n+".tar.gz")
			l, err := writeLayer(p, jobs[n])
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, fmt.Errorf("layer %s: %w", n, err))
				return
			}
			layers[n] = l
			size, _ := l.Size()
			slog.Info("layer", "name", n, "bytes", size, "seconds", time.Since(start).Seconds())
		}()
	}
	wg.Wait()
	return layers, errors.Join(errs...)
}

func writeLayer(p string, fill func(*tar.Writer) error) (v1.Layer, error) {
	f, err := os.Create(p)
	if err != nil {
		return nil, err
	}
	// gzip's header carries no name or time unless set: the bytes depend on content only.
	zw, err := gzip.NewWriterLevel(f, gzip.DefaultCompression)
	if err != nil {
		f.Close()
		return nil, err
	}
	tw := tar.NewWriter(zw)
	err = fill(tw)
	if err == nil {
		err = tw.Close()
	}
	if err == nil {
		err = zw.Close()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}
	return tarball.LayerFromFile(p, tarball.WithMediaType(types.OCILayer))
}

// assemble makes an OCI image of layers with im's runtime config.
func assemble(im image, layers []v1.Layer) (v1.Image, error) {
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	var adds []mutate.Addendum
	for _, l := range layers {
		adds = append(adds, mutate.Addendum{Layer: l, MediaType: types.OCILayer,
			History: v1.History{Created: v1.Time{Time: epoch}, CreatedBy: "kiln e2e images"}})
	}
	img, err := mutate.Append(img, adds...)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS = "amd64", "linux"
	cf.Created = v1.Time{Time: epoch}
	cf.Config = v1.Config{Entrypoint: im.Entrypoint, Env: []string{defaultPath}, User: im.User, WorkingDir: "/",
		Labels: map[string]string{"org.opencontainers.image.source": "kiln e2e: built from source"}}
	return mutate.ConfigFile(img, cf)
}

// hdr is a tar header with the fixed owner and time.
func hdr(name string, typ byte, mode int64) *tar.Header {
	return &tar.Header{Name: name, Typeflag: typ, Mode: mode, ModTime: epoch, Format: tar.FormatPAX}
}

// dirs writes the parent directories of p (absolute) not yet in seen.
func dirs(w *tar.Writer, p string, seen map[string]bool) error {
	var parents []string
	for d := path.Dir(p); d != "/" && d != "."; d = path.Dir(d) {
		parents = append([]string{d}, parents...)
	}
	for _, d := range parents {
		if seen[d] {
			continue
		}
		seen[d] = true
		if err := w.WriteHeader(hdr(strings.TrimPrefix(d, "/")+"/", tar.TypeDir, 0o755)); err != nil {
			return err
		}
	}
	return nil
}

// writeBase writes what distroless bases give the upstream images: users root, nobody and
// nonroot (65532), name service order, and /tmp.
func writeBase(w *tar.Writer) error {
	files := []struct {
		name, text string
	}{
		{"etc/group", "root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n"},
		{"etc/nsswitch.conf", "hosts: files dns\n"},
		{"etc/passwd", "root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"},
	}
	if err := w.WriteHeader(hdr("etc/", tar.TypeDir, 0o755)); err != nil {
		return err
	}
	for _, f := range files {
		h := hdr(f.name, tar.TypeReg, 0o644)
		h.Size = int64(len(f.text))
		if err := w.WriteHeader(h); err != nil {
			return err
		}
		if _, err := io.WriteString(w, f.text); err != nil {
			return err
		}
	}
	for _, d := range []struct {
		name string
		mode int64
		uid  int
	}{{"home/", 0o755, 0}, {"home/nonroot/", 0o700, 65532}, {"root/", 0o700, 0}, {"tmp/", 0o1777, 0}} {
		h := hdr(d.name, tar.TypeDir, d.mode)
		h.Uid, h.Gid = d.uid, d.uid
		if err := w.WriteHeader(h); err != nil {
			return err
		}
	}
	return nil
}

// writeBinaries writes bins (name in dir -> absolute path in the image), mode 0755.
func writeBinaries(w *tar.Writer, dir string, bins map[string]string) error {
	byDest := map[string]string{}
	for src, dst := range bins {
		byDest[dst] = src
	}
	seen := map[string]bool{}
	for _, dst := range sortedKeys(byDest) {
		if err := dirs(w, dst, seen); err != nil {
			return err
		}
		if err := copyFile(w, filepath.Join(dir, byDest[dst]), strings.TrimPrefix(dst, "/"), 0o755); err != nil {
			return err
		}
	}
	return nil
}

func copyFile(w *tar.Writer, src, name string, mode int64) error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	h := hdr(name, tar.TypeReg, mode)
	h.Size = fi.Size()
	if err := w.WriteHeader(h); err != nil {
		return err
	}
	if _, err := io.Copy(w, f); err != nil {
		return fmt.Errorf("%s: %w", src, err)
	}
	return nil
}

// writeTree writes the tree under root (directories, regular files, symlinks) in lexical
// order, keeping permission bits and dropping owners and times.
func writeTree(w *tar.Writer, root string) error {
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil || rel == "." {
			return err
		}
		rel = filepath.ToSlash(rel)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		mode := int64(fi.Mode().Perm())
		for bit, unix := range map[fs.FileMode]int64{fs.ModeSetuid: 0o4000, fs.ModeSetgid: 0o2000, fs.ModeSticky: 0o1000} {
			if fi.Mode()&bit != 0 {
				mode |= unix
			}
		}
		switch {
		case fi.IsDir():
			return w.WriteHeader(hdr(rel+"/", tar.TypeDir, mode))
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			h := hdr(rel, tar.TypeSymlink, 0o777)
			h.Linkname = target
			return w.WriteHeader(h)
		case fi.Mode().IsRegular():
			return copyFile(w, p, rel, mode)
		}
		slog.Warn("skipped (not a file, directory or symlink)", "path", p)
		return nil
	})
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func main() {
	cache := os.Getenv("KILN_E2E_CACHE")
	if cache == "" {
		if c, err := os.UserCacheDir(); err == nil {
			cache = filepath.Join(c, "kiln", "e2e")
		}
	}
	var o Options
	var only, outFile string
	var art artifactOptions
	flag.StringVar(&o.Bin, "bin", filepath.Join(cache, "bin"), "directory with the binaries (build-components.sh)")
	flag.StringVar(&o.Iptables, "iptables", filepath.Join(cache, "rootfs", "iptables"), "root tree with the iptables userland, for kube-proxy")
	flag.StringVar(&o.Registry, "registry", "127.0.0.1:5000", "registry host:port to push to")
	flag.BoolVar(&o.Insecure, "insecure", false, "plain HTTP even for a registry that is not local")
	flag.StringVar(&only, "only", "", "comma-separated repos to build (default all), e.g. pause,kube-proxy")
	flag.StringVar(&outFile, "o", "", "also write the JSON to this file")
	flag.StringVar(&art.dir, "artifacts", "", "also pack the profiles' binary artifacts (upstream release shapes) into this directory")
	flag.StringVar(&art.overlay, "overlay", "", "with -artifacts: write a profile overlay (kiln bake --profile-overlay) pinning the packed artifacts and pushed images")
	flag.StringVar(&art.dockerOverlay, "docker-overlay", "", "with -artifacts: also write the profile overlay for profiles/docker (images/qemu-docker.yaml); needs Docker built")
	flag.StringVar(&art.url, "artifact-url", "", "with -overlay: the URL the artifacts directory is served at (default: absolute paths)")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "images: unexpected arguments %q\n", flag.Args())
		os.Exit(2)
	}
	if only != "" {
		o.Only = strings.Split(only, ",")
	}
	if (art.overlay != "" || art.dockerOverlay != "") && art.dir == "" {
		fmt.Fprintln(os.Stderr, "images: -overlay and -docker-overlay need -artifacts")
		os.Exit(2)
	}
	if err := run(o, outFile, art); err != nil {
		fmt.Fprintln(os.Stderr, "images:", err)
		os.Exit(1)
	}
}

// artifactOptions asks run to pack the binary artifacts too and write the profile overlay.
type artifactOptions struct{ dir, overlay, dockerOverlay, url string }

func run(o Options, outFile string, art artifactOptions) error {
	work, err := os.MkdirTemp("", "kiln-e2e-images-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	o.Work = work
	got, err := Build(context.Background(), o)
	if err != nil {
		return err
	}
	if art.dir != "" {
		sums, err := packArtifacts(o.Bin, art.dir)
		if err != nil {
			return err
		}
		if art.overlay != "" {
			if err := writeOverlay(art.overlay, art.dir, art.url, sums, got, false); err != nil {
				return fmt.Errorf("profile overlay %s: %w", art.overlay, err)
			}
		}
		if art.dockerOverlay != "" {
			if err := writeOverlay(art.dockerOverlay, art.dir, art.url, sums, got, true); err != nil {
				return fmt.Errorf("profile overlay %s: %w", art.dockerOverlay, err)
			}
		}
	}
	js, err := json.MarshalIndent(got, "", "  ")
	if err != nil {
		return err
	}
	js = append(js, '\n')
	if outFile != "" {
		if err := os.WriteFile(outFile, js, 0o644); err != nil {
			return err
		}
	}
	_, err = os.Stdout.Write(js)
	return err
}
