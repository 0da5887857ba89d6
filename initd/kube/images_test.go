package kube

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"

	"github.com/kilnproject/kiln/internal/nodeimage"
)

// testImage is a small linux/amd64 image with random layers.
func testImage(t *testing.T, base v1.Image, layers int) v1.Image {
	t.Helper()
	img := base
	if img == nil {
		var err error
		if img, err = random.Image(512, int64(layers)); err != nil {
			t.Fatal(err)
		}
	} else {
		for range layers {
			extra, err := random.Layer(256, "application/vnd.oci.image.layer.v1.tar+gzip")
			if err != nil {
				t.Fatal(err)
			}
			if img, err = mutate.AppendLayers(img, extra); err != nil {
				t.Fatal(err)
			}
		}
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// writeLayout writes images (name → image) as a kiln image layout: one index.json,
// each descriptor annotated with the full name and the tag, as the bake writes it.
func writeLayout(t *testing.T, dir string, names []string, imgs map[string]v1.Image) map[string]string {
	t.Helper()
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	digests := map[string]string{}
	for _, name := range names {
		img := imgs[name]
		tag := name[strings.LastIndex(name, ":")+1:]
		if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{
			annotationImageName: name, annotationRefName: tag,
		})); err != nil {
			t.Fatal(err)
		}
		d, _ := img.Digest()
		digests[name] = d.String()
	}
	return digests
}

// tarEntries reads a tar stream: name → content.
func tarEntries(t *testing.T, data []byte) (names []string, files map[string][]byte) {
	t.Helper()
	files = map[string][]byte{}
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return names, files
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		names = append(names, h.Name)
		files[h.Name] = b
	}
}

func TestWriteLayoutTar(t *testing.T) {
	dir := t.TempDir()
	a := testImage(t, nil, 2)
	b := testImage(t, a, 1) // shares a's layers
	c := testImage(t, nil, 1)
	names := []string{"registry.k8s.io/a:v1", "registry.k8s.io/b:v2", "registry.k8s.io/c:v3"}
	imgs := map[string]v1.Image{names[0]: a, names[1]: b, names[2]: c}
	digests := writeLayout(t, dir, names, imgs)

	got, err := ReadLayout(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[1].name != names[1] || got[1].digest != digests[names[1]] {
		t.Fatalf("ReadLayout = %+v", got)
	}

	for _, tc := range []struct {
		name  string
		keep  []string
		blobs []string
	}{
		{"all", names, blobsOf(a, b, c)},
		{"shared layers once", names[:2], blobsOf(a, b)},
		{"one", names[2:], blobsOf(c)},
		{"none", nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) { checkLayoutTar(t, dir, tc.keep, tc.blobs) })
	}

	t.Run("missing blob", func(t *testing.T) {
		ld, _ := c.Layers()
		d, _ := ld[0].Digest()
		os.Remove(filepath.Join(dir, "blobs/sha256", d.Hex))
		err := writeLayoutTar(io.Discard, dir, func(LayoutImage) bool { return true })
		if err == nil || !strings.Contains(err.Error(), d.String()) {
			t.Errorf("err = %v, want one naming the missing blob %s", err, d)
		}
	})
}

