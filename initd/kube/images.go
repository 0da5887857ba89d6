package kube

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/kilnproject/kiln/internal/nodeimage"
	"github.com/kilnproject/kiln/internal/poll"
)

// Annotations of an image's descriptor in the layout's index.json.
const (
	annotationImageName = "io.containerd.image.name"          // the full name, registry.k8s.io/pause:3.10.2
	annotationRefName   = "org.opencontainers.image.ref.name" // the tag
)

// LayoutImage is one image of an OCI layout.
type LayoutImage struct {
	name   string // annotationImageName
	digest string // sha256:… of its manifest (or index)
}

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
	Platform    json.RawMessage   `json:"platform,omitempty"`
}

type ociIndex struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType,omitempty"`
	Manifests     []descriptor `json:"manifests"`
}

type ociManifest struct {
	Config    descriptor   `json:"config"`
	Layers    []descriptor `json:"layers"`
	Manifests []descriptor `json:"manifests"` // when the blob is itself an index
}

// ReadLayout lists the images of the OCI layout in dir, in index order. Every descriptor
// must carry the io.containerd.image.name annotation.
func ReadLayout(dir string) ([]LayoutImage, error) {
	idx, err := readIndex(dir)
	if err != nil {
		return nil, err
	}
	var out []LayoutImage
	for i, d := range idx.Manifests {
		name := d.Annotations[annotationImageName]
		if name == "" {
			return nil, fmt.Errorf("%s: manifests[%d] (%s) has no %s annotation", filepath.Join(dir, "index.json"), i, d.Digest, annotationImageName)
		}
		out = append(out, LayoutImage{name: name, digest: d.Digest})
	}
	return out, nil
}

func readIndex(dir string) (*ociIndex, error) {
	p := filepath.Join(dir, "index.json")
	data, err := os.ReadFile(p)
	if err != nil {
		return nil, fmt.Errorf("image layout: %w", err)
	}
	var idx ociIndex
	if err := json.Unmarshal(data, &idx); err != nil {
		return nil, fmt.Errorf("image layout %s: %w", p, err)
	}
	return &idx, nil
}

func blobPath(dir, digest string) (string, error) {
	alg, hex, ok := strings.Cut(digest, ":")
	if !ok || alg == "" || hex == "" || strings.ContainsAny(digest, "/\\.") {
		return "", fmt.Errorf("image layout %s: bad digest %q", dir, digest)
	}
	return filepath.Join(dir, "blobs", alg, hex), nil
}

// writeLayoutTar writes a tar stream of the OCI layout in dir holding only the images
// keep selects: oci-layout, an index.json with their descriptors and every blob they
// reach (an image index's children for other platforms may be absent from the layout
// and are then left out). Blobs shared between images are written once. This is what
// `ctr images import` reads.
func writeLayoutTar(w io.Writer, dir string, keep func(LayoutImage) bool) error {
	idx, err := readIndex(dir)
	if err != nil {
		return err
	}
	sel := *idx
	sel.Manifests = nil
	for _, d := range idx.Manifests {
		if keep(LayoutImage{name: d.Annotations[annotationImageName], digest: d.Digest}) {
			sel.Manifests = append(sel.Manifests, d)
		}
	}
	bw := blobWalk{dir: dir, seen: map[string]bool{}}
	for _, d := range sel.Manifests {
		if err := bw.walk(d, false); err != nil {
			return err
		}
	}
	return tarLayout(w, dir, &sel, bw.blobs)
}

// blobWalk collects the blobs of a layout that descriptors reach, each once.
type blobWalk struct {
	dir   string
	seen  map[string]bool
	blobs []string // digests, in the order reached
}

// walk adds d's blob and, for a manifest or index, the blobs it references. An optional
// blob (an index's child) that the layout lacks is skipped.
func (b *blobWalk) walk(d descriptor, optional bool) error {
	if b.seen[d.Digest] {
		return nil
	}
	p, err := blobPath(b.dir, d.Digest)
	if err != nil {
		return err
	}
	if _, err := os.Stat(p); err != nil {
		if optional && errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("image layout %s: blob %s: %w", b.dir, d.Digest, err)
	}
	b.seen[d.Digest] = true
	b.blobs = append(b.blobs, d.Digest)
	if !isManifestType(d.MediaType) {
		return nil
	}
	data, err := os.ReadFile(p)
	if err != nil {
		return fmt.Errorf("image layout %s: %w", b.dir, err)
	}
	var m ociManifest
	if err := json.Unmarshal(data, &m); err != nil {
		return fmt.Errorf("image layout %s: manifest %s: %w", b.dir, d.Digest, err)
	}
	for _, c := range m.Manifests {
		if err := b.walk(c, true); err != nil {
			return err
		}
	}
	if m.Config.Digest != "" {
		if err := b.walk(m.Config, false); err != nil {
			return err
		}
	}
	for _, l := range m.Layers {
		if err := b.walk(l, false); err != nil {
			return err
		}
	}
	return nil
}

