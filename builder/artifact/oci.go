package artifact

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/kilnproject/kiln/builder/spec"
)

// RefNameAnnotation tags images in an OCI layout's index.
const RefNameAnnotation = "org.opencontainers.image.ref.name"

// OCIResolver resolves base images with go-containerregistry: a layout's
// tag through its index annotations, a registry tag with a HEAD request, a
// tarball by reading its manifest. When the tag names a multi-platform
// index, the digest of the Platform image's manifest is returned, since
// that is the manifest the bake opens and verifies.
type OCIResolver struct {
	// Platform defaults to linux/amd64.
	Platform *v1.Platform
	// Remote options (auth, retries, transport) for registry lookups; nil means
	// RemoteOptions(nil).
	Remote []remote.Option
}

func (r OCIResolver) platform() v1.Platform {
	if r.Platform != nil {
		return *r.Platform
	}
	return v1.Platform{OS: "linux", Architecture: "amd64"}
}

// ResolveBase implements BaseResolver.
func (r OCIResolver) ResolveBase(ctx context.Context, b spec.Base) (string, error) {
	if b.Digest != "" {
		return b.Digest, nil
	}
	switch {
	case b.Layout != "":
		return r.layoutDigest(b)
	case b.Image != "":
		return r.remoteDigest(ctx, b)
	case b.Tarball != "":
		img, err := tarball.ImageFromPath(b.Tarball, nil)
		if err != nil {
			return "", fmt.Errorf("%s: %w", b.Ref, err)
		}
		h, err := img.Digest()
		if err != nil {
			return "", fmt.Errorf("%s: %w", b.Ref, err)
		}
		return h.String(), nil
	}
	return "", fmt.Errorf("base: no layout, image or tarball")
}

func (r OCIResolver) layoutDigest(b spec.Base) (string, error) {
	p, err := layout.FromPath(b.Layout)
	if err != nil {
		return "", fmt.Errorf("%s: open OCI layout %s: %w", b.Ref, b.Layout, err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		return "", fmt.Errorf("%s: %w", b.Ref, err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return "", fmt.Errorf("%s: %w", b.Ref, err)
	}
	var match []v1.Descriptor
	var tags []string
	for _, d := range im.Manifests {
		ref := d.Annotations[RefNameAnnotation]
		if ref != "" {
			tags = append(tags, ref)
		}
		if b.Tag == "" || tagMatches(ref, b.Tag) {
			match = append(match, d)
		}
	}
	sort.Strings(tags)
	switch {
	case len(match) == 0 && b.Tag == "":
		return "", fmt.Errorf("%s: the layout %s holds no image", b.Ref, b.Layout)
	case len(match) == 0:
		return "", fmt.Errorf("%s: no image tagged %q in the layout %s (tags: %s)", b.Ref, b.Tag, b.Layout, strings.Join(tags, ", "))
	case len(match) > 1 && b.Tag == "":
		return "", fmt.Errorf("%s: the layout %s holds %d images; choose one with tag: (tags: %s)", b.Ref, b.Layout, len(match), strings.Join(tags, ", "))
	case len(match) > 1:
		return "", fmt.Errorf("%s: %d images tagged %q in the layout %s", b.Ref, len(match), b.Tag, b.Layout)
	}
	d := match[0]
	if d.MediaType.IsIndex() {
		child, err := idx.ImageIndex(d.Digest)
		if err != nil {
			return "", fmt.Errorf("%s: %w", b.Ref, err)
		}
		return r.platformDigest(b.Ref, child)
	}
	return d.Digest.String(), nil
}

// tagMatches reports whether a ref.name annotation names tag: either the
// bare tag or a full reference ending in :tag.
func tagMatches(ref, tag string) bool {
	return ref == tag || strings.HasSuffix(ref, ":"+tag) && !strings.Contains(tag, "/")
}

func (r OCIResolver) platformDigest(label string, idx v1.ImageIndex) (string, error) {
	im, err := idx.IndexManifest()
	if err != nil {
		return "", fmt.Errorf("%s: %w", label, err)
	}
	want := r.platform()
	var have []string
	for _, d := range im.Manifests {
		if d.Platform == nil {
			continue
		}
		if d.Platform.OS == want.OS && d.Platform.Architecture == want.Architecture && (want.Variant == "" || d.Platform.Variant == want.Variant) && d.MediaType.IsImage() {
			return d.Digest.String(), nil
		}
		have = append(have, d.Platform.String())
	}
	return "", fmt.Errorf("%s: no %s image in the index (has: %s)", label, want.String(), strings.Join(have, ", "))
}

func (r OCIResolver) remoteDigest(ctx context.Context, b spec.Base) (string, error) {
	ref, err := name.ParseReference(b.Image)
	if err != nil {
		return "", fmt.Errorf("%s: %w", b.Ref, err)
	}
	reg := ref.Context().RegistryStr()
	opts := remoteOptions(ctx, r.Remote)
	desc, err := remote.Head(ref, opts...)
	if err != nil {
		return "", fmt.Errorf("%s: %w", b.Ref, RegistryError(reg, err))
	}
	if !desc.MediaType.IsIndex() {
		return desc.Digest.String(), nil
	}
	idx, err := remote.Index(ref.Context().Digest(desc.Digest.String()), opts...)
	if err != nil {
		return "", fmt.Errorf("%s: %w", b.Ref, RegistryError(reg, err))
	}
	return r.platformDigest(b.Ref, idx)
}
