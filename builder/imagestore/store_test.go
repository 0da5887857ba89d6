package imagestore

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/metadata"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/plugins/content/local"
	"github.com/containerd/containerd/v2/plugins/snapshots/overlay"
	"github.com/containerd/errdefs"
	"github.com/containerd/platforms"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	bolt "go.etcd.io/bbolt"

	"github.com/kilnproject/kiln/builder/rootfs"
)

type entry struct {
	name, body string
	dir        bool
}

func layer(t *testing.T, entries ...entry) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Mode: 0o644, Size: int64(len(e.body)), Typeflag: tar.TypeReg, ModTime: time.Unix(1e9, 0)}
		if e.dir {
			h = &tar.Header{Name: e.name, Mode: 0o755, Typeflag: tar.TypeDir, ModTime: time.Unix(1e9, 0)}
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(e.body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	data := buf.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// fixture is two images sharing a base layer, the second deleting a file of it, with their
// blobs in a directory as in an OCI layout.
type fixture struct {
	blobs      string
	imgs       map[string]v1.Image
	namespace  string
	keepLayers bool // Options.KeepLayers
	// alter, when set, changes each flattened tree before the store is written.
	alter func(t *testing.T, tree string)
}

func newFixture(t *testing.T) fixture {
	t.Helper()
	base := layer(t, entry{name: "etc/", dir: true}, entry{name: "etc/os-release", body: "ID=test\n"}, entry{name: "etc/motd", body: "base\n"})
	f := fixture{blobs: t.TempDir(), imgs: map[string]v1.Image{}, namespace: "k8s.io"}
	for name, top := range map[string]v1.Layer{
		"registry.test/one:1": layer(t, entry{name: "bin/", dir: true}, entry{name: "bin/one", body: "#!/bin/sh\necho one\n"}),
		"registry.test/two:2": layer(t, entry{name: "etc/.wh.motd"}, entry{name: "etc/two.conf", body: "two\n"}),
	} {
		img, err := mutate.AppendLayers(empty.Image, base, top)
		if err != nil {
			t.Fatal(err)
		}
		f.imgs[name] = img
		put := func(h v1.Hash, r io.Reader) {
			data, err := io.ReadAll(r)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(f.blobs, h.Hex), data, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		m, _ := img.RawManifest()
		md, _ := img.Digest()
		put(md, bytes.NewReader(m))
		c, _ := img.RawConfigFile()
		cd, _ := img.ConfigName()
		put(cd, bytes.NewReader(c))
		ls, _ := img.Layers()
		for _, l := range ls {
			d, _ := l.Digest()
			rc, err := l.Compressed()
			if err != nil {
				t.Fatal(err)
			}
			put(d, rc)
			rc.Close()
		}
	}
	return f
}

func desc(t *testing.T, mt string, d v1.Hash, size int64) ocispec.Descriptor {
	t.Helper()
	return ocispec.Descriptor{MediaType: mt, Digest: digest.Digest(d.String()), Size: size}
}

// write flattens the fixture's images into work and lays the store in work/store, its trees in
// work/trees.
func (f fixture) write(t *testing.T, work string) Options {
	t.Helper()
	var imgs []Image
	for _, name := range slices.Sorted(func(yield func(string) bool) {
		for k := range f.imgs {
			if !yield(k) {
				return
			}
		}
	}) {
		img := f.imgs[name]
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		tree, err := rootfs.FlattenWith(img, filepath.Join(work, "flat", filepath.Base(name)), rootfs.FlattenOptions{DiffIDs: cf.RootFS.DiffIDs, Exact: true})
		if err != nil {
			t.Fatal(err)
		}
		if f.alter != nil {
			f.alter(t, tree.Dir)
		}
		m, _ := img.Manifest()
		md, _ := img.Digest()
		raw, _ := img.RawManifest()
		im := Image{Name: name, Manifest: desc(t, string(m.MediaType), md, int64(len(raw))), Config: desc(t, string(m.Config.MediaType), m.Config.Digest, m.Config.Size), Tree: tree.Dir}
		for i, l := range m.Layers {
			im.Layers = append(im.Layers, desc(t, string(l.MediaType), l.Digest, l.Size))
			im.DiffIDs = append(im.DiffIDs, digest.Digest(cf.RootFS.DiffIDs[i].String()))
		}
		imgs = append(imgs, im)
	}
	trees := filepath.Join(work, "trees")
	host := func(d digest.Digest) string { return filepath.Join(f.blobs, d.Encoded()) }
	tree := func(c digest.Digest) string { return filepath.Join(trees, c.Encoded()) }
	o := Options{
		Dir: filepath.Join(work, "store"), HostBlob: host, NodeBlob: host, TreeDest: tree, NodeTree: tree,
		Namespace: f.namespace, Labels: map[string]string{"io.cri-containerd.image": "managed"}, Created: time.Unix(1.7e9, 0),
		KeepLayers: f.keepLayers,
	}
	if err := Write(context.Background(), o, imgs); err != nil {
		t.Fatal(err)
	}
	return o
}

// open opens a store the way containerd does at start.
func open(t *testing.T, root string) (*metadata.DB, snapshots.Snapshotter) {
	t.Helper()
	cs, err := local.NewStore(filepath.Join(root, ContentDir))
	if err != nil {
		t.Fatal(err)
	}
	sn, err := overlay.NewSnapshotter(filepath.Join(root, SnapshotterDir))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sn.Close() })
	bdb, err := bolt.Open(filepath.Join(root, MetadataDir, MetadataFile), 0o644, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bdb.Close() })
	db := metadata.NewDB(bdb, cs, map[string]snapshots.Snapshotter{Snapshotter: sn})
	if err := db.Init(context.Background()); err != nil {
		t.Fatal(err)
	}
	return db, sn
}