// tarLayout writes the tar: dir's oci-layout (or the standard one), index as
// index.json, then the blobs (digests) from dir.
func tarLayout(w io.Writer, dir string, index *ociIndex, blobs []string) error {
	tw := tar.NewWriter(w)
	layout := []byte(`{"imageLayoutVersion":"1.0.0"}`)
	if b, err := os.ReadFile(filepath.Join(dir, "oci-layout")); err == nil {
		layout = b
	}
	if err := addTar(tw, "oci-layout", int64(len(layout)), bytes.NewReader(layout)); err != nil {
		return err
	}
	data, err := json.Marshal(index)
	if err != nil {
		return fmt.Errorf("image tar index.json: %w", err)
	}
	if err := addTar(tw, "index.json", int64(len(data)), bytes.NewReader(data)); err != nil {
		return err
	}
	for _, dg := range blobs {
		if err := addBlob(tw, dir, dg); err != nil {
			return err
		}
	}
	return tw.Close()
}

// addBlob adds the blob digest of the layout in dir, under its path in the layout.
func addBlob(tw *tar.Writer, dir, digest string) error {
	p, err := blobPath(dir, digest)
	if err != nil {
		return err
	}
	f, err := os.Open(p)
	if err != nil {
		return fmt.Errorf("image layout %s: %w", dir, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("image layout %s: %w", dir, err)
	}
	rel, _ := filepath.Rel(dir, p)
	return addTar(tw, filepath.ToSlash(rel), fi.Size(), f)
}

// addTar adds a regular file of size bytes read from r, mode 0644, time zero.
func addTar(tw *tar.Writer, name string, size int64, r io.Reader) error {
	hdr := &tar.Header{Name: name, Mode: 0o644, Size: size, Typeflag: tar.TypeReg, ModTime: time.Unix(0, 0), Format: tar.FormatPAX}
	if err := tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("image tar %s: %w", name, err)
	}
	if _, err := io.Copy(tw, r); err != nil {
		return fmt.Errorf("image tar %s: %w", name, err)
	}
	return nil
}

func isManifestType(mt string) bool {
	switch mt {
	case "application/vnd.oci.image.manifest.v1+json", "application/vnd.oci.image.index.v1+json",
		"application/vnd.docker.distribution.manifest.v2+json", "application/vnd.docker.distribution.manifest.list.v2+json":
		return true
	}
	return false
}

// Ctr runs containerd's ctr against one namespace of one containerd.
type Ctr struct {
	// Path is the ctr binary; "" means "ctr" on PATH.
	Path string
	// Address is containerd's socket; "" means ctr's default (/run/containerd/containerd.sock).
	Address string
	// Namespace is the containerd namespace; "" means "k8s.io" (the CRI's).
	Namespace string
}

func (c Ctr) cmd(ctx context.Context, args ...string) *exec.Cmd {
	bin := c.Path
	if bin == "" {
		bin = "ctr"
	}
	ns := c.Namespace
	if ns == "" {
		ns = "k8s.io"
	}
	pre := []string{"--namespace", ns}
	if c.Address != "" {
		pre = append([]string{"--address", c.Address}, pre...)
	}
	return exec.CommandContext(ctx, bin, append(pre, args...)...)
}

// images lists the images containerd has: name → target digest.
func (c Ctr) images(ctx context.Context) (map[string]string, error) {
	cmd := c.cmd(ctx, "images", "list")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("ctr images list: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	have := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for first := true; sc.Scan(); first = false {
		f := strings.Fields(sc.Text())
		if first || len(f) < 3 {
			continue // the REF TYPE DIGEST… header
		}
		have[f[0]] = f[2]
	}
	return have, nil
}

// importLayout streams a tar of the images of the layout dir that keep selects into
// `ctr images import -`, which names each image by its annotationImageName and unpacks
// it for the default snapshotter.
func (c Ctr) importLayout(ctx context.Context, dir string, keep func(LayoutImage) bool) error {
	args := []string{"images", "import"}
	labels := nodeimage.RuntimeImageLabels()
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		args = append(args, "--label", k+"="+labels[k])
	}
	cmd := c.cmd(ctx, append(args, "-")...)
	pr, pw := io.Pipe()
	cmd.Stdin = pr
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("ctr images import: %w", err)
	}
	werr := writeLayoutTar(pw, dir, keep)
	pw.CloseWithError(werr)
	err := cmd.Wait()
	pr.Close()
	if werr != nil {
		return werr
	}
	if err != nil {
		return fmt.Errorf("ctr images import: %w: %s", err, lastLines(out.String(), 5))
	}
	return nil
}

// lastLines keeps the end of a command's output for an error message.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "; ")
}

// ImportOptions configure ImportImages.
type ImportOptions struct {
	// Layout is the OCI layout; "" means nodeimage.ImagesPath.
	Layout string
	// Ctr reaches containerd.
	Ctr Ctr
	// wait bounds how long to wait for containerd to answer; 0 means 2 minutes.
	wait time.Duration
	// Log receives progress; nil discards it.
	Log *slog.Logger
	// Only, when not nil, limits the import to these image names (names the layout does
	// not hold are logged and skipped).
	Only []string
}

