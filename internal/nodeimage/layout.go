package nodeimage

// GPT partition names and filesystem labels.
const (
	// ESPName is the EFI system partition's GPT name; ESPLabel its FAT volume label.
	ESPName  = "ESP"
	ESPLabel = "ESP"
	// RootAName and RootBName are the A/B root slots; the bake writes root-a.
	RootAName = "root-a"
	RootBName = "root-b"
	// DataName is the partition stage 1 adds at first boot for /var; DataLabel is the label of
	// the ext4 filesystem it makes there.
	DataName  = "data"
	DataLabel = "kiln-data"
)

// Kernel command line keys of the verified root (without the "kiln." prefix): the root hash of
// the root image's dm-verity tree and the byte offset of the tree's superblock in the image (the
// image's filesystem ends there). The bake writes both on the boot entry and in the pxe output's
// kernel arguments; stage 1 opens the root through dm-verity with them.
const (
	VerityRootHashKey   = "verity.roothash"
	VerityHashOffsetKey = "verity.hashoffset"
)

// Partition type GUIDs, lowercase as blkid and lsblk print them.
const (
	TypeESP       = "c12a7328-f81f-11d2-ba4b-00a0c93ec93b"
	TypeRootX86   = "4f68bce3-e8cd-4db1-96e7-fbcaf984b709"
	TypeLinuxData = "0fc63daf-8483-4772-8e79-3d69d8477de4"
)

// Paths on the ESP (FAT, from its root).
const (
	// BootloaderPath is the removable-media UEFI boot path, holding systemd-boot.
	BootloaderPath = "/EFI/BOOT/BOOTX64.EFI"
	// LoaderConfPath is systemd-boot's configuration; it names LoaderEntryName as default.
	LoaderConfPath = "/loader/loader.conf"
	// LoaderEntriesDir holds the boot loader entries.
	LoaderEntriesDir = "/loader/entries"
	// LoaderEntryName is slot A's boot loader entry, LoaderEntryPath its path.
	LoaderEntryName = "kiln-a.conf"
	LoaderEntryPath = LoaderEntriesDir + "/" + LoaderEntryName
	// KernelPath and InitrdPath are slot A's kernel and initramfs.
	KernelPath = "/kiln/a/vmlinuz"
	InitrdPath = "/kiln/a/initrd.img"
	// ESPImageJSONPath is the image metadata on the ESP, the same document as ImageJSONPath.
	ESPImageJSONPath = "/kiln/image.json"
)

// FWCfgName is the QEMU fw_cfg item through which `kiln run` passes a node config and first
// boot reads it (qemu -fw_cfg name=opt/dev.kiln/config,file=config.ign).
const FWCfgName = "opt/dev.kiln/config"

// Paths inside the initramfs.
const (
	// ModulesLoadPath lists the kernel modules stage 1 loads, one absolute path a line, in
	// load order.
	ModulesLoadPath = "/etc/kiln/modules.load"
)

// Paths in the root filesystem, absolute from the node's root.
const (
	// ImageJSONPath is the image metadata (Metadata) the bake writes.
	ImageJSONPath = "/etc/kiln/image.json"
	// TemplatesPath holds the role's templates, baked from the profile and rendered at first
	// boot.
	TemplatesPath = "/usr/lib/kiln/templates"
	// ImagesPath is the OCI image layout holding the role's pre-pulled container images.
	ImagesPath = "/usr/lib/kiln/images"
	// StoreSeedPath is containerd's store for those images, laid at bake (metadata, content
	// records, committed snapshots): first boot copies it to StoreRoot before containerd first
	// starts. Its content blobs are symlinks into ImagesPath, its snapshots' fs directories
	// symlinks into SnapshotsPath.
	StoreSeedPath = "/usr/lib/kiln/containerd"
	// SnapshotsPath holds each seeded image's layers applied into one read-only directory,
	// named by the image's chain ID (the hex of its sha256): the lower directory containerd's
	// overlay snapshotter stacks each container on.
	SnapshotsPath = "/usr/lib/kiln/snapshots"
	// StoreRoot is containerd's root directory on the node (containerd's config.toml root).
	StoreRoot = "/var/lib/containerd"
	// EmbeddedConfigPath is the image's default Ignition config; a node's own config is merged
	// over it.
	EmbeddedConfigPath = "/usr/lib/kiln/config.ign"
)

