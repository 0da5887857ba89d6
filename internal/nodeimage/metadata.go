package nodeimage

import "time"

// Metadata describes a baked image. It is ImageJSONPath in the root filesystem and
// ESPImageJSONPath on the ESP and, with the disk layout and outputs added, <image>-<role>.json
// beside the bake's outputs.
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

// OutputInfo is one written file. SHA256 is the hex digest of the whole file: kiln publish
// records it on the cloud image as the image's identity, and checks the file against it.
type OutputInfo struct {
	Format    string `json:"format"`
	File      string `json:"file"`
	Size      int64  `json:"size"`
	Allocated int64  `json:"allocated"`
	SHA256    string `json:"sha256,omitempty"`
}