// blobsOf returns the sorted, distinct layout paths of the manifests, configs and layers of imgs.
func blobsOf(imgs ...v1.Image) []string {
	var out []string
	for _, img := range imgs {
		d, _ := img.Digest()
		cd, _ := img.ConfigName()
		out = append(out, "blobs/sha256/"+d.Hex, "blobs/sha256/"+cd.Hex)
		ls, _ := img.Layers()
		for _, l := range ls {
			ld, _ := l.Digest()
			out = append(out, "blobs/sha256/"+ld.Hex)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// checkLayoutTar checks writeLayoutTar of the layout in dir, keeping the images named keep,
// writes oci-layout and index.json first, then each of blobs once, and an index of keep.
func checkLayoutTar(t *testing.T, dir string, keep, wantBlobs []string) {
	t.Helper()
	var buf bytes.Buffer
	err := writeLayoutTar(&buf, dir, func(im LayoutImage) bool { return slices.Contains(keep, im.name) })
	if err != nil {
		t.Fatal(err)
	}
	entries, files := tarEntries(t, buf.Bytes())
	if entries[0] != "oci-layout" || entries[1] != "index.json" {
		t.Errorf("tar starts with %v, want oci-layout, index.json", entries[:2])
	}
	var blobs []string
	for _, e := range entries[2:] {
		blobs = append(blobs, e)
	}
	sorted := slices.Sorted(slices.Values(blobs))
	if !slices.Equal(sorted, wantBlobs) || len(blobs) != len(wantBlobs) {
		t.Errorf("blobs = %v\nwant %v", blobs, wantBlobs)
	}
	var idx ociIndex
	if err := json.Unmarshal(files["index.json"], &idx); err != nil {
		t.Fatal(err)
	}
	var kept []string
	for _, d := range idx.Manifests {
		kept = append(kept, d.Annotations[annotationImageName])
	}
	if !slices.Equal(kept, keep) {
		t.Errorf("index.json names %v, want %v", kept, keep)
	}
}

func TestReadLayoutNeedsNames(t *testing.T) {
	dir := t.TempDir()
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(testImage(t, nil, 1)); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadLayout(dir); err == nil || !strings.Contains(err.Error(), annotationImageName) {
		t.Errorf("err = %v, want one naming the missing annotation", err)
	}
}

// componentBin finds a pinned component the e2e builds (KILN_E2E_CACHE/bin, default
// ~/.cache/kiln/e2e/bin), else on PATH; "" when there is none.
func componentBin(name string) string {
	dir := os.Getenv("KILN_E2E_CACHE")
	if dir == "" {
		if home, err := os.UserHomeDir(); err == nil {
			dir = filepath.Join(home, ".cache", "kiln", "e2e")
		}
	}
	if p := filepath.Join(dir, "bin", name); dir != "" {
		if fi, err := os.Stat(p); err == nil && fi.Mode()&0o111 != 0 {
			return p
		}
	}
	p, _ := exec.LookPath(name)
	return p
}

// startContainerd runs a real containerd in a temporary root and returns ctr for it.
func startContainerd(t *testing.T) Ctr {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("containerd needs root")
	}
	containerd, ctr := componentBin("containerd"), componentBin("ctr")
	if containerd == "" || ctr == "" {
		t.Skip("containerd and ctr not found (built by qemu-tests/e2e/build-components.sh into $KILN_E2E_CACHE/bin); CI must provide them")
	}
	// Unix socket paths are short: keep the directory near /tmp.
	dir, err := os.MkdirTemp("", "ctd")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "c.sock")
	conf := `version = 3
root = "` + dir + `/root"
state = "` + dir + `/state"
[grpc]
  address = "` + sock + `"
[ttrpc]
  address = "` + sock + `.ttrpc"
[metrics]
  address = ""
`
	if err := os.WriteFile(filepath.Join(dir, "config.toml"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	cmd := exec.Command(containerd, "--config", filepath.Join(dir, "config.toml"))
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		// Unpacked snapshots may be overlay mounts: lazily unmount what is left.
		exec.Command("umount", "-R", "-l", filepath.Join(dir, "root")).Run()
		if t.Failed() {
			t.Logf("containerd log:\n%s", lastLines(log.String(), 30))
		}
	})
	return Ctr{Path: ctr, Address: sock}
}

func TestImportImagesContainerd(t *testing.T) {
	ctr := startContainerd(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	a := testImage(t, nil, 2)
	b := testImage(t, a, 1)
	names := []string{"registry.k8s.io/pause:3.10.2", "registry.k8s.io/kube-proxy:v1.37.2"}
	dir := t.TempDir()
	digests := writeLayout(t, dir, names, map[string]v1.Image{names[0]: a, names[1]: b})

	// A newer image layout: kube-proxy changed, pause did not.
	b2 := testImage(t, a, 1)
	dir2 := t.TempDir()
	digests2 := writeLayout(t, dir2, names, map[string]v1.Image{names[0]: a, names[1]: b2})

	for _, tc := range []struct {
		name   string
		layout string
		want   []string // imported
		have   map[string]string
		only   []string
	}{
		{"kubelet's images first: the sandbox alone", dir, names[:1], map[string]string{names[0]: digests[names[0]]}, []string{names[0], "registry.k8s.io/etcd:3.6.16-0"}},
		{"then the rest", dir, names[1:], digests, nil},
		{"a second run imports nothing", dir, nil, digests, nil},
		{"a changed image is imported again, alone", dir2, names[1:], digests2, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ImportImages(ctx, ImportOptions{Layout: tc.layout, Ctr: ctr, wait: 20 * time.Second, Only: tc.only})
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("imported %v, want %v", got, tc.want)
			}
			have, err := ctr.images(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for name, d := range tc.have {
				if have[name] != d {
					t.Errorf("containerd has %s at %q, want %s (all: %v)", name, have[name], d, have)
				}
			}
			if tc.only != nil && len(have) != len(tc.have) {
				t.Errorf("containerd holds %v, want only %v", have, tc.have)
			}
		})
	}

	// The images are unpacked for the CRI (crictl/kubelet see them without pulling) and pinned.
	out, err := ctr.cmd(ctx, "images", "list").CombinedOutput()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), "io.cri-containerd.pinned=pinned") {
		t.Errorf("imported images are not pinned:\n%s", out)
	}
	out, err = ctr.cmd(ctx, "images", "check").CombinedOutput()
	if err != nil || strings.Count(string(out), "complete") < 2 {
		t.Errorf("ctr images check: %v\n%s", err, out)
	}
	// a's two layers, b's and b2's third: one snapshot each.
	out, err = ctr.cmd(ctx, "snapshots", "list").CombinedOutput()
	if n := strings.Count(strings.TrimSpace(string(out)), "\n"); err != nil || n < 4 {
		t.Errorf("ctr snapshots list: %d snapshots, want 4 (unpacked layers): %v\n%s", n, err, out)
	}
}

