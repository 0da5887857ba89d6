// Package bake is the bake pipeline: definition + role profile (+ profile overlays) + lock ⇒
// verified artifacts and container images ⇒ root tree (base ⊕ artifacts ⊕ overlays ⊕ templates ⊕
// kiln-init ⊕ pre-pulled images ⊕ units ⊕ metadata), with the Kubernetes binaries' versions
// checked and the tree scanned for secrets ⇒ initramfs and root filesystem ⇒ GPT disk ⇒ output
// formats. Everything is written in a work directory inside the
// output directory and renamed into place at the end, so a failed bake leaves no output behind.
package bake

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/kilnproject/kiln/builder/artifact"
	"github.com/kilnproject/kiln/builder/disk"
	"github.com/kilnproject/kiln/builder/initramfs"
	"github.com/kilnproject/kiln/builder/output"
	"github.com/kilnproject/kiln/builder/rootfs"
	"github.com/kilnproject/kiln/builder/spec"
	"github.com/kilnproject/kiln/initd/systemd"
)

// DefaultModules are the kernel modules every initramfs carries: enough to find the root on
// virtio, SCSI or NVMe disks and to mount squashfs/erofs, ext4 and the /etc overlay. What they
// need comes with them, soft dependencies included (crc32c for libcrc32c, ext4 and jbd2).
var DefaultModules = []string{
	"virtio_pci", "virtio_blk", "virtio_scsi", "sd_mod", "nvme",
	"squashfs", "erofs", "ext4", "overlay",
}

// Options configure one bake.
type Options struct {
	Definition string // path of images/<name>.yaml
	Role       string
	OutDir     string
	KilnInit   string // host path of the static kiln-init binary
	Cache      *artifact.Cache
	Log        *slog.Logger
	Version    string    // kiln's version, recorded in the image
	Created    time.Time // recorded as the image's creation time (SOURCE_DATE_EPOCH)
	// ProfileOverlays are spec.ProfileOverlay documents applied, in order, to the role's
	// profile: they replace artifact sources/sha256 and image sources/digests by name.
	ProfileOverlays []string
	// ImageFetch says how to reach registries for the pre-pulled images.
	ImageFetch artifact.ImageFetch
	// WithoutImages leaves the profile's pre-pulled images out (they are neither fetched nor
	// laid): the node's runtime pulls them at first boot. For measuring what pre-pulling
	// saves, and for sites that prefer a registry mirror to image size.
	WithoutImages bool
}

// Result names what a bake wrote.
type Result struct {
	Outputs  []string // every file written to OutDir, raw first, metadata last
	Metadata *Metadata
}

// Metadata describes a baked image; it is /etc/kiln/image.json in the image, /kiln/image.json
// on the ESP and, with the disk layout added, <image>-<role>.json beside the outputs.
type Metadata struct {
	Name      string           `json:"name"`
	Role      string           `json:"role"`
	Platform  string           `json:"platform"`
	Created   time.Time        `json:"created"`
	Kiln      string           `json:"kiln"`
	Base      BaseInfo         `json:"base"`
	Kernel    KernelInfo       `json:"kernel"`
	Artifacts []ArtifactInfo   `json:"artifacts"`
	RootFS    string           `json:"rootfs"`
	Disk      *DiskInfo        `json:"disk,omitempty"`
	Outputs   []OutputInfo     `json:"outputs,omitempty"`
	Initramfs *InitramfsDigest `json:"initramfs,omitempty"`
	// Kubernetes is set when the role's profile has a kubernetes section.
	Kubernetes *KubernetesInfo `json:"kubernetes,omitempty"`
}

// KubernetesInfo is what the image carries to run Kubernetes: the release (kubelet's own
// version), the runtime, the containerd version and the pre-pulled images, which are in the
// OCI image layout at /usr/lib/kiln/images.
type KubernetesInfo struct {
	Version    string      `json:"version"`
	Runtime    string      `json:"runtime"`
	Containerd string      `json:"containerd,omitempty"`
	Images     []ImageInfo `json:"images"`
	// ImagesLeftOut is set when the bake left the profile's images out (--without-images):
	// the node pulls them from a registry.
	ImagesLeftOut bool `json:"imagesLeftOut,omitempty"`
}

// ImageInfo is one pre-pulled image: its name and the digest of its image manifest.
type ImageInfo struct {
	Name   string `json:"name"`
	Digest string `json:"digest"`
}

// BaseInfo pins the base OS image.
type BaseInfo struct {
	Ref    string `json:"ref"`
	Digest string `json:"digest"`
}

// KernelInfo names the kernel found in the base.
type KernelInfo struct {
	Version string `json:"version"`
	SHA256  string `json:"sha256,omitempty"`
}