// The images are recorded in the namespace of the runtime the store is laid for: Docker
// Engine's ("moby") lists them, the CRI's ("k8s.io") has none. Docker's store keeps the
// layers (KeepLayers): each is in the content store, labelled with its uncompressed digest
// and referenced by its manifest, through containerd's garbage collection.
func TestStoreNamespace(t *testing.T) {
	f := newFixture(t)
	f.namespace, f.keepLayers = "moby", true
	o := f.write(t, t.TempDir())
	db, _ := open(t, o.Dir)
	ctx := namespaces.WithNamespace(context.Background(), "moby")
	if _, err := db.GarbageCollect(ctx); err != nil {
		t.Fatal(err)
	}
	list, err := metadata.NewImageStore(db).List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, im := range list {
		manifest, err := images.Manifest(ctx, db.ContentStore(), im.Target, platforms.All)
		if err != nil {
			t.Fatalf("%s: manifest: %v", im.Name, err)
		}
		for _, l := range manifest.Layers {
			info, err := db.ContentStore().Info(ctx, l.Digest)
			if err != nil || info.Labels["containerd.io/uncompressed"] == "" {
				t.Errorf("%s: layer %s: %+v, %v, want it kept with its uncompressed digest", im.Name, l.Digest, info, err)
			}
		}
	}
	if entries, _ := os.ReadDir(filepath.Join(o.Dir, ContentDir, "blobs", "sha256")); len(entries) != 7 {
		t.Errorf("%d content blobs, want 7 (2 manifests, 2 configs, 3 layers)", len(entries))
	}
	for ns, want := range map[string]int{"moby": len(f.imgs), "k8s.io": 0} {
		list, err := metadata.NewImageStore(db).List(namespaces.WithNamespace(context.Background(), ns))
		if err != nil {
			t.Fatal(err)
		}
		if len(list) != want {
			t.Errorf("namespace %s lists %d images, want %d", ns, len(list), want)
		}
	}
}

