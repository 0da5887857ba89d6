package artifact

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/kilnproject/kiln/internal/fetch"
)

// parseReference parses an image reference. Registries on the loopback
// interface (localhost, 127.0.0.0/8, ::1) are spoken to over plain HTTP, as
// a test or mirror registry there usually is; every other registry over
// HTTPS.
func parseReference(s string) (name.Reference, error) {
	ref, err := name.ParseReference(s, name.StrictValidation)
	if err != nil {
		return nil, err
	}
	if isLoopback(ref.Context().RegistryStr()) {
		return name.ParseReference(s, name.StrictValidation, name.Insecure)
	}
	return ref, nil
}

func isLoopback(registry string) bool {
	host := registry
	if h, _, err := net.SplitHostPort(registry); err == nil {
		host = h
	}
	host = strings.Trim(host, "[]")
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// imageResolver finds the digest ("sha256:…") of the image manifest a pull
// reference names; for a multi-platform index, that of its linux/amd64
// image. OCIResolver implements it.
type imageResolver interface {
	ResolveImage(ctx context.Context, source string) (digest string, err error)
}

// ResolveImage implements imageResolver with a HEAD request (and a GET of
// the index when the reference names one).
func (r OCIResolver) ResolveImage(ctx context.Context, source string) (string, error) {
	ref, err := parseReference(source)
	if err != nil {
		return "", fmt.Errorf("%s: %w", source, err)
	}
	opts := remoteOptions(ctx, r.Remote)
	desc, err := remote.Head(ref, opts...)
	if err != nil {
		return "", fmt.Errorf("%s: %w", source, RegistryError(ref.Context().RegistryStr(), err))
	}
	if !desc.MediaType.IsIndex() {
		if !desc.MediaType.IsImage() {
			return "", fmt.Errorf("%s: %s is not an image manifest", source, desc.MediaType)
		}
		return desc.Digest.String(), nil
	}
	idx, err := remote.Index(ref.Context().Digest(desc.Digest.String()), opts...)
	if err != nil {
		return "", fmt.Errorf("%s: %w", source, RegistryError(ref.Context().RegistryStr(), err))
	}
	return r.platformDigest(source, idx)
}

// ImageSource is a container image to fetch: the image manifest Digest
// pulled from the repository of Source; Name is what the node calls it.
type ImageSource struct {
	Name   string
	Source string
	Digest string
}

// CachedImage is a container image whose manifest, config and layers are
// all in the cache, each verified against its digest when it was stored.
type CachedImage struct {
	Name string
	// Manifest is the image manifest's descriptor (media type, size, digest).
	Manifest v1.Descriptor
	// Config and Layers are the blobs the manifest names.
	Config v1.Descriptor
	Layers []v1.Descriptor
	// Platform is the image's os/architecture from its config (nil when the
	// config does not say).
	Platform *v1.Platform
}

// Blobs are the manifest, the config and the layers, in that order.
func (ci *CachedImage) Blobs() []v1.Descriptor {
	return append([]v1.Descriptor{ci.Manifest, ci.Config}, ci.Layers...)
}

// ImageFetch says how to reach registries; the zero value uses RemoteOptions(nil):
// credentials from the default keychain, anonymous where it has none.
type ImageFetch struct {
	// Remote options (auth, retries, transport) for registry requests; nil means
	// RemoteOptions(nil).
	Remote []remote.Option
	// Platform the image must be for; default linux/amd64.
	Platform *v1.Platform
}

// FetchImage makes sure the image manifest s.Digest, its config and its
// layers are in the cache, fetching from s.Source's repository what is
// missing. When everything is cached it contacts no registry. Every blob
// is hashed while it is stored and must match its digest; a manifest list
// (index) or an image for another platform is refused, since the bake
// stores exactly the manifest that was pinned.
func (c *Cache) FetchImage(ctx context.Context, s ImageSource, f ImageFetch) (*CachedImage, error) {
	label := fmt.Sprintf("image %q", s.Name)
	want, err := v1.NewHash(s.Digest)
	if err != nil || !hexRE.MatchString(want.Hex) || want.Algorithm != "sha256" {
		return nil, fmt.Errorf("%s: digest %q is not sha256:<64 hex> (run kiln lock)", label, s.Digest)
	}
	x := &imageFetcher{c: c, ctx: ctx, s: s, f: f, label: label, want: want}
	start := time.Now()
	raw, err := x.manifest()
	if err != nil {
		return nil, err
	}
	m, mt, err := parseImageManifest(raw, label, want)
	if err != nil {
		return nil, err
	}
	ci := &CachedImage{
		Name:     s.Name,
		Manifest: v1.Descriptor{MediaType: mt, Size: int64(len(raw)), Digest: want},
		Config:   m.Config,
		Layers:   m.Layers,
	}
	if err := x.blobs(append([]v1.Descriptor{m.Config}, m.Layers...)); err != nil {
		return nil, err
	}
	if ci.Platform, err = x.platform(m.Config); err != nil {
		return nil, err
	}
	if x.fetched > 0 {
		c.logger().Info("fetched", "image", s.Name, "source", s.Source, "digest", want.String(), "bytes", x.fetched, "took", time.Since(start).Round(time.Millisecond))
	}
	return ci, nil
}

// imageFetcher is one FetchImage: what it fetches, the registry repository it reaches on
// first need, and the bytes it fetched so far.
type imageFetcher struct {
	c     *Cache
	ctx   context.Context
	s     ImageSource
	f     ImageFetch
	label string // `image "registry.k8s.io/pause:3.10"`
	want  v1.Hash
	// repo and opts are set by remote.
	repo    name.Repository
	opts    []remote.Option
	fetched int64
}

// remote returns the repository of the image's source and the options to reach it.
func (x *imageFetcher) remote() (name.Repository, []remote.Option, error) {
	if x.opts == nil {
		ref, err := parseReference(x.s.Source)
		if err != nil {
			return x.repo, nil, fmt.Errorf("%s: source %s: %w", x.label, x.s.Source, err)
		}
		x.repo = ref.Context()
		x.opts = remoteOptions(x.ctx, x.f.Remote)
		if t := x.c.Client; t != nil && t.Transport != nil {
			x.opts = append([]remote.Option{remote.WithTransport(t.Transport)}, x.opts...)
		}
	}
	return x.repo, x.opts, nil
}

// manifest returns the pinned manifest, from the cache or else fetched into it.
func (x *imageFetcher) manifest() ([]byte, error) {
	if raw, err := x.c.readBlob(x.want.Hex); err == nil {
		return raw, nil
	}
	repo, opts, err := x.remote()
	if err != nil {
		return nil, err
	}
	desc, err := remote.Get(repo.Digest(x.want.String()), opts...)
	if err != nil {
		return nil, fmt.Errorf("%s: %s@%s: %w", x.label, repo, x.want, RegistryError(repo.RegistryStr(), err))
	}
	got, _, n, err := x.c.put(x.want.Hex, func(w *blobFile) error {
		_, err := w.Write(desc.Manifest)
		return err
	})
	if err != nil {
		if errors.Is(err, errMismatch) {
			return nil, fmt.Errorf("%s: manifest from %s hashes to sha256:%s, want %s", x.label, repo, got, x.want)
		}
		return nil, fmt.Errorf("%s: %w", x.label, err)
	}
	x.fetched += n
	return desc.Manifest, nil
}

// parseImageManifest parses raw, the manifest want, and returns it with its media type;
// an index or anything but an image manifest is refused.
func parseImageManifest(raw []byte, label string, want v1.Hash) (*v1.Manifest, types.MediaType, error) {
	var head struct {
		MediaType types.MediaType `json:"mediaType"`
		Manifests json.RawMessage `json:"manifests"`
	}
	if err := json.Unmarshal(raw, &head); err != nil {
		return nil, "", fmt.Errorf("%s: manifest %s: %w", label, want, err)
	}
	if head.MediaType.IsIndex() || len(head.Manifests) > 0 {
		return nil, "", fmt.Errorf("%s: %s is a multi-platform index, not an image manifest; pin the linux/amd64 image's digest (kiln lock does)", label, want)
	}
	if head.MediaType != "" && !head.MediaType.IsImage() {
		return nil, "", fmt.Errorf("%s: %s has media type %s, not an image manifest", label, want, head.MediaType)
	}
	m, err := v1.ParseManifest(bytes.NewReader(raw))
	if err != nil {
		return nil, "", fmt.Errorf("%s: manifest %s: %w", label, want, err)
	}
	mt := m.MediaType
	if mt == "" {
		mt = types.OCIManifestSchema1
	}
	return m, mt, nil
}

// blobs fetches into the cache each blob of ds it does not hold yet.
func (x *imageFetcher) blobs(ds []v1.Descriptor) error {
	for _, d := range ds {
		if err := checkSHA256(d.Digest); err != nil {
			return fmt.Errorf("%s: %w", x.label, err)
		}
		if _, ok := x.c.Has(d.Digest.Hex); ok {
			continue
		}
		repo, opts, err := x.remote()
		if err != nil {
			return err
		}
		_, n, err := x.c.FetchRemoteBlob(x.ctx, repo, d, opts)
		if err != nil {
			return fmt.Errorf("%s: %w", x.label, err)
		}
		x.fetched += n
	}
	return nil
}

func checkSHA256(h v1.Hash) error {
	if h.Algorithm != "sha256" || !hexRE.MatchString(h.Hex) {
		return fmt.Errorf("blob digest %s is not sha256", h)
	}
	return nil
}

// FetchRemoteBlob returns the path of the blob d of repo in the cache, downloading it first
// unless the cache holds it, and how many bytes it downloaded. The registry client, given
// opts (RemoteOptions), retries failed requests; a body cut short, or that brings nothing
// for StallTimeout, is fetched again from the start as c.Retry says. A blob that arrives
// whole but does not hash to d.Digest is an error at once, never retried. A blob that fails
// leaves nothing in the cache.
func (c *Cache) FetchRemoteBlob(ctx context.Context, repo name.Repository, d v1.Descriptor, opts []remote.Option) (string, int64, error) {
	if err := checkSHA256(d.Digest); err != nil {
		return "", 0, err
	}
	if p, ok := c.Has(d.Digest.Hex); ok {
		return p, 0, nil
	}
	var n int64
	url := repo.Digest(d.Digest.String()).String()
	err := c.retry(ctx, url, nil, func(ctx context.Context) error {
		var err error
		n, err = c.putRemoteBlob(ctx, repo, d, opts)
		return err
	})
	if err != nil {
		return "", n, err
	}
	return c.blobPath(d.Digest.Hex), n, nil
}

// platform returns the image's os/architecture from its config (nil when the config does
// not say), refusing an image for another platform than the fetch wants.
func (x *imageFetcher) platform(config v1.Descriptor) (*v1.Platform, error) {
	cfg, err := x.c.readBlob(config.Digest.Hex)
	if err != nil {
		return nil, fmt.Errorf("%s: config: %w", x.label, err)
	}
	cf, err := v1.ParseConfigFile(bytes.NewReader(cfg))
	if err != nil {
		return nil, fmt.Errorf("%s: config %s: %w", x.label, config.Digest, err)
	}
	if cf.OS == "" && cf.Architecture == "" {
		return nil, nil
	}
	wantP := v1.Platform{OS: "linux", Architecture: "amd64"}
	if x.f.Platform != nil {
		wantP = *x.f.Platform
	}
	p := &v1.Platform{OS: cf.OS, Architecture: cf.Architecture, Variant: cf.Variant}
	if cf.OS != wantP.OS || cf.Architecture != wantP.Architecture {
		return nil, fmt.Errorf("%s: %s is a %s image; nodes need %s", x.label, x.want, p, wantP.String())
	}
	return p, nil
}

// readBlob returns the content of a cached blob.
func (c *Cache) readBlob(hex string) ([]byte, error) {
	p, ok := c.Has(hex)
	if !ok {
		return nil, fmt.Errorf("blob sha256:%s: %w", hex, os.ErrNotExist)
	}
	return os.ReadFile(p)
}

// putRemoteBlob downloads the blob d of repo into the cache, failing if
// it receives nothing for StallTimeout or does not hash to d.Digest. A stall or a body cut
// short is worth another attempt (the registry client retried the request itself already);
// every other failure is marked fetch.Permanent.
func (c *Cache) putRemoteBlob(ctx context.Context, repo name.Repository, d v1.Descriptor, opts []remote.Option) (int64, error) {
	ctx, watch := c.watchStalls(ctx)
	defer watch.Stop()
	ref := repo.Digest(d.Digest.String())
	l, err := remote.Layer(ref, append(opts, remote.WithContext(ctx))...)
	if err != nil {
		return 0, fetch.Permanent(fmt.Errorf("%s: %w", ref, RegistryError(repo.RegistryStr(), fetch.Cause(ctx, err))))
	}
	var cut bool // the body was cut short or stalled
	got, _, n, err := c.put(d.Digest.Hex, func(w *blobFile) error {
		rc, err := l.Compressed()
		if err != nil {
			return err
		}
		defer rc.Close()
		r := watch.Reader(rc)
		if d.Size > 0 {
			// A registry sending more than the manifest says cannot fill the disk.
			r = io.LimitReader(r, d.Size+1)
		}
		_, err = io.Copy(w, r)
		cut = err != nil && cutShort(ctx, err)
		return err
	})
	switch {
	case errors.Is(err, errMismatch):
		return n, fetch.Permanent(fmt.Errorf("blob from %s hashes to sha256:%s, want %s", ref, got, d.Digest))
	case cut:
		return n, fmt.Errorf("%s: after %d bytes: %w", ref, n, fetch.Cause(ctx, err))
	case err != nil:
		return n, fetch.Permanent(fmt.Errorf("%s: %w", ref, RegistryError(repo.RegistryStr(), fetch.Cause(ctx, err))))
	case d.Size > 0 && n != d.Size:
		return n, fetch.Permanent(fmt.Errorf("%s: %d bytes, the manifest says %d", ref, n, d.Size))
	}
	return n, nil
}
