package bake

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/kilnproject/kiln/builder/artifact"
	"github.com/kilnproject/kiln/builder/rootfs"
	"github.com/kilnproject/kiln/builder/spec"
	"github.com/kilnproject/kiln/initd/systemd"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

// layTree lays onto the base, in order: the profile's artifacts (blobs, from fetch), the
// definition's and then the profile's overlays, the profile's templates, kiln-init, what the
// profile's Kubernetes release needs (images, from fetch) and the units the profile enables,
// disables or masks; last, /etc/kiln/image.json. It records the artifacts, Kubernetes and
// what a node config may rely on (nodeimage.Contents) in md and returns image.json, which the
// ESP carries too.
func (b *baker) layTree(tree *rootfs.Tree, blobs []string, images []*artifact.CachedImage, md *nodeimage.Metadata) ([]byte, error) {
	t := time.Now()
	prof := b.prof
	for i, a := range prof.Artifacts {
		info, err := b.layArtifact(tree, a, blobs[i])
		if err != nil {
			return nil, err
		}
		md.Artifacts = append(md.Artifacts, info)
	}
	for _, ov := range slices.Concat(b.def.Overlays, prof.Overlays) {
		if err := tree.AddOverlay(ov); err != nil {
			return nil, fmt.Errorf("overlay %s: %w", ov, err)
		}
	}
	if prof.Templates != "" {
		if err := tree.AddDir(prof.Templates, nodeimage.TemplatesPath); err != nil {
			return nil, fmt.Errorf("%s: templates: %w", prof.File, err)
		}
	}
	if err := tree.AddFile("usr/bin/kiln-init", b.o.KilnInit, 0o755); err != nil {
		return nil, err
	}
	if k := prof.Kubernetes; k != nil {
		var err error
		if md.Kubernetes, err = b.addKubernetes(tree, *k, images); err != nil {
			return nil, err
		}
	}
	if err := setUnits(tree.Dir, prof); err != nil {
		return nil, err
	}
	contents, err := imageContents(tree.Dir)
	if err != nil {
		return nil, err
	}
	md.Contents = contents
	imageJSON, err := writeImageJSON(tree, md)
	if err != nil {
		return nil, err
	}
	b.step("tree assembled", t)
	return imageJSON, nil
}

// layArtifact lays the artifact a, whose verified blob is in the cache, into the tree: the
// blob itself as the file a.Dest, or what a.Extract picks out of it. It returns the artifact's
// record for image.json. What an artifact lays is kept in the cache's artifact-trees/, by the
// blob's sha256 and how it is laid, and linked into the tree from there: a later bake with the
// same artifact neither copies nor decompresses it again.
func (b *baker) layArtifact(tree *rootfs.Tree, a spec.Artifact, blob string) (nodeimage.ArtifactInfo, error) {
	info := nodeimage.ArtifactInfo{Name: a.Name, Source: a.Source, SHA256: b.lock.SHA256(b.prof.Role, a), Dest: a.Dest}
	if x := a.Extract; x != nil {
		// The record names the directory the archive went to, or else the files it gave.
		info.Dest = x.Dir
		if info.Dest == "" {
			info.Dest = strings.Join(slices.Sorted(maps.Values(x.Files)), ",")
		}
	}
	laid, err := b.artifactTree(a, info.SHA256, blob)
	if err == nil {
		err = tree.LinkDir(laid)
	}
	if err != nil {
		return nodeimage.ArtifactInfo{}, fmt.Errorf("artifact %q: %w", a.Name, err)
	}
	return info, nil
}

// artifactTree returns a directory holding what the artifact a (blob, of sha256 sum) lays, at
// its paths in the image, to be read or linked from, never written: the cache's entry in
// artifact-trees/ or, the first time, the work directory's, which the cache then keeps.
func (b *baker) artifactTree(a spec.Artifact, sum, blob string) (string, error) {
	keyJSON, err := json.Marshal(struct {
		Layout  string        `json:"layout"`
		SHA256  string        `json:"sha256"`
		Dest    string        `json:"dest,omitempty"`
		Mode    os.FileMode   `json:"mode,omitempty"`
		Extract *spec.Extract `json:"extract,omitempty"`
	}{"kiln artifact tree 1", sum, a.Dest, a.Mode, a.Extract})
	if err != nil {
		return "", err
	}
	key := fmt.Sprintf("%x", sha256.Sum256(keyJSON))
	cache := rootfs.TreeCache{Dir: filepath.Join(b.o.Cache.Root, artifactTreesDir)}
	if cached, ok, err := cache.Open(key); err != nil || ok {
		if err != nil {
			return "", err
		}
		return cached.Dir, nil
	}
	dir := filepath.Join(b.work, "artifacts", key)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	laid := &rootfs.Tree{Dir: dir, Owners: map[string]rootfs.Owner{}}
	if x := a.Extract; x == nil {
		err = laid.AddFile(strings.TrimPrefix(a.Dest, "/"), blob, a.Mode)
	} else {
		_, err = artifact.Extract(blob, *x, dir, artifact.MaxUnpacked)
	}
	if err != nil {
		return "", err
	}
	if err := cache.Store(key, laid); err != nil {
		b.log.Warn("artifact not cached: the next bake lays it again", "artifact", a.Name, "err", err)
	}
	return dir, nil
}

// setUnits enables, disables and masks the profile's units in the tree at root, the way
// kiln-init does a config's units at first boot.
func setUnits(root string, prof *spec.Profile) error {
	for _, set := range []struct {
		field string
		units []string
		apply func(root, unit string) (changed bool, err error)
	}{
		{"units.enable", prof.Units.Enable, systemd.Enable},
		{"units.disable", prof.Units.Disable, systemd.Disable},
		{"units.mask", prof.Units.Mask, systemd.Mask},
	} {
		for _, u := range set.units {
			if _, err := set.apply(root, u); err != nil {
				return fmt.Errorf("%s: %s: %w", prof.File, set.field, err)
			}
		}
	}
	return nil
}
