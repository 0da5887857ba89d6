package bake

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/kilnproject/kiln/builder/artifact"
	"github.com/kilnproject/kiln/builder/rootfs"
	"github.com/kilnproject/kiln/builder/spec"
	"github.com/kilnproject/kiln/initd/systemd"
)

// applyOverlays applies the profile overlay documents in files to prof, in order. Each entry
// of an overlay must name an artifact or image of some profile in the definition's profiles
// directory (not necessarily this role's), so that a typo fails loudly.
func applyOverlays(def *spec.Definition, prof *spec.Profile, files []string, log *slog.Logger) (*spec.Profile, error) {
	if len(files) == 0 {
		return prof, nil
	}
	all, err := spec.LoadProfiles(def.ProfilesDir)
	if err != nil {
		return nil, err
	}
	var errs []error
	for _, f := range files {
		ov, err := spec.LoadProfileOverlay(f)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if err := ov.Check(all); err != nil {
			errs = append(errs, err)
			continue
		}
		prof = ov.Apply(prof)
		log.Info("profile overlay", "file", ov.File, "artifacts", len(ov.Artifacts), "images", len(ov.Images))
	}
	return prof, errors.Join(errs...)
}

func (b *baker) fetchImages() ([]*artifact.CachedImage, error) {
	if b.o.WithoutImages {
		return nil, nil
	}
	srcs, err := artifact.ImageSources(b.prof, b.lock)
	if err != nil {
		return nil, err
	}
	out := make([]*artifact.CachedImage, 0, len(srcs))
	for _, s := range srcs {
		ci, err := b.o.Cache.FetchImage(b.ctx, s, b.o.ImageFetch)
		if err != nil {
			return nil, err
		}
		out = append(out, ci)
	}
	return out, nil
}

// addKubernetes checks the binaries in the tree against the profile's kubernetes section,
// enables the runtime's units and lays the pre-pulled images into one OCI layout.
func (b *baker) addKubernetes(tree *rootfs.Tree, k spec.Kubernetes, images []*artifact.CachedImage) (*KubernetesInfo, error) {
	prof := b.prof
	t := time.Now()
	v, err := ReadVersions(b.ctx, tree.Dir)
	if err == nil {
		err = CheckVersions(k, v)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: kubernetes %s (runtime %s): %w", k.Pos, k.Version, k.Runtime, err)
	}
	attrs := []any{"kubelet", v.Kubelet.Version}
	if v.Containerd != nil {
		attrs = append(attrs, "containerd", v.Containerd.Version)
	}
	b.log.Info("versions checked", append(attrs, "seconds", time.Since(t).Round(time.Millisecond).Seconds())...)

	for _, u := range runtimeUnits[k.Runtime] {
		if slices.Contains(prof.Units.Disable, u) || slices.Contains(prof.Units.Mask, u) {
			return nil, fmt.Errorf("%s: units: %s is disabled or masked, but kubernetes.runtime %s needs it", prof.File, u, k.Runtime)
		}
		if _, err := systemd.Enable(tree.Dir, u); err != nil {
			return nil, fmt.Errorf("%s: kubernetes.runtime %s: %w (an overlay such as overlays/kubernetes ships the unit)", k.Pos, k.Runtime, err)
		}
	}

	info := &KubernetesInfo{Version: k.Version, Runtime: k.Runtime, Images: []ImageInfo{}}
	if v.Containerd != nil {
		info.Containerd = v.Containerd.Version
	}
	if b.o.WithoutImages && len(prof.Images) > 0 {
		info.ImagesLeftOut = true
		b.log.Warn("pre-pulled images left out: nodes pull them from a registry at first boot", "images", len(prof.Images))
		return info, nil
	}
	if len(images) == 0 {
		return info, nil
	}
	t = time.Now()
	tags := make([]string, len(prof.Images))
	for i, im := range prof.Images {
		tags[i] = im.Tag()
		info.Images = append(info.Images, ImageInfo{Name: im.Name, Digest: images[i].Manifest.Digest.String()})
	}
	if err := writeImageLayout(tree, ImagesDir, b.o.Cache, images, tags); err != nil {
		return nil, fmt.Errorf("pre-pulled images: %w", err)
	}
	var size int64
	seen := map[string]bool{}
	for _, im := range images {
		for _, d := range im.Blobs() {
			if !seen[d.Digest.Hex] {
				seen[d.Digest.Hex] = true
				size += d.Size
			}
		}
	}
	b.log.Info("images laid", "images", len(images), "blobs", len(seen), "bytes", size, "seconds", time.Since(t).Round(time.Millisecond).Seconds())
	return info, nil
}
