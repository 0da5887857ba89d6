package bake

import (
	"fmt"
	"slices"
	"time"

	"github.com/kilnproject/kiln/builder/artifact"
	"github.com/kilnproject/kiln/builder/rootfs"
	"github.com/kilnproject/kiln/builder/spec"
	"github.com/kilnproject/kiln/initd/systemd"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

// addKubernetes checks the binaries in the tree against the profile's kubernetes section (skew.go),
// enables the runtime's units and lays the pre-pulled images (images.go). It returns the
// image's record of what it carries to run Kubernetes.
func (b *baker) addKubernetes(tree *rootfs.Tree, k spec.Kubernetes, images []*artifact.CachedImage) (*nodeimage.KubernetesInfo, error) {
	v, err := b.checkBinaries(tree.Dir, k)
	if err != nil {
		return nil, err
	}
	if err := enableRuntime(tree.Dir, k, b.prof); err != nil {
		return nil, err
	}
	info := &nodeimage.KubernetesInfo{Version: k.Version, Runtime: k.Runtime, Images: []nodeimage.ImageInfo{}}
	if v.Containerd != nil {
		info.Containerd = v.Containerd.Version
	}
	if b.o.WithoutImages && len(b.prof.Images) > 0 {
		info.ImagesLeftOut = true
		b.log.Warn("pre-pulled images left out: nodes pull them from a registry at first boot", "images", len(b.prof.Images))
		return info, nil
	}
	info.Images = b.imageInfos(images)
	// The store first: it says which images are ready, whose compressed layers the layout
	// then leaves out.
	if err := b.layStore(tree, k, images, info.Images); err != nil {
		return nil, err
	}
	runtime, _ := nodeimage.RuntimeOf(k.Runtime)
	if err := b.layImages(tree, images, info.Images, runtime.KeepLayers); err != nil {
		return nil, err
	}
	return info, nil
}

// checkBinaries reads the versions of the Kubernetes binaries in the tree at root and checks
// them against k.
func (b *baker) checkBinaries(root string, k spec.Kubernetes) (treeVersions, error) {
	t := time.Now()
	v, err := readVersions(b.ctx, root)
	if err == nil {
		err = checkVersions(k, v)
	}
	if err != nil {
		return v, fmt.Errorf("%s: kubernetes %s (runtime %s): %w", k.Pos, k.Version, k.Runtime, err)
	}
	attrs := []any{"kubelet", v.Kubelet.Version}
	if v.Containerd != nil {
		attrs = append(attrs, "containerd", v.Containerd.Version)
	}
	b.log.Info("versions checked", append(attrs, "seconds", time.Since(t).Round(time.Millisecond).Seconds())...)
	return v, nil
}

// runtimeUnits are the units the bake enables for each kubernetes.runtime.
var runtimeUnits = map[string][]string{
	"containerd": {"containerd.service"},
	"docker":     {"docker.service", "cri-docker.service"},
}

// enableRuntime enables the units k's runtime needs in the tree at root; the profile must not
// disable or mask them.
func enableRuntime(root string, k spec.Kubernetes, prof *spec.Profile) error {
	for _, u := range runtimeUnits[k.Runtime] {
		if slices.Contains(prof.Units.Disable, u) || slices.Contains(prof.Units.Mask, u) {
			return fmt.Errorf("%s: units: %s is disabled or masked, but kubernetes.runtime %s needs it", prof.File, u, k.Runtime)
		}
		if _, err := systemd.Enable(root, u); err != nil {
			return fmt.Errorf("%s: kubernetes.runtime %s: %w (an overlay such as overlays/kubernetes ships the unit)", k.Pos, k.Runtime, err)
		}
	}
	return nil
}