// The pxe output: a directory <image>-<role>+PXEDirSuffix beside the other outputs holding
// these files (see PXEInfo).
const (
	PXEDirSuffix  = "-pxe"
	PXEKernelName = "vmlinuz"
	PXEInitrdName = "initrd.img"
	PXERootFSName = "rootfs.img"
	PXEScriptName = "boot.ipxe"
)

// The iso output: <image>-<role>+ISOSuffix, an ISO 9660 volume labelled ISOLabel that boots
// live. Its El Torito UEFI entry (and, on a USB stick, the GPT's EFI system partition) is a FAT
// image at ISOBootImagePath holding the ESP's systemd-boot, loader entry, kernel and
// initramfs; the root filesystem image is ISORootFSPath. The loader entry's command line says
// kiln.live.rootfs_url=MediumScheme+ISORootFSPath: stage 1 finds the volume by its label,
// mounts it read-only and copies the image into RAM, checked against its sha256 as a network
// live boot's. An installer ISO (definition field iso.install) also holds the raw disk image,
// zstd-compressed, at ISODiskPath, and its default entry says
// kiln.install.image_url=MediumScheme+ISODiskPath: stage 1 writes it to a disk from the medium.
const (
	ISOSuffix     = ".iso"
	ISOLabel      = "KILN_LIVE"
	ISORootFSPath = "/kiln/root.img"
	ISODiskPath   = "/kiln/disk.raw.zst"
	// ISOConfigPath is a node config added to an iso (kiln iso add-config), read by first
	// boot from the medium.
	ISOConfigPath    = "/kiln/config.ign"
	ISOBootImagePath = "/boot/efi.img"
	// ISOLiveEntryName is an installer ISO's loader entry that boots live, beside its default
	// install entry.
	ISOLiveEntryName = "kiln-live.conf"
	// MediumScheme starts a kiln.live.rootfs_url= naming a file on the boot medium.
	MediumScheme = "medium:"
)

// Runtime is what a kubernetes.runtime of the bake means on the node: where the pre-pulled
// images go in containerd (both runtimes keep images in the node's containerd: Docker Engine
// through its containerd image store) and the socket kubelet talks CRI on.
type Runtime struct {
	Name string
	// Namespace is the containerd namespace the runtime's images live in.
	Namespace string
	// Socket is the CRI socket kubelet's containerRuntimeEndpoint names.
	Socket string
	// KeepLayers says whether an image ready in the store laid at bake keeps its compressed
	// layers in the image. The CRI runs images without them (containerd's
	// discard_unpacked_layers); Docker Engine's containerd image store is not known to, so its
	// images keep them.
	KeepLayers bool
}

// Runtimes are the container runtimes a bake can lay, by kubernetes.runtime.
var runtimes = map[string]Runtime{
	"containerd": {Name: "containerd", Namespace: "k8s.io", Socket: ContainerdSocket},
	"docker":     {Name: "docker", Namespace: "moby", Socket: "/run/cri-dockerd.sock", KeepLayers: true},
}

// RuntimeNames are the kubernetes.runtime names a bake can lay, the default (containerd) first.
func RuntimeNames() []string { return []string{"containerd", "docker"} }

// RuntimeOf is the runtime name stands for; "" (an image baked without a kubernetes section,
// or by a kiln that did not record it) is containerd. ok is false for a name kiln does not know.
func RuntimeOf(name string) (r Runtime, ok bool) {
	if name == "" {
		name = RuntimeNames()[0]
	}
	r, ok = runtimes[name]
	return r, ok
}

// RuntimeImageLabels are the labels the pre-pulled images carry in containerd, whether seeded
// at bake or imported at boot: the CRI treats them as its own (as if it had pulled them) and
// pinned, so kubelet's image garbage collection never deletes an image a node without a
// registry cannot get back.
func RuntimeImageLabels() map[string]string {
	return map[string]string{"io.cri-containerd.image": "managed", "io.cri-containerd.pinned": "pinned"}
}