// ArtifactInfo records one artifact laid into the image.
type ArtifactInfo struct {
	Name   string `json:"name"`
	Source string `json:"source"`
	SHA256 string `json:"sha256"`
	Dest   string `json:"dest"`
}

// InitramfsDigest summarises the initramfs.
type InitramfsDigest struct {
	SHA256  string   `json:"sha256"`
	Size    int64    `json:"size"`
	Modules []string `json:"modules"`
}

// DiskInfo is the partition table of the raw disk.
type DiskInfo struct {
	Size       int64            `json:"size"`
	GUID       string           `json:"guid"`
	Cmdline    string           `json:"cmdline"`
	Partitions []disk.Partition `json:"partitions"`
}

// OutputInfo is one written file.
type OutputInfo struct {
	Format    string `json:"format"`
	File      string `json:"file"`
	Size      int64  `json:"size"`
	Allocated int64  `json:"allocated"`
	SHA256    string `json:"sha256,omitempty"`
}

// Bake runs the whole pipeline.
func Bake(ctx context.Context, o Options) (*Result, error) {
	log := o.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	start := time.Now()
	def, err := spec.LoadDefinition(o.Definition)
	if err != nil {
		return nil, err
	}
	prof, err := def.Profile(o.Role)
	if err != nil {
		return nil, err
	}
	if prof, err = applyOverlays(def, prof, o.ProfileOverlays, log); err != nil {
		return nil, err
	}
	if k := prof.Kubernetes; k != nil {
		if err := CheckKernelArgs(*k, def.Kernel.Args); err != nil {
			return nil, fmt.Errorf("%s: %w", def.File, err)
		}
	}
	lock, err := artifact.ReadLock(artifact.LockPath(def))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	if u := artifact.Unpinned(def, prof, lock); len(u) > 0 {
		return nil, fmt.Errorf("refusing to bake unpinned inputs:\n  %s", strings.Join(u, "\n  "))
	}
	if _, err := os.Stat(o.KilnInit); err != nil {
		return nil, fmt.Errorf("kiln-init binary: %w (build it with `make build`)", err)
	}
	if err := os.MkdirAll(o.OutDir, 0o755); err != nil {
		return nil, err
	}
	work, err := os.MkdirTemp(o.OutDir, ".kiln-bake-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)

	stem := def.Name + "-" + o.Role
	b := &baker{ctx: ctx, o: o, log: log, def: def, prof: prof, lock: lock, work: work}
	md, files, err := b.run(stem)
	if err != nil {
		return nil, err
	}
	// Everything succeeded: move the outputs into place, metadata last.
	var outs []string
	for _, f := range files {
		dst := filepath.Join(o.OutDir, filepath.Base(f))
		if err := os.Rename(f, dst); err != nil {
			for _, done := range outs {
				os.Remove(done)
			}
			return nil, fmt.Errorf("move %s into %s: %w", filepath.Base(f), o.OutDir, err)
		}
		outs = append(outs, dst)
	}
	log.Info("baked", "image", stem, "seconds", time.Since(start).Round(time.Millisecond).Seconds(), "outputs", len(outs))
	return &Result{Outputs: outs, Metadata: md}, nil
}

type baker struct {
	ctx  context.Context
	o    Options
	log  *slog.Logger
	def  *spec.Definition
	prof *spec.Profile
	lock *artifact.Lock
	work string
}

func (b *baker) step(name string, start time.Time) {
	b.log.Info(name, "seconds", time.Since(start).Round(time.Millisecond).Seconds())
}

func (b *baker) run(stem string) (*Metadata, []string, error) {
	def, prof := b.def, b.prof
	md := &Metadata{Name: def.Name, Role: prof.Role, Platform: def.Platform, Created: b.o.Created.UTC(),
		Kiln: b.o.Version, RootFS: def.Disk.RootFS, Artifacts: []ArtifactInfo{}}

	// Artifacts first: a bad hash fails before any heavy work.
	t := time.Now()
	blobs, err := b.fetchArtifacts()
	if err != nil {
		return nil, nil, err
	}
	b.step("artifacts fetched", t)

	t = time.Now()
	images, err := b.fetchImages()
	if err != nil {
		return nil, nil, err
	}
	if len(images) > 0 {
		b.step("images fetched", t)
	}

	t = time.Now()
	src := rootfs.Source{Layout: def.Base.Layout, Image: def.Base.Image, Tarball: def.Base.Tarball, Digest: b.lock.BaseDigest(def.Base)}
	md.Base = BaseInfo{Ref: def.Base.Ref, Digest: src.Digest}
	img, err := rootfs.OpenBase(b.ctx, src)
	if err != nil {
		return nil, nil, err
	}
	tree, err := rootfs.FlattenWith(img, filepath.Join(b.work, "tree"), rootfs.FlattenOptions{Cache: b.o.Cache})
	if err != nil {
		return nil, nil, fmt.Errorf("base %s: %w", src, err)
	}
	b.step("base flattened", t)

	kernel, err := tree.FindKernel()
	if err != nil {
		return nil, nil, fmt.Errorf("base %s: %w", src, err)
	}
	bootloader, err := tree.SystemdBoot()
	if err != nil {
		return nil, nil, fmt.Errorf("base %s: %w", src, err)
	}
	// The ESP gets its own copies: the root tree may shadow them later. They are read
	// through the tree (a symlink leading out of it is an error) and must fit the ESP.
	espSize := def.Disk.ESPSize.Bytes()
	if espSize == 0 {
		espSize = disk.ESPSize
	}
	vmlinuz := filepath.Join(b.work, "vmlinuz")
	efi := filepath.Join(b.work, "systemd-bootx64.efi")
	if err := tree.CopyOut("kernel", kernel.Image, vmlinuz, espSize); err != nil {
		return nil, nil, fmt.Errorf("base %s: %w", src, err)
	}
	if err := tree.CopyOut("systemd-boot", bootloader, efi, espSize); err != nil {
		return nil, nil, fmt.Errorf("base %s: %w", src, err)
	}
	md.Kernel = KernelInfo{Version: kernel.Version, SHA256: fileSHA256(vmlinuz)}

	t = time.Now()
	for i, a := range prof.Artifacts {
		if err := b.layArtifact(tree, a, blobs[i]); err != nil {
			return nil, nil, err
		}
		md.Artifacts = append(md.Artifacts, ArtifactInfo{Name: a.Name, Source: a.Source, SHA256: b.lock.SHA256(prof.Role, a), Dest: artifactDest(a)})
	}
	for _, ov := range append(append([]string{}, def.Overlays...), prof.Overlays...) {
		if err := tree.AddOverlay(ov); err != nil {
			return nil, nil, fmt.Errorf("overlay %s: %w", ov, err)
		}
	}
	if prof.Templates != "" {
		// kiln-init renders them at first boot (/usr/lib/kiln/templates).
		if err := tree.AddDir(prof.Templates, "usr/lib/kiln/templates"); err != nil {
			return nil, nil, fmt.Errorf("%s: templates: %w", prof.File, err)
		}
	}
	if err := tree.AddFile("usr/bin/kiln-init", b.o.KilnInit, 0o755); err != nil {
		return nil, nil, err
	}
	if k := prof.Kubernetes; k != nil {
		if md.Kubernetes, err = b.addKubernetes(tree, *k, images); err != nil {
			return nil, nil, err
		}
	}
	// Units are enabled the way kiln-init enables a config's units at first boot.
	for _, u := range prof.Units.Enable {
		if _, err := systemd.Enable(tree.Dir, u); err != nil {
			return nil, nil, fmt.Errorf("%s: units.enable: %w", prof.File, err)
		}
	}
	for _, u := range prof.Units.Disable {
		if _, err := systemd.Disable(tree.Dir, u); err != nil {
			return nil, nil, fmt.Errorf("%s: units.disable: %w", prof.File, err)
		}
	}
	for _, u := range prof.Units.Mask {
		if _, err := systemd.Mask(tree.Dir, u); err != nil {
			return nil, nil, fmt.Errorf("%s: units.mask: %w", prof.File, err)
		}
	}
	imageJSON, err := json.MarshalIndent(md, "", "  ")
	if err != nil {
		return nil, nil, err
	}
	imageJSON = append(imageJSON, '\n')
	if err := tree.WriteFile("etc/kiln/image.json", strings.NewReader(string(imageJSON)), 0o644); err != nil {
		return nil, nil, err
	}
	b.step("tree assembled", t)

	// Secrets come with a node's config at first boot; one baked into the image would be
	// shared by every node made from it.
	t = time.Now()
	found, err := ScanSecrets(os.DirFS(tree.Dir))
	if err != nil {
		return nil, nil, err
	}
	if len(found) > 0 {
		return nil, nil, secretsError(found)
	}
	b.step("secrets scanned", t)

	t = time.Now()
	initrd := filepath.Join(b.work, "initrd.img")
	man, err := b.writeInitramfs(tree.Dir, kernel.Version, initrd)
	if err != nil {
		return nil, nil, err
	}
	md.Initramfs = &InitramfsDigest{SHA256: fileSHA256(initrd), Size: fileSize(initrd), Modules: man}
	b.step("initramfs written", t)

	t = time.Now()
	pseudo := filepath.Join(b.work, "owners.pseudo")
	pf, err := os.Create(pseudo)
	if err != nil {
		return nil, nil, err
	}
	err = tree.PseudoFile(pf)
	if cerr := pf.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, nil, err
	}
	rootImg := filepath.Join(b.work, "root."+def.Disk.RootFS)
	err = disk.MakeRootFS(b.ctx, tree.Dir, rootImg, disk.RootFSOptions{
		Type: def.Disk.RootFS, Compression: def.Disk.Compression, PseudoFile: pseudo,
		SourceDateEpoch: b.o.Created.Unix(), Logger: b.log,
	})
	if err != nil {
		return nil, nil, err
	}
	b.step("root filesystem made", t)
	// The tree is no longer needed; free the space before the disk is written.
	if err := os.RemoveAll(tree.Dir); err != nil {
		return nil, nil, err
	}

	t = time.Now()
	raw := filepath.Join(b.work, stem+".raw")
	res, err := disk.Build(raw, disk.Spec{
		Size: def.Disk.Size.Bytes(), ESPSize: def.Disk.ESPSize.Bytes(),
		RootFS: rootImg, RootFSType: def.Disk.RootFS,
		Kernel: vmlinuz, Initrd: initrd, Bootloader: efi,
		Cmdline: strings.Join(def.Kernel.Args, " "), Platform: def.Platform,
		ImageJSON: imageJSON, Title: fmt.Sprintf("kiln %s %s (%s)", def.Name, prof.Role, kernel.Version),
		Seed: stem + "@" + src.Digest,
	})
	if err != nil {
		return nil, nil, err
	}
	md.Disk = &DiskInfo{Size: fileSize(raw), GUID: res.DiskGUID, Cmdline: res.Cmdline, Partitions: res.Partitions}
	b.step("disk written", t)
	if err := os.Remove(rootImg); err != nil {
		return nil, nil, err
	}

	files := []string{}
	for _, f := range def.Formats {
		if f == "raw" {
			files = append(files, raw)
			continue
		}
		t = time.Now()
		dst := filepath.Join(b.work, stem+output.Formats[f])
		if err := output.Convert(b.ctx, raw, f, dst); err != nil {
			return nil, nil, err
		}
		files = append(files, dst)
		b.step("converted to "+f, t)
	}
	keepRaw := false
	for _, f := range def.Formats {
		keepRaw = keepRaw || f == "raw"
	}
	if !keepRaw {
		os.Remove(raw)
	}
	for i, f := range files {
		md.Outputs = append(md.Outputs, OutputInfo{Format: formatOf(f), File: filepath.Base(f), Size: fileSize(f), Allocated: allocated(f)})
		_ = i
	}
	mdFile := filepath.Join(b.work, stem+".json")
	out, err := json.MarshalIndent(md, "", "  ")
	if err != nil {
		return nil, nil, err
	}
	if err := os.WriteFile(mdFile, append(out, '\n'), 0o644); err != nil {
		return nil, nil, err
	}
	return md, append(files, mdFile), nil
}

