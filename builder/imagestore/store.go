// Package imagestore lays containerd's image store for a node's pre-pulled images at bake, so
// that the images are ready when containerd first starts instead of being imported and
// unpacked at first boot.
//
// The store is written with containerd's own libraries (its metadata database, local content
// store and overlayfs snapshotter), the way a pull would leave it: image records, content
// records with the garbage-collection labels a pull sets, and one committed snapshot per image.
// Nothing large is copied into it. The content store holds each image's manifest and config,
// as symlinks to the blobs in the image's OCI layout, and, unless Options.KeepLayers, not its
// compressed layers: as containerd keeps an image pulled with discard_unpacked_layers, the
// manifest then references its config only, so the layers, once applied, are neither kept nor
// needed (the node runs the image; it cannot push or export it). Each image's snapshot is a symlink to a read-only
// directory holding the image's layers applied in order (whiteouts resolved), keyed by the
// image's chain ID. A container is then stacked directly on that directory by the overlayfs
// snapshotter.
//
// One snapshot holds the whole image rather than one per layer: the intermediate chain IDs do
// not exist, so an image pulled later that shares lower layers unpacks its own, and one that
// extends a seeded image stacks its extra layers on the seeded whole. Times are pinned and the
// databases compacted, so the same inputs give the same bytes.
package imagestore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/metadata"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/plugins/content/local"
	"github.com/containerd/containerd/v2/plugins/snapshots/overlay"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
	"github.com/opencontainers/image-spec/identity"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	bolt "go.etcd.io/bbolt"
)

// The directories of containerd's root, as containerd's plugins name them.
const (
	MetadataDir    = "io.containerd.metadata.v1.bolt"
	ContentDir     = "io.containerd.content.v1.content"
	SnapshotterDir = "io.containerd.snapshotter.v1.overlayfs"
	// MetadataFile is the metadata database, inside MetadataDir.
	MetadataFile = "meta.db"
)

// Snapshotter is the snapshotter the store is laid for: the CRI's default, and what the
// node's containerd config names.
const Snapshotter = "overlayfs"

// Image is one image to lay.
type Image struct {
	// Name is the image's full name, registry.k8s.io/pause:3.10.2.
	Name string
	// Manifest, Config and Layers are the image's blobs (a single-platform manifest).
	Manifest, Config ocispec.Descriptor
	Layers           []ocispec.Descriptor
	// DiffIDs are the layers' uncompressed digests, from the config.
	DiffIDs []digest.Digest
	// Tree is the host directory holding the image's layers applied in order. Write moves it
	// into the store and back out to TreeDest.
	Tree string
}

// ChainID is the identity of an image's applied layers: containerd's snapshot name for them.
func (im Image) ChainID() digest.Digest { return identity.ChainID(im.DiffIDs) }

// Options say where the store goes and where its symlinks point.
type Options struct {
	// Dir is the host directory the store is written to (it must not exist yet, or be empty).
	Dir string
	// HostBlob is where a blob is on the host at bake; NodeBlob where it is on the node.
	HostBlob, NodeBlob func(digest.Digest) string
	// TreeDest is the host directory an image's tree is moved to once the store records it;
	// NodeTree is where that directory is on the node.
	TreeDest, NodeTree func(chainID digest.Digest) string
	// Namespace is the containerd namespace the images are recorded in: the runtime's
	// (nodeimage.Runtime.Namespace).
	Namespace string
	// Labels are set on every image record.
	Labels map[string]string
	// Created is the time every record carries.
	Created time.Time
	// KeepLayers records the images' compressed layers too (symlinks into the layout, which
	// must then hold them), as a pull without discard_unpacked_layers leaves them.
	KeepLayers bool
}

// Write lays the store for images in o.Dir. On an error, o.Dir may hold a partial store
// (the caller removes it); an image's tree is either still at im.Tree or at its TreeDest.
func Write(ctx context.Context, o Options, imgs []Image) error {
	if o.Namespace == "" {
		return errors.New("no containerd namespace for the images")
	}
	ctx = namespaces.WithNamespace(ctx, o.Namespace)
	for _, d := range []string{MetadataDir, filepath.Join(ContentDir, "blobs", "sha256"), SnapshotterDir} {
		if err := os.MkdirAll(filepath.Join(o.Dir, d), 0o700); err != nil {
			return err
		}
	}
	cs, err := local.NewStore(filepath.Join(o.Dir, ContentDir))
	if err != nil {
		return fmt.Errorf("content store: %w", err)
	}
	sn, err := overlay.NewSnapshotter(filepath.Join(o.Dir, SnapshotterDir))
	if err != nil {
		return fmt.Errorf("overlayfs snapshotter: %w", err)
	}
	snClosed := false
	defer func() {
		if !snClosed {
			sn.Close()
		}
	}()
	dbPath := filepath.Join(o.Dir, MetadataDir, MetadataFile)
	bdb, db, err := openMetadata(ctx, dbPath, cs, sn)
	if err != nil {
		return err
	}
	bdbClosed := false
	defer func() {
		if !bdbClosed {
			bdb.Close()
		}
	}()
	blobs, sizes, err := writeImages(ctx, db, o, imgs)
	if err != nil {
		return err
	}
	snClosed = true
	if err := sn.Close(); err != nil {
		return err
	}
	bdbClosed = true
	if err := bdb.Close(); err != nil {
		return err
	}
	if err := linkBlobs(o, blobs); err != nil {
		return err
	}
	if err := setSnapshotSizes(filepath.Join(o.Dir, SnapshotterDir, "metadata.db"), sizes); err != nil {
		return err
	}
	for _, p := range []string{dbPath, filepath.Join(o.Dir, SnapshotterDir, "metadata.db")} {
		if err := pinAndCompact(p, o.Created); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
	}
	return nil
}