func TestImportImagesNoContainerd(t *testing.T) {
	dir := t.TempDir()
	writeLayout(t, dir, []string{"registry.k8s.io/pause:3.10.2"}, map[string]v1.Image{"registry.k8s.io/pause:3.10.2": testImage(t, nil, 1)})
	ctr := Ctr{Path: "/bin/false"}
	_, err := ImportImages(context.Background(), ImportOptions{Layout: dir, Ctr: ctr, wait: 300 * time.Millisecond})
	if err == nil || !strings.Contains(err.Error(), "containerd does not answer") {
		t.Errorf("err = %v, want containerd does not answer", err)
	}
}

func TestKubeletImages(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files map[string]string
		link  bool // etcd's manifest is a link to a file on its volume
		want  []string
		warn  string
	}{
		{name: "worker: the sandbox image alone", files: map[string]string{
			containerdConfig: "version = 3\n[plugins.'io.containerd.cri.v1.images'.pinned_images]\n    sandbox = \"registry.k8s.io/pause:3.10.2\"\n",
		}, want: []string{"registry.k8s.io/pause:3.10.2"}},
		{name: "control plane: sandbox, static pods and the linked etcd manifest, each once", link: true, files: map[string]string{
			containerdConfig:                           "    sandbox = 'registry.k8s.io/pause:3.10.2'\n",
			"/var/lib/etcd/etcd.manifest":              "apiVersion: v1\nkind: Pod\nspec:\n  containers:\n  - name: etcd\n    image: registry.k8s.io/etcd:3.6.16-0\n",
			nodeimage.ManifestsDir + "/apiserver.yaml": "kind: Pod\nspec:\n  initContainers:\n  - image: registry.k8s.io/etcd:3.6.16-0\n  containers:\n  - image: registry.k8s.io/kube-apiserver:v1.37.2\n",
			nodeimage.ManifestsDir + "/.swp":           "kind: Pod\nspec:\n  containers:\n  - image: hidden:1\n",
			nodeimage.ManifestsDir + "/README":         "not a manifest",
		}, want: []string{"registry.k8s.io/etcd:3.6.16-0", "registry.k8s.io/kube-apiserver:v1.37.2", "registry.k8s.io/pause:3.10.2"},
			warn: "file=/etc/kubernetes/manifests/README"},
		{name: "nothing rendered yet", want: []string{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			for p, c := range tc.files {
				os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755)
				os.WriteFile(filepath.Join(root, p), []byte(c), 0o644)
			}
			if tc.link {
				if err := os.Symlink(filepath.Join(root, "/var/lib/etcd/etcd.manifest"), filepath.Join(root, nodeimage.ManifestsDir, "etcd.manifest")); err != nil {
					t.Fatal(err)
				}
			}
			var logs strings.Builder
			got, err := KubeletImages(root, slog.New(slog.NewTextHandler(&logs, nil)))
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) || got == nil {
				t.Errorf("KubeletImages = %#v, want %q (never nil: nil asks an import for every image)", got, tc.want)
			}
			if tc.warn != "" && !strings.Contains(logs.String(), tc.warn) {
				t.Errorf("no warning naming %s:\n%s", tc.warn, logs.String())
			}
		})
	}
}
