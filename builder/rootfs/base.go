package rootfs

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/kilnproject/kiln/builder/artifact"
)

// Source names where a base image comes from. Exactly one of Layout, Image or Tarball is set.
type Source struct {
	Layout  string // OCI image layout directory
	Image   string // registry reference (repository; the digest is given separately)
	Tarball string // docker save / OCI tarball
	Digest  string // sha256:… of the image manifest; required
}

func (s Source) String() string {
	switch {
	case s.Layout != "":
		return "oci-layout:" + s.Layout + "@" + s.Digest
	case s.Tarball != "":
		return "tarball:" + s.Tarball + "@" + s.Digest
	default:
		return s.Image + "@" + s.Digest
	}
}

// OpenBase returns the base image named by src after checking that its manifest hashes to
// src.Digest and that its config matches the manifest. Layers are verified as they are read by
// Flatten. A registry is reached with opts (artifact.RemoteOptions: credentials, retries), or
// artifact.RemoteOptions(nil) when none are given; FlattenWith then downloads its layers with
// artifact.Cache.FetchRemoteBlob, so a layer body cut short or stalled is fetched again as the
// cache's DownloadRetry says.
func OpenBase(ctx context.Context, src Source, opts ...remote.Option) (v1.Image, error) {
	want, err := v1.NewHash(src.Digest)
	if err != nil {
		return nil, fmt.Errorf("base %s: digest: %w", src, err)
	}
	var img v1.Image
	switch {
	case src.Layout != "":
		if _, err := os.Stat(src.Layout); err != nil {
			return nil, fmt.Errorf("base %s: %w (build the default base with `make base`)", src, err)
		}
		p, err := layout.FromPath(src.Layout)
		if err != nil {
			return nil, fmt.Errorf("base %s: %w", src, err)
		}
		img, err = p.Image(want)
		if err != nil {
			return nil, fmt.Errorf("base %s: no image with that digest in the layout: %w", src, err)
		}
	case src.Tarball != "":
		img, err = tarball.ImageFromPath(src.Tarball, nil)
		if err != nil {
			return nil, fmt.Errorf("base %s: %w", src, err)
		}
	case src.Image != "":
		ref, err := name.NewDigest(src.Image + "@" + src.Digest)
		if err != nil {
			return nil, fmt.Errorf("base %s: %w", src, err)
		}
		if opts == nil {
			opts = artifact.RemoteOptions(nil)
		}
		img, err = remote.Image(ref, append([]remote.Option{remote.WithContext(ctx)}, opts...)...)
		if err != nil {
			return nil, fmt.Errorf("base %s: %w", src, artifact.RegistryError(ref.RegistryStr(), err))
		}
		img = &registryImage{Image: img, ctx: ctx, repo: ref.Context(), opts: opts}
	default:
		return nil, fmt.Errorf("base: no source given (layout, image or tarball)")
	}
	raw, err := img.RawManifest()
	if err != nil {
		return nil, fmt.Errorf("base %s: read manifest: %w", src, err)
	}
	if got := sha256Hex(raw); "sha256:"+got != want.String() {
		return nil, fmt.Errorf("base %s: manifest digest mismatch: want %s, got sha256:%s", src, want, got)
	}
	m, err := img.Manifest()
	if err != nil {
		return nil, fmt.Errorf("base %s: parse manifest: %w", src, err)
	}
	cfg, err := img.RawConfigFile()
	if err != nil {
		return nil, fmt.Errorf("base %s: read config: %w", src, err)
	}
	if got := sha256Hex(cfg); "sha256:"+got != m.Config.Digest.String() {
		return nil, fmt.Errorf("base %s: config digest mismatch: want %s, got sha256:%s", src, m.Config.Digest, got)
	}
	if _, err := v1.ParseConfigFile(bytes.NewReader(cfg)); err != nil {
		return nil, fmt.Errorf("base %s: parse config: %w", src, err)
	}
	return img, nil
}

func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// registryImage is a base image read from a registry: FlattenWith fetches its layers through
// the cache's download retry rather than reading them once from the image.
type registryImage struct {
	v1.Image
	// ctx is the context OpenBase was given, which the registry client's requests for the
	// image already use.
	ctx  context.Context
	repo name.Repository
	opts []remote.Option
}

// fetchLayer stores the layer d in c (see artifact.Cache.FetchRemoteBlob) and returns its path.
func (r *registryImage) fetchLayer(c *artifact.Cache, d v1.Descriptor) (string, error) {
	p, _, err := c.FetchRemoteBlob(r.ctx, r.repo, d, r.opts)
	return p, err
}
