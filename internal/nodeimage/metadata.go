package nodeimage

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// ContractVersion is the version of the bake↔boot contract this package describes: what the
// bake lays where, and what kiln-init reads. It changes when an image of the new layout could
// not be booted or updated by an older kiln-init.
const ContractVersion = 1

// Metadata describes a baked image. It is ImageJSONPath in the root filesystem and
// ESPImageJSONPath on the ESP and, with the disk layout and outputs added, <image>-<role>.json
// beside the bake's outputs.
type Metadata struct {
	Name     string    `json:"name"`
	Role     string    `json:"role"`
	Platform string    `json:"platform"`
	Created  time.Time `json:"created"`
	Kiln     string    `json:"kiln"`
	// Contract is the version of the bake↔boot contract the image follows (ContractVersion
	// when baked); an update refuses an image of a contract its kiln-init does not know.
	Contract  int            `json:"contract,omitempty"`
	Base      BaseInfo       `json:"base"`
	Kernel    KernelInfo     `json:"kernel"`
	Artifacts []ArtifactInfo `json:"artifacts"`
	RootFS    string         `json:"rootfs"`
	// Verity is the root image's dm-verity tree. It is only in <image>-<role>.json and on the
	// boot entry, not in the image's own image.json (the root cannot hold its own hash).
	Verity    *VerityInfo      `json:"verity,omitempty"`
	Disk      *DiskInfo        `json:"disk,omitempty"`
	Outputs   []OutputInfo     `json:"outputs,omitempty"`
	Initramfs *InitramfsDigest `json:"initramfs,omitempty"`
	// PXE is set when the definition lists the pxe format: the files of <image>-<role>-pxe/.
	// It is only in <image>-<role>.json, not in the image's own image.json (rootfs.img cannot
	// hold its own digest).
	PXE *PXEInfo `json:"pxe,omitempty"`
	// Kubernetes is set when the role's profile has a kubernetes section.
	Kubernetes *KubernetesInfo `json:"kubernetes,omitempty"`
	// SBOM is the image's software bill of materials written beside it. It is only in
	// <image>-<role>.json, not in the image's own image.json (the SBOM lists the tree).
	SBOM *SBOMInfo `json:"sbom,omitempty"`
	// Contents is what a node config may rely on in the image (writable locations, users,
	// groups, unit files). Images baked before kiln recorded it lack it.
	Contents *Contents `json:"contents,omitempty"`
}

// KubernetesInfo is what the image carries to run Kubernetes: the release (kubelet's own
// version), the runtime, the containerd version and the pre-pulled images, which are in the
// OCI image layout at ImagesPath.
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
	// Unpacked is set when the image is in containerd's store laid at bake (StoreSeedPath), its
	// layers applied under SnapshotsPath: ready when containerd starts, nothing to import.
	Unpacked bool `json:"unpacked,omitempty"`
	// ImportReason says why an image is not Unpacked: first boot imports it.
	ImportReason string `json:"importReason,omitempty"`
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

// SBOMInfo names the image's SPDX document (<image>-<role>.spdx.json), the same bill of
// materials as CycloneDX (<image>-<role>.cdx.json), and how many packages of each kind they
// list (deb, artifact, image, go, kernel).
type SBOMInfo struct {
	File      string         `json:"file"`
	SHA256    string         `json:"sha256"`
	CycloneDX *FileDigest    `json:"cyclonedx,omitempty"`
	Packages  map[string]int `json:"packages"`
}

// FileDigest is a file beside the metadata and its hex sha256.
type FileDigest struct {
	File   string `json:"file"`
	SHA256 string `json:"sha256"`
}

// Files are the bills of materials the metadata names, SPDX first.
func (s *SBOMInfo) Files() []FileDigest {
	files := []FileDigest{{File: s.File, SHA256: s.SHA256}}
	if s.CycloneDX != nil {
		files = append(files, *s.CycloneDX)
	}
	return files
}

// ArtifactInfo records one artifact laid into the image.
type ArtifactInfo struct {
	Name   string `json:"name"`
	Source string `json:"source"`
	SHA256 string `json:"sha256"`
	Dest   string `json:"dest"`
}

// VerityInfo describes the dm-verity hash tree the bake appended to the root image (the same
// file is root-a and the pxe output's rootfs.img): the filesystem fills DataBlocks 4096-byte
// blocks, the tree's superblock is at HashOffset (= DataBlocks × 4096) and the tree ends at
// Size, the image's size.
type VerityInfo struct {
	RootHash   string `json:"rootHash"`
	Salt       string `json:"salt"`
	Algorithm  string `json:"algorithm"`
	DataBlocks uint64 `json:"dataBlocks"`
	HashOffset int64  `json:"hashOffset"`
	Size       int64  `json:"size"`
}