// openMetadata opens (creating it) the metadata database at dbPath over the content store cs
// and the snapshotter sn. On an error, the database is closed again.
func openMetadata(ctx context.Context, dbPath string, cs content.Store, sn snapshots.Snapshotter) (*bolt.DB, *metadata.DB, error) {
	bdb, err := bolt.Open(dbPath, 0o644, &bolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		return nil, nil, fmt.Errorf("metadata database: %w", err)
	}
	db := metadata.NewDB(bdb, cs, map[string]snapshots.Snapshotter{Snapshotter: sn})
	if err := db.Init(ctx); err != nil {
		bdb.Close()
		return nil, nil, fmt.Errorf("metadata database: %w", err)
	}
	return bdb, db, nil
}

// writeImages records the images' blobs, their snapshots and the images themselves in db; it
// returns the blobs and each snapshot's size by chain ID (see treeSize).
func writeImages(ctx context.Context, db *metadata.DB, o Options, imgs []Image) (map[digest.Digest]blob, map[digest.Digest]int64, error) {
	blobs := map[digest.Digest]blob{}
	for _, im := range imgs {
		if err := addBlobs(blobs, im, o.KeepLayers); err != nil {
			return nil, nil, err
		}
	}
	for _, dg := range sortedDigests(blobs) {
		if err := writeBlob(ctx, db.ContentStore(), o, blobs[dg]); err != nil {
			return nil, nil, err
		}
	}
	is := metadata.NewImageStore(db)
	sizes := map[digest.Digest]int64{}
	for _, im := range imgs {
		size, err := treeSize(im.Tree)
		if err != nil {
			return nil, nil, fmt.Errorf("image %s: %w", im.Name, err)
		}
		sizes[im.ChainID()] = size
		if err := commitTree(ctx, db.Snapshotter(Snapshotter), o, im); err != nil {
			return nil, nil, fmt.Errorf("image %s: %w", im.Name, err)
		}
		target := im.Manifest
		target.Annotations, target.Platform = nil, nil
		if _, err := is.Create(ctx, images.Image{Name: im.Name, Target: target, Labels: o.Labels}); err != nil {
			return nil, nil, fmt.Errorf("image %s: %w", im.Name, err)
		}
	}
	return blobs, sizes, nil
}

// linkBlobs points the store's blobs at their copies on the node: they were read through
// symlinks to the host's copies; on the node they point at the image layout.
func linkBlobs(o Options, blobs map[digest.Digest]blob) error {
	for dg := range blobs {
		p := blobPath(o.Dir, dg)
		if err := os.Remove(p); err != nil {
			return err
		}
		if err := os.Symlink(o.NodeBlob(dg), p); err != nil {
			return err
		}
	}
	return nil
}

// blob is one content blob of the store and the labels a pull would give it.
type blob struct {
	desc   ocispec.Descriptor
	labels map[string]string
}