// ImportImages makes containerd hold every image of the layout: it lists what containerd
// has, and imports (in one stream) the images it lacks or holds with another digest. It
// returns the names it imported; none when everything was present.
func ImportImages(ctx context.Context, o ImportOptions) (imported []string, err error) {
	if o.Layout == "" {
		o.Layout = nodeimage.ImagesPath
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.wait == 0 {
		o.wait = 2 * time.Minute
	}
	want, err := ReadLayout(o.Layout)
	if err != nil {
		return nil, err
	}
	if o.Only != nil {
		var kept []LayoutImage
		for _, im := range want {
			if slices.Contains(o.Only, im.name) {
				kept = append(kept, im)
			}
		}
		for _, name := range o.Only {
			if !slices.ContainsFunc(want, func(im LayoutImage) bool { return im.name == name }) {
				o.Log.Warn("image not pre-pulled: the runtime will pull it", "image", name)
			}
		}
		want = kept
		if len(want) == 0 {
			return nil, nil
		}
	}
	var have map[string]string
	err = waitUntil(ctx, o.wait, 2*time.Second, "its image list", func(ctx context.Context) (bool, error) {
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		var err error
		have, err = o.Ctr.images(ctx)
		return err == nil, err
	})
	if err != nil {
		return nil, fmt.Errorf("containerd does not answer: %w", err)
	}
	missing := map[string]bool{}
	for _, im := range want {
		if have[im.name] != im.digest {
			missing[im.name] = true
			imported = append(imported, im.name)
		}
	}
	if len(missing) == 0 {
		o.Log.Info("pre-pulled images present", "images", len(want))
		return nil, nil
	}
	o.Log.Info("importing pre-pulled images", "images", imported)
	if err := o.Ctr.importLayout(ctx, o.Layout, func(im LayoutImage) bool { return missing[im.name] }); err != nil {
		return nil, err
	}
	if have, err = o.Ctr.images(ctx); err != nil {
		return nil, err
	}
	for _, im := range want {
		if have[im.name] != im.digest {
			return imported, fmt.Errorf("image %s: containerd has %q after the import, want %s", im.name, have[im.name], im.digest)
		}
	}
	slices.Sort(imported)
	return imported, nil
}

// waitUntil calls f until it reports done or limit has passed, interval between two calls,
// and returns an error naming what and carrying the last error f returned. Each call runs
// to its end and the limit is checked between calls (see poll.Options.Timeout), so the error
// says what the last call found — "node has no pod CIDR yet" — however slow the machine is.
// Running out of time is context.DeadlineExceeded (poll.ErrTimeout), whatever the last error
// was, so the task run reports the step as timed out.
func waitUntil(ctx context.Context, limit, interval time.Duration, what string, f func(context.Context) (bool, error)) error {
	return poll.Until(ctx, poll.Options{What: what, Timeout: limit, Backoff: poll.Constant(interval)}, f)
}

// containerdConfig is containerd's configuration, relative to the node's root; KubeletImages
// reads its sandbox image there.
const containerdConfig = "/etc/containerd/config.toml"

var sandboxRE = regexp.MustCompile(`(?m)^\s*sandbox(?:_image)?\s*=\s*["']([^"']+)["']`)

// KubeletImages names the images kubelet needs before anything else on this node: the
// pod sandbox image of containerd's config and the images of the static pods in
// nodeimage.ManifestsDir (containers and init containers), sorted and never nil (an empty
// list limits an import to nothing; nil would mean every image). Like kubelet it reads every file
// there whose name does not start with a dot, following links (etcd's manifest is a link
// to its volume); a file that is not a pod is logged and skipped, as kubelet skips it.
// Importing these first lets kubelet start while the others (kube-proxy, CoreDNS: pods
// that appear only once the API serves) are imported beside it.
func KubeletImages(root string, log *slog.Logger) ([]string, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	set := map[string]bool{}
	if b, err := os.ReadFile(filepath.Join(root, containerdConfig)); err == nil {
		if m := sandboxRE.FindSubmatch(b); m != nil {
			set[string(m[1])] = true
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	entries, err := os.ReadDir(filepath.Join(root, nodeimage.ManifestsDir))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			continue
		}
		p := filepath.Join(nodeimage.ManifestsDir, e.Name())
		if fi, err := os.Stat(filepath.Join(root, p)); err != nil || !fi.Mode().IsRegular() {
			continue // a directory, or a link to a volume not mounted
		}
		b, err := os.ReadFile(filepath.Join(root, p))
		if err != nil {
			return nil, err
		}
		var pod struct {
			Kind string `yaml:"kind"`
			Spec struct {
				Containers     []struct{ Image string } `yaml:"containers"`
				InitContainers []struct{ Image string } `yaml:"initContainers"`
			} `yaml:"spec"`
		}
		if err := yaml.Unmarshal(b, &pod); err != nil || pod.Kind != "Pod" {
			log.Warn("not a static pod: skipped", "file", p, "error", err)
			continue
		}
		for _, c := range append(pod.Spec.InitContainers, pod.Spec.Containers...) {
			if c.Image != "" {
				set[c.Image] = true
			}
		}
	}
	out := slices.AppendSeq(make([]string, 0, len(set)), maps.Keys(set))
	slices.Sort(out)
	return out, nil
}