// InitramfsDigest summarises the initramfs.
type InitramfsDigest struct {
	SHA256  string   `json:"sha256"`
	Size    int64    `json:"size"`
	Modules []string `json:"modules"`
}

// DiskInfo is the partition table of the raw disk.
type DiskInfo struct {
	Size       int64       `json:"size"`
	GUID       string      `json:"guid"`
	Cmdline    string      `json:"cmdline"`
	Partitions []Partition `json:"partitions"`
}

// Partition is one GPT entry of a disk the bake wrote. Start and Size are in bytes.
type Partition struct {
	Number int
	Name   string
	Type   string // type GUID, lowercase
	GUID   string // unique partition GUID, lowercase (PARTUUID)
	Start  int64
	Size   int64
}

// PXEInfo is the pxe output: the directory <image>-<role>-pxe/ (Dir, beside the other outputs)
// holding what a network boot fetches, and the kernel arguments it boots with. A server
// renders its own iPXE script from it:
//
//	kernel <base>/<Kernel.File> initrd=<Initrd.File> <KernelArgs> kiln.live.rootfs_url=<base>/<RootFS.File> kiln.live.rootfs_sha256=<RootFS.SHA256>
//	initrd <base>/<Initrd.File>
//	boot
type PXEInfo struct {
	// Dir is the directory's name, <image>-<role>-pxe (PXEDirSuffix), relative to the
	// metadata file.
	Dir string `json:"dir"`
	// Kernel is the kernel (PXEKernelName), the same file as KernelPath on the disk's ESP.
	Kernel PXEFile `json:"kernel"`
	// Initrd is kiln's initramfs (PXEInitrdName), byte for byte the one at InitrdPath on the
	// disk's ESP: one initramfs boots from a disk and from the network.
	Initrd PXEFile `json:"initrd"`
	// RootFS is the root filesystem image (PXERootFSName), the squashfs or erofs (Metadata.RootFS)
	// that is root-a on the disk.
	RootFS PXEFile `json:"rootfs"`
	// Script is the live-boot iPXE script (PXEScriptName), which takes the directory's URL from
	// the iPXE variable ${kiln-base}.
	Script PXEFile `json:"script"`
	// KernelArgs is the kernel command line of a network boot without the mode's parameters:
	// kiln's own (ro, kiln.platform=) and the definition's kernel.args, the disk boot's
	// command line without root= and rootfstype= (which name a partition). A live boot adds
	// kiln.live.rootfs_url= and kiln.live.rootfs_sha256=, an install the kiln.install.* ones,
	// and either may add kiln.config.url=.
	KernelArgs string `json:"kernelArgs"`
}

// PXEFile is one file of the pxe output directory.
type PXEFile struct {
	// File is its name inside PXEInfo.Dir.
	File string `json:"file"`
	// SHA256 is the hex digest of the whole file; Size its size in bytes.
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size"`
}

// Files are the directory's files: kernel, initrd, rootfs, script.
func (p *PXEInfo) Files() []PXEFile { return []PXEFile{p.Kernel, p.Initrd, p.RootFS, p.Script} }

// OutputInfo is one written file. SHA256 is the hex digest of the whole file: kiln publish
// records it on the cloud image as the image's identity, and checks the file against it. The
// pxe format has one entry per file of its directory, File being "<dir>/<name>"
// (metal-worker-pxe/vmlinuz).
type OutputInfo struct {
	Format    string `json:"format"`
	File      string `json:"file"`
	Size      int64  `json:"size"`
	Allocated int64  `json:"allocated"`
	SHA256    string `json:"sha256,omitempty"`
}

// ReadImage reads what the bake recorded in the node's root (ImageJSONPath); a root without
// the file gives a zero Metadata.
func ReadImage(root string) (Metadata, error) {
	var img Metadata
	b, err := os.ReadFile(filepath.Join(root, ImageJSONPath))
	switch {
	case errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR):
		return img, nil
	case err != nil:
		return img, fmt.Errorf("%s: %w", ImageJSONPath, err)
	}
	if err := json.Unmarshal(b, &img); err != nil {
		return img, fmt.Errorf("%s: %w", ImageJSONPath, err)
	}
	return img, nil
}

// Runtime is the container runtime the image was baked for (containerd when it records
// none).
func (m Metadata) Runtime() (Runtime, error) {
	name := ""
	if m.Kubernetes != nil {
		name = m.Kubernetes.Runtime
	}
	r, ok := RuntimeOf(name)
	if !ok {
		return Runtime{}, fmt.Errorf("%s: kubernetes.runtime %q is not one this kiln-init knows", ImageJSONPath, name)
	}
	return r, nil
}