// addBlobs adds im's manifest and config with their labels: the manifest references its
// config for the garbage collector, the config the image's snapshot. The layers, with
// keepLayers, are added too, the manifest referencing them and each labelled with its
// uncompressed digest; without, they are left out and the manifest does not reference them,
// as a pull with discard_unpacked_layers leaves an image (containerd's
// images.ChildGCLabelsFilterLayers).
func addBlobs(blobs map[digest.Digest]blob, im Image, keepLayers bool) error {
	if len(im.Layers) != len(im.DiffIDs) {
		return fmt.Errorf("image %s: %d layers, %d diff IDs", im.Name, len(im.Layers), len(im.DiffIDs))
	}
	ml := map[string]string{"containerd.io/gc.ref.content.config": im.Config.Digest.String()}
	if keepLayers {
		for i, l := range im.Layers {
			ml["containerd.io/gc.ref.content.l."+strconv.Itoa(i)] = l.Digest.String()
		}
	}
	add := func(d ocispec.Descriptor, labels map[string]string) error {
		d = ocispec.Descriptor{MediaType: d.MediaType, Digest: d.Digest, Size: d.Size}
		if old, ok := blobs[d.Digest]; ok {
			for k, v := range labels {
				if w, ok := old.labels[k]; ok && w != v {
					return fmt.Errorf("image %s: blob %s: label %s is both %q and %q", im.Name, d.Digest, k, w, v)
				}
				old.labels[k] = v
			}
			return nil
		}
		blobs[d.Digest] = blob{desc: d, labels: labels}
		return nil
	}
	if err := add(im.Manifest, ml); err != nil {
		return err
	}
	if err := add(im.Config, map[string]string{"containerd.io/gc.ref.snapshot." + Snapshotter: im.ChainID().String()}); err != nil {
		return err
	}
	if keepLayers {
		for i, l := range im.Layers {
			if err := add(l, map[string]string{"containerd.io/uncompressed": im.DiffIDs[i].String()}); err != nil {
				return err
			}
		}
	}
	return nil
}

// writeBlob records b in the metadata database. Its bytes are not copied: the content store
// holds a symlink to the host's copy, which containerd's shared-content rule takes as present.
func writeBlob(ctx context.Context, cs content.Store, o Options, b blob) error {
	p := blobPath(o.Dir, b.desc.Digest)
	host := o.HostBlob(b.desc.Digest)
	st, err := os.Stat(host)
	if err != nil {
		return fmt.Errorf("blob %s: %w", b.desc.Digest, err)
	}
	if st.Size() != b.desc.Size {
		return fmt.Errorf("blob %s: %s holds %d bytes, the descriptor says %d", b.desc.Digest, host, st.Size(), b.desc.Size)
	}
	if err := os.Symlink(host, p); err != nil {
		return fmt.Errorf("blob %s: %w", b.desc.Digest, err)
	}
	w, err := cs.Writer(ctx, content.WithRef("kiln-seed-"+b.desc.Digest.Encoded()), content.WithDescriptor(b.desc))
	if err != nil {
		return fmt.Errorf("blob %s: %w", b.desc.Digest, err)
	}
	defer w.Close()
	if err := w.Commit(ctx, b.desc.Size, b.desc.Digest, content.WithLabels(b.labels)); err != nil && !errdefs.IsAlreadyExists(err) {
		return fmt.Errorf("blob %s: %w", b.desc.Digest, err)
	}
	return nil
}

// commitTree records im's tree as the committed snapshot named by its chain ID, the way the
// unpacker would after applying its layers: prepared, the tree moved into the snapshot's fs
// directory (so the snapshotter measures its real usage), committed, then moved to its place
// in the image and the fs directory turned into a symlink to it.
func commitTree(ctx context.Context, sn snapshots.Snapshotter, o Options, im Image) error {
	chainID := im.ChainID()
	if _, err := sn.Stat(ctx, chainID.String()); err == nil {
		return fmt.Errorf("snapshot %s: two images with the same layers", chainID)
	} else if !errdefs.IsNotFound(err) {
		return err
	}
	labels := map[string]string{"containerd.io/snapshot.ref": chainID.String()}
	key := "kiln-seed " + chainID.String()
	mounts, err := sn.Prepare(ctx, key, "", snapshots.WithLabels(labels))
	if err != nil {
		return fmt.Errorf("prepare snapshot: %w", err)
	}
	// A snapshot without a parent is a bind mount of its fs directory.
	if len(mounts) != 1 || mounts[0].Type != "bind" || !strings.HasPrefix(mounts[0].Source, filepath.Join(o.Dir, SnapshotterDir)+"/") {
		return fmt.Errorf("prepare snapshot: unexpected mounts %+v", mounts)
	}
	fsDir := mounts[0].Source
	if err := os.Remove(fsDir); err != nil {
		return err
	}
	if err := os.Rename(im.Tree, fsDir); err != nil {
		return err
	}
	if err := sn.Commit(ctx, chainID.String(), key, snapshots.WithLabels(labels)); err != nil {
		return errors.Join(fmt.Errorf("commit snapshot: %w", err), os.Rename(fsDir, im.Tree))
	}
	dest := o.TreeDest(chainID)
	if err := os.MkdirAll(filepath.Dir(dest), 0o755); err != nil {
		return err
	}
	if err := os.Rename(fsDir, dest); err != nil {
		return err
	}
	return os.Symlink(o.NodeTree(chainID), fsDir)
}

func blobPath(dir string, dg digest.Digest) string {
	return filepath.Join(dir, ContentDir, "blobs", dg.Algorithm().String(), dg.Encoded())
}
