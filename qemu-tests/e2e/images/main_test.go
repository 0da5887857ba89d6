package main

import (
	"archive/tar"
	"context"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// inputs writes small stand-in binaries (the tool copies bytes; it never runs them) and takes
// the real iptables userland from the e2e cache when build-components.sh made it, else a small
// tree of the same shape (a multi-call binary, symlinks to it, a library directory).
func inputs(t *testing.T) (bin, iptables string) {
	t.Helper()
	bin = filepath.Join(t.TempDir(), "bin")
	os.MkdirAll(bin, 0o755)
	for _, b := range []string{"pause", "etcd", "etcdctl", "kube-apiserver", "kube-controller-manager",
		"kube-scheduler", "kube-proxy", "coredns"} {
		if err := os.WriteFile(filepath.Join(bin, b), []byte("\x7fELF stand-in for "+b+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if c := os.Getenv("KILN_E2E_CACHE"); c != "" {
		iptables = filepath.Join(c, "rootfs", "iptables")
	} else if home, err := os.UserHomeDir(); err == nil {
		iptables = filepath.Join(home, ".cache", "kiln", "e2e", "rootfs", "iptables")
	}
	if _, err := os.Stat(filepath.Join(iptables, "usr/sbin/xtables-nft-multi")); err == nil {
		t.Logf("iptables userland from %s", iptables)
		return bin, iptables
	}
	iptables = filepath.Join(t.TempDir(), "iptables")
	os.MkdirAll(filepath.Join(iptables, "usr/sbin"), 0o755)
	os.MkdirAll(filepath.Join(iptables, "usr/lib/x86_64-linux-gnu"), 0o755)
	os.WriteFile(filepath.Join(iptables, "usr/sbin/xtables-nft-multi"), []byte("\x7fELF xtables\n"), 0o755)
	os.WriteFile(filepath.Join(iptables, "usr/lib/x86_64-linux-gnu/libxtables.so.12"), []byte("\x7fELF lib\n"), 0o644)
	for _, l := range []string{"iptables", "iptables-save", "iptables-restore"} {
		os.Symlink("xtables-nft-multi", filepath.Join(iptables, "usr/sbin", l))
	}
	return bin, iptables
}

func listing(t *testing.T, ref string) (map[string]*tar.Header, map[string]string) {
	t.Helper()
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	img, err := remote.Image(r)
	if err != nil {
		t.Fatalf("pull %s: %v", ref, err)
	}
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	hdrs, small := map[string]*tar.Header{}, map[string]string{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return hdrs, small
		}
		if err != nil {
			t.Fatalf("%s: %v", ref, err)
		}
		hdrs[h.Name] = h
		if h.Size < 4096 {
			b, _ := io.ReadAll(tr)
			small[h.Name] = string(b)
		}
	}
}

// The same binaries give the same digests, whatever their file times and the scratch
// directory; what a cluster node pulls has the upstream layout and runtime config.
func TestImagesPushedReproducibly(t *testing.T) {
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	reg := strings.TrimPrefix(srv.URL, "http://")
	bin, iptables := inputs(t)

	first, err := Build(context.Background(), Options{Bin: bin, Iptables: iptables, Registry: reg, Work: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if len(first) != 7 {
		t.Fatalf("pushed %d images, want 7: %v", len(first), first)
	}
	later := time.Now().Add(time.Hour)
	os.Chtimes(filepath.Join(bin, "kube-proxy"), later, later)
	again, err := Build(context.Background(), Options{Bin: bin, Iptables: iptables, Registry: reg, Work: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	for up, p := range first {
		if again[up] != p {
			t.Errorf("%s: second build %+v, first %+v", up, again[up], p)
		}
		if !strings.HasPrefix(p.Digest, "sha256:") || !strings.HasPrefix(p.Source, reg+"/") {
			t.Errorf("%s: %+v", up, p)
		}
	}

	for _, tc := range []struct {
		upstream, source string
		entrypoint       []string
		user             string
		files            []string // must be in the image, as regular files unless they end in @
		absent           []string
	}{
		{"registry.k8s.io/pause:3.10.2", "/pause:3.10.2", []string{"/pause"}, "65535:65535",
			[]string{"pause", "etc/passwd"}, []string{"usr/sbin/xtables-nft-multi"}},
		{"registry.k8s.io/etcd:3.6.16-0", "/etcd:3.6.16-0", []string{"/usr/local/bin/etcd"}, "",
			[]string{"usr/local/bin/etcd", "usr/local/bin/etcdctl"}, []string{"usr/sbin/xtables-nft-multi"}},
		{"registry.k8s.io/kube-apiserver:v1.37.2", "/kube-apiserver:v1.37.2", []string{"/usr/local/bin/kube-apiserver"}, "",
			[]string{"usr/local/bin/kube-apiserver"}, []string{"usr/local/bin/kube-proxy"}},
		{"registry.k8s.io/kube-controller-manager:v1.37.2", "/kube-controller-manager:v1.37.2", []string{"/usr/local/bin/kube-controller-manager"}, "",
			[]string{"usr/local/bin/kube-controller-manager"}, nil},
		{"registry.k8s.io/kube-scheduler:v1.37.2", "/kube-scheduler:v1.37.2", []string{"/usr/local/bin/kube-scheduler"}, "",
			[]string{"usr/local/bin/kube-scheduler"}, nil},
		{"registry.k8s.io/kube-proxy:v1.37.2", "/kube-proxy:v1.37.2", []string{"/usr/local/bin/kube-proxy"}, "",
			[]string{"usr/local/bin/kube-proxy", "usr/sbin/xtables-nft-multi", "usr/sbin/iptables@", "usr/sbin/iptables-restore@"}, nil},
		{"registry.k8s.io/coredns/coredns:v1.15.0", "/coredns/coredns:v1.15.0", []string{"/coredns"}, "nonroot:nonroot",
			[]string{"coredns", "etc/passwd", "tmp"}, nil},
	} {
		t.Run(tc.upstream, func(t *testing.T) {
			p, ok := first[tc.upstream]
			if !ok || p.Source != reg+tc.source {
				t.Fatalf("pushed as %+v, want source %s", p, reg+tc.source)
			}
			r, _ := name.ParseReference(p.Source)
			img, err := remote.Image(r)
			if err != nil {
				t.Fatal(err)
			}
			if d, _ := img.Digest(); d.String() != p.Digest {
				t.Errorf("registry has %s for %s, tool printed %s", d, p.Source, p.Digest)
			}
			if mt, _ := img.MediaType(); mt != types.OCIManifestSchema1 {
				t.Errorf("manifest media type %s", mt)
			}
			m, _ := img.Manifest()
			if m.Config.MediaType != types.OCIConfigJSON {
				t.Errorf("config media type %s", m.Config.MediaType)
			}
			for _, l := range m.Layers {
				if l.MediaType != types.OCILayer {
					t.Errorf("layer media type %s", l.MediaType)
				}
			}
			cf, _ := img.ConfigFile()
			if strings.Join(cf.Config.Entrypoint, " ") != strings.Join(tc.entrypoint, " ") || cf.Config.User != tc.user {
				t.Errorf("entrypoint %q user %q; want %q %q", cf.Config.Entrypoint, cf.Config.User, tc.entrypoint, tc.user)
			}
			if len(cf.Config.Env) == 0 || !strings.Contains(cf.Config.Env[0], "/usr/local/bin") {
				t.Errorf("env %q has no PATH with /usr/local/bin (static pods run `etcd`, `kube-apiserver` …)", cf.Config.Env)
			}
			if cf.Architecture != "amd64" || cf.OS != "linux" || !cf.Created.Time.Equal(epoch) {
				t.Errorf("platform %s/%s created %s", cf.OS, cf.Architecture, cf.Created)
			}
			hdrs, small := listing(t, p.Source)
			for _, f := range tc.files {
				link := strings.HasSuffix(f, "@")
				f = strings.TrimSuffix(f, "@")
				h, ok := hdrs[f]
				if !ok {
					h, ok = hdrs[f+"/"]
				}
				switch {
				case !ok:
					t.Errorf("%s missing", f)
				case link && h.Typeflag != tar.TypeSymlink:
					t.Errorf("%s is not a symlink", f)
				case h.Typeflag == tar.TypeReg && strings.Contains(f, "bin/") && h.Mode&0o111 == 0:
					t.Errorf("%s mode %o: not executable", f, h.Mode)
				}
				if ok && (h.Uid != 0 && f != "home/nonroot/" || !h.ModTime.Equal(epoch)) {
					t.Errorf("%s uid %d time %s", f, h.Uid, h.ModTime)
				}
			}
			for _, f := range tc.absent {
				if _, ok := hdrs[f]; ok {
					t.Errorf("%s is in the image", f)
				}
			}
			if !strings.Contains(small["etc/passwd"], "nonroot:x:65532") {
				t.Errorf("/etc/passwd = %q", small["etc/passwd"])
			}
		})
	}

	// The base layer is one blob shared by every image.
	bases := map[string]bool{}
	for _, p := range first {
		r, _ := name.ParseReference(p.Source)
		img, _ := remote.Image(r)
		ls, _ := img.Layers()
		d, _ := ls[0].Digest()
		bases[d.String()] = true
	}
	if len(bases) != 1 {
		t.Errorf("base layers %v: want one shared", bases)
	}
}

// A missing binary is named, with what makes it, before anything is pushed.
func TestMissingBinary(t *testing.T) {
	bin, iptables := inputs(t)
	os.Remove(filepath.Join(bin, "etcdctl"))
	_, err := Build(context.Background(), Options{Bin: bin, Iptables: iptables, Registry: "127.0.0.1:1", Work: t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "etcdctl missing") || !strings.Contains(err.Error(), "build-components.sh") {
		t.Fatalf("err = %v", err)
	}
	_, err = Build(context.Background(), Options{Bin: bin, Iptables: iptables, Registry: "127.0.0.1:1", Work: t.TempDir(), Only: []string{"pause", "kube-dns"}})
	if err == nil || !strings.Contains(err.Error(), "kube-dns") {
		t.Fatalf("-only kube-dns: err = %v", err)
	}
}
