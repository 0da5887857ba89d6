// Package bake is the bake pipeline. Its stages run in this order, one file each:
//
//	resolve     definition + role profile (+ profile overlays) + lock; unpinned inputs refused
//	fetch       artifacts and container images, verified into the cache
//	base        the base OS image flattened into the root tree; kernel and systemd-boot copied out
//	tree        base ⊕ artifacts ⊕ overlays ⊕ templates ⊕ kiln-init ⊕ Kubernetes ⊕ units ⊕ image.json
//	kubernetes  the binaries' versions checked (skew), the runtime's units, the pre-pulled images (images)
//	sbom        <image>-<role>.spdx.json: the tree's Debian packages, artifacts, images, Go modules, kernel
//	secrets     the tree searched for private keys and Kubernetes credentials
//	initramfs   kiln-stage1 as /init and the kernel modules that find and mount the root
//	rootfs      the tree as a squashfs or erofs, with its owners
//	disk        the GPT disk: the ESP (kernel, initramfs, systemd-boot, image.json) and the root
//	pxe         with the pxe format: the kernel, initramfs and root image for network boots;
//	            with the iso format: the same in a hybrid ISO that boots live from the medium
//	formats     the raw disk converted to the definition's formats
//	metadata    image.json in the tree and <image>-<role>.json beside the outputs
//	provenance  with a signing key: <image>-<role>.intoto.jsonl, SLSA provenance of every output
//
// Everything is written in a work directory inside the output directory and renamed into place
// at the end, so a failed bake leaves no output behind.
package bake