func formatOf(file string) string {
	for f, ext := range output.Formats {
		if strings.HasSuffix(file, ext) {
			return f
		}
	}
	return ""
}

func (b *baker) fetchArtifacts() ([]string, error) {
	srcs, err := artifact.Sources(b.prof, b.lock)
	if err != nil {
		return nil, err
	}
	paths := make([]string, len(srcs))
	for i, s := range srcs {
		p, err := b.o.Cache.Fetch(b.ctx, s)
		if err != nil {
			return nil, err
		}
		paths[i] = p
	}
	return paths, nil
}

func artifactDest(a spec.Artifact) string {
	if a.Extract == nil {
		return a.Dest
	}
	if a.Extract.Dir != "" {
		return a.Extract.Dir
	}
	var ds []string
	for _, d := range a.Extract.Files {
		ds = append(ds, d)
	}
	return strings.Join(sortedStrings(ds), ",")
}

func (b *baker) layArtifact(tree *rootfs.Tree, a spec.Artifact, blob string) error {
	if a.Extract == nil {
		if err := tree.AddFile(strings.TrimPrefix(a.Dest, "/"), blob, a.Mode); err != nil {
			return fmt.Errorf("artifact %q: %w", a.Name, err)
		}
		return nil
	}
	if _, err := artifact.Extract(blob, *a.Extract, tree.Dir); err != nil {
		return fmt.Errorf("artifact %q: %w", a.Name, err)
	}
	return nil
}

func (b *baker) writeInitramfs(root, kver, dst string) ([]string, error) {
	f, err := os.Create(dst)
	if err != nil {
		return nil, err
	}
	mods := append(append([]string{}, DefaultModules...), b.def.Kernel.Modules...)
	man, err := initramfs.Write(f, initramfs.Spec{Root: root, KernelVersion: kver, Modules: mods, Init: b.o.KilnInit})
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("initramfs: %w", err)
	}
	return man.Modules, nil
}