// TestStoreAsContainerdSeesIt lays the store and reads it back with containerd's libraries:
// the images are listed under their names, each is unpacked for the overlayfs snapshotter
// (the check the CRI makes), its snapshot shows the image's files with the whiteout applied,
// and containerd's garbage collector removes none of it.
func TestStoreAsContainerdSeesIt(t *testing.T) {
	f := newFixture(t)
	work := t.TempDir()
	o := f.write(t, work)
	db, _ := open(t, o.Dir)
	ctx := namespaces.WithNamespace(context.Background(), o.Namespace)

	check := func(when string) {
		t.Helper()
		list, err := metadata.NewImageStore(db).List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(list) != 2 {
			t.Fatalf("%s: containerd lists %d images, want 2: %+v", when, len(list), list)
		}
		cs := db.ContentStore()
		sn := db.Snapshotter(Snapshotter)
		for _, im := range list {
			want, _ := f.imgs[im.Name].Digest()
			if im.Target.Digest.String() != want.String() || im.Labels["io.cri-containerd.image"] != "managed" {
				t.Errorf("%s: image %s = %+v, want target %s and the labels", when, im.Name, im, want)
			}
			cfg, err := images.Config(ctx, cs, im.Target, platforms.All)
			if err != nil {
				t.Fatalf("%s: %s: config: %v", when, im.Name, err)
			}
			diffIDs, err := images.RootFS(ctx, cs, cfg)
			if err != nil {
				t.Fatal(err)
			}
			// containerd's Image.IsUnpacked: the snapshot of the image's chain ID exists.
			img := Image{DiffIDs: diffIDs}
			info, err := sn.Stat(ctx, img.ChainID().String())
			if err != nil || info.Kind != snapshots.KindCommitted {
				t.Fatalf("%s: %s is not unpacked: %+v %v", when, im.Name, info, err)
			}
			// A read-only view, as a container's root would stack on it.
			key := when + " view " + im.Name
			mounts, err := sn.View(ctx, key, img.ChainID().String())
			if err != nil {
				t.Fatal(err)
			}
			root := mounts[0].Source
			motd, motdErr := os.ReadFile(filepath.Join(root, "etc/motd"))
			osr, _ := os.ReadFile(filepath.Join(root, "etc/os-release"))
			switch im.Name {
			case "registry.test/one:1":
				one, _ := os.ReadFile(filepath.Join(root, "bin/one"))
				if string(motd) != "base\n" || string(osr) != "ID=test\n" || string(one) != "#!/bin/sh\necho one\n" {
					t.Errorf("%s: image one's snapshot: motd %q, os-release %q, bin/one %q", when, motd, osr, one)
				}
			case "registry.test/two:2":
				two, _ := os.ReadFile(filepath.Join(root, "etc/two.conf"))
				if !os.IsNotExist(motdErr) || string(two) != "two\n" || string(osr) != "ID=test\n" {
					t.Errorf("%s: image two's snapshot: motd %q (%v; deleted by its top layer), two.conf %q", when, motd, motdErr, two)
				}
			}
			if err := sn.Remove(ctx, key); err != nil {
				t.Fatal(err)
			}
			if _, err := content.ReadBlob(ctx, cs, im.Target); err != nil {
				t.Errorf("%s: %s: manifest: %v", when, im.Name, err)
			}
			// The compressed layers are not kept once applied; the image's size is still
			// known from its manifest, as the CRI reports it.
			manifest, err := images.Manifest(ctx, cs, im.Target, platforms.All)
			if err != nil {
				t.Fatalf("%s: %s: manifest: %v", when, im.Name, err)
			}
			for _, l := range manifest.Layers {
				if _, err := cs.Info(ctx, l.Digest); !errdefs.IsNotFound(err) {
					t.Errorf("%s: %s: layer %s in the content store (%v), want it left out", when, im.Name, l.Digest, err)
				}
			}
			record := im
			if size, err := record.Size(ctx, cs, platforms.All); err != nil || size == 0 {
				t.Errorf("%s: %s: size %d, %v", when, im.Name, size, err)
			}
		}
	}
	check("laid")
	if _, err := db.GarbageCollect(ctx); err != nil {
		t.Fatal(err)
	}
	check("after containerd's garbage collection")
	// The blobs are not copied: the content store links to the layout.
	entries, err := os.ReadDir(filepath.Join(o.Dir, ContentDir, "blobs", "sha256"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Type()&os.ModeSymlink == 0 {
			t.Errorf("content blob %s is a copy, want a symlink into the layout", e.Name())
		}
	}
	if len(entries) != 4 { // 2 manifests, 2 configs: no layer, as with discard_unpacked_layers
		t.Errorf("%d content blobs, want 4", len(entries))
	}
}

// TestStoreReproducible lays the same images twice: the databases are byte for byte the same.
// TestStoreReproducible: two stores of the same images are the same bytes, also when the host
// allocated their files' blocks differently (as it does before and after writing them back).
func TestStoreReproducible(t *testing.T) {
	f := newFixture(t)
	a := f.write(t, t.TempDir())
	f.alter = func(t *testing.T, tree string) {
		err := filepath.WalkDir(tree, func(p string, d fs.DirEntry, err error) error {
			if err != nil || !d.Type().IsRegular() {
				return err
			}
			fd, err := os.OpenFile(p, os.O_WRONLY, 0)
			if err != nil {
				return err
			}
			defer fd.Close()
			// 64 KiB more allocated, the size and content unchanged.
			return syscall.Fallocate(int(fd.Fd()), 1 /* FALLOC_FL_KEEP_SIZE */, 0, 64<<10)
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	b := f.write(t, t.TempDir())
	for _, p := range []string{filepath.Join(MetadataDir, MetadataFile), filepath.Join(SnapshotterDir, "metadata.db")} {
		x, err := os.ReadFile(filepath.Join(a.Dir, p))
		if err != nil {
			t.Fatal(err)
		}
		y, err := os.ReadFile(filepath.Join(b.Dir, p))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(x, y) {
			t.Errorf("%s differs between two stores of the same images", p)
		}
	}
}