import (
	"context"
	"crypto"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/kilnproject/kiln/builder/artifact"
	"github.com/kilnproject/kiln/builder/cacherepo"
	"github.com/kilnproject/kiln/builder/rootfs"
	"github.com/kilnproject/kiln/builder/spec"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

// Options configure one bake.
type Options struct {
	Definition string // path of images/<name>.yaml
	Role       string
	OutDir     string
	KilnInit   string // host path of the static kiln-init binary, the node agent on the root
	Stage1     string // host path of the static kiln-stage1 binary, the initramfs' /init
	// Cache is required: a bake holds it shared, so that no prune runs meanwhile (PruneCache).
	Cache   *artifact.Cache
	Log     *slog.Logger
	Version string    // kiln's version, recorded in the image
	Created time.Time // recorded as the image's creation time (SOURCE_DATE_EPOCH)
	// ProfileOverlays are spec.ProfileOverlay documents applied, in order, to the role's
	// profile: they replace artifact sources/sha256 and image sources/digests by name.
	ProfileOverlays []string
	// ImageFetch says how to reach registries (credentials, retries) for the base image and
	// the pre-pulled images.
	ImageFetch artifact.ImageFetch
	// WithoutImages leaves the profile's pre-pulled images out (they are neither fetched nor
	// laid): the node's runtime pulls them at first boot. For measuring what pre-pulling
	// saves, and for sites that prefer a registry mirror to image size.
	WithoutImages bool
	// SignKey, when set, signs the bake's provenance (<image>-<role>.intoto.jsonl).
	SignKey crypto.Signer
	// ImportImages lays the pre-pulled images as the OCI layout only, without containerd's
	// store: first boot imports and unpacks them (kiln-init kube images), as before the store
	// was laid at bake. For measuring what laying the store saves.
	ImportImages bool
	// CacheRepo, when set, is the cache CI runners share (kiln bake --cache-repo): a
	// flattened base, an image's applied layers or a compressed initramfs that Cache lacks
	// is pulled from it, and one made here is pushed to it.
	CacheRepo *cacherepo.Repo
}

// Result names what a bake wrote.
type Result struct {
	Outputs  []string // every file (and the pxe directory) written to OutDir, in the definition's order, then the SBOM, the metadata and the signed provenance (with a SignKey)
	Metadata *nodeimage.Metadata
}

// Bake runs the whole pipeline.
func Bake(ctx context.Context, o Options) (*Result, error) {
	log := o.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	start := time.Now()
	if o.WithoutImages && o.ImportImages {
		return nil, errors.New("--import-images and --without-images together: the first says how the pre-pulled images are laid, the second leaves them out")
	}
	def, prof, lock, err := resolve(o.Definition, o.Role, o.ProfileOverlays, log)
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(o.KilnInit); err != nil {
		return nil, fmt.Errorf("kiln-init binary: %w (build it with `make build`)", err)
	}
	if _, err := os.Stat(o.Stage1); err != nil {
		return nil, fmt.Errorf("kiln-stage1 binary: %w (build it with `make build`)", err)
	}
	if o.Cache == nil {
		return nil, errors.New("bake: no cache (Options.Cache)")
	}
	release, err := holdCache(o.Cache.Root, false, true, func() {
		log.Info("waiting for kiln cache prune to finish", "cache", o.Cache.Root)
	})
	if err != nil {
		return nil, err
	}
	defer release()
	if err := os.MkdirAll(o.OutDir, 0o755); err != nil {
		return nil, err
	}
	work, err := os.MkdirTemp(o.OutDir, ".kiln-bake-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)

	b := &baker{ctx: ctx, o: o, log: log, def: def, prof: prof, lock: lock, work: work, stem: def.Name + "-" + o.Role}
	md, files, err := b.run()
	if err != nil {
		return nil, err
	}
	outs, err := publish(files, o.OutDir, work)
	if err != nil {
		return nil, err
	}
	log.Info("baked", "image", b.stem, "seconds", time.Since(start).Round(time.Millisecond).Seconds(), "outputs", len(outs))
	return &Result{Outputs: outs, Metadata: md}, nil
}

// baker is one bake under way: its inputs, resolved, and its work directory.
type baker struct {
	ctx  context.Context
	o    Options
	log  *slog.Logger
	def  *spec.Definition
	prof *spec.Profile
	lock *artifact.Lock
	work string
	stem string // <image>-<role>, the outputs' file name without the suffix
	// baseTree is the base's flattened tree in the cache (linked into the bake's tree), empty
	// when the cache does not hold it.
	baseTree string
	// baseCache and baseKey are where the cache keeps the base's tree (baseKey is empty
	// before the base is opened, or when no cache is used).
	baseCache rootfs.TreeCache
	baseKey   string
}

// removeTree removes the bake's tree dir, keeping the base's directories in the cache for the
// next bake of the same base (rootfs.TreeCache.Recycle) when the tree was made from it.
func (b *baker) removeTree(dir string) error {
	if b.baseKey == "" {
		return os.RemoveAll(dir)
	}
	return b.baseCache.Recycle(b.baseKey, dir)
}

// run bakes the image in the work directory, stage after stage, and returns its metadata and
// the files to publish: the outputs (raw first) and then <stem>.json.
func (b *baker) run() (_ *nodeimage.Metadata, _ []string, err error) {
	md := &nodeimage.Metadata{Name: b.def.Name, Role: b.prof.Role, Platform: b.def.Platform, Created: b.o.Created.UTC(),
		Kiln: b.o.Version, Contract: nodeimage.ContractVersion, RootFS: b.def.Disk.RootFS, Artifacts: []nodeimage.ArtifactInfo{}}
	// Inputs first: a bad hash fails before any heavy work.
	blobs, images, err := b.fetch()
	if err != nil {
		return nil, nil, err
	}
	tree, boot, err := b.openBase(md)
	if err != nil {
		return nil, nil, err
	}
	imageJSON, err := b.layTree(tree, blobs, images, md)
	if err != nil {
		return nil, nil, err
	}
	sbomFiles, err := b.writeSBOM(tree, md)
	if err != nil {
		return nil, nil, err
	}
	// The secret scan reads the tree while the initramfs and the root filesystem are made
	// from it (the three only read it); the disk is written only once the scan passed.
	scan := make(chan error, 1)
	go func() { scan <- b.scanSecrets(tree) }()
	scanned := sync.OnceValue(func() error { return <-scan })
	defer scanned() // an early return still waits: the work directory goes after run
	initrd, err := b.writeInitramfs(tree, md)
	if err != nil {
		return nil, nil, err
	}
	rootImg, err := b.makeRootFS(tree)
	if err != nil {
		return nil, nil, err
	}
	if err := b.appendVerity(rootImg, md); err != nil {
		return nil, nil, err
	}
	if err := scanned(); err != nil {
		return nil, nil, err
	}
	// The tree is removed in the background: most of it is links into the cache, so its
	// removal frees little, and it takes as long as writing the disk.
	removed := make(chan error, 1)
	go func() { removed <- b.removeTree(tree.Dir) }()
	defer func() {
		if rerr := <-removed; rerr != nil && err == nil {
			err = fmt.Errorf("remove the bake's tree: %w", rerr)
		}
	}()
	// The pxe files (the root image linked, hashed) are written beside the disk; each output
	// is hashed in the background from when it is written, beside the next one.
	var pxeDir string
	pxeDone := make(chan error, 1)
	go func() {
		var err error
		pxeDir, err = b.writePXE(rootImg, boot, initrd, md)
		pxeDone <- err
	}()
	sums := newHashes()
	defer sums.wait()
	raw, err := b.writeDisk(rootImg, boot, initrd, imageJSON, md)
	if err == nil && slices.Contains(b.def.Formats, "raw") {
		sums.start(raw)
	}
	if perr := <-pxeDone; err == nil {
		err = perr
	}
	if err != nil {
		return nil, nil, err
	}
	isoFile, err := b.writeISO(raw, rootImg, boot, initrd, md)
	if err != nil {
		return nil, nil, err
	}
	if isoFile != "" {
		sums.start(isoFile)
	}
	if err := os.Remove(rootImg); err != nil { // the formats need the space, not the image
		return nil, nil, err
	}
	files, err := b.convert(raw, pxeDir, isoFile, sums)
	if err != nil {
		return nil, nil, err
	}
	mdFile, err := b.writeMetadata(files, md, sums)
	if err != nil {
		return nil, nil, err
	}
	files = append(append(files, sbomFiles...), mdFile)
	if b.o.SignKey != nil {
		prov, err := b.writeProvenance(md, mdFile)
		if err != nil {
			return nil, nil, err
		}
		files = append(files, prov)
	}
	return md, files, nil
}

// step logs that the stage name took since start, with attrs (key-value pairs) before the time.
func (b *baker) step(name string, start time.Time, attrs ...any) {
	b.log.Info(name, append(attrs, "seconds", time.Since(start).Round(time.Millisecond).Seconds())...)
}

// publish moves the files (and the pxe directory) of a successful bake into dir, in order, and
// returns where they are now. What dir already holds under those names, an earlier bake's
// outputs, is replaced: moved aside into work first (removed with it) and moved back, with the
// new files removed again, when one cannot be moved in, so a failed publish leaves dir as it was.
func publish(files []string, dir, work string) ([]string, error) {
	aside := filepath.Join(work, "replaced")
	if err := os.Mkdir(aside, 0o755); err != nil {
		return nil, err
	}
	var outs, replaced []string
	undo := func() {
		for _, done := range outs {
			os.RemoveAll(done)
		}
		for _, name := range replaced {
			os.Rename(filepath.Join(aside, name), filepath.Join(dir, name))
		}
	}
	for _, f := range files {
		name := filepath.Base(f)
		dst := filepath.Join(dir, name)
		if _, err := os.Lstat(dst); err == nil {
			if err := os.Rename(dst, filepath.Join(aside, name)); err != nil {
				undo()
				return nil, fmt.Errorf("replace %s in %s: %w", name, dir, err)
			}
			replaced = append(replaced, name)
		}
		if err := os.Rename(f, dst); err != nil {
			undo()
			return nil, fmt.Errorf("move %s into %s: %w", name, dir, err)
		}
		outs = append(outs, dst)
	}
	return outs, nil
}
