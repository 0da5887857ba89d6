package bake

import (
	"fmt"
	"path/filepath"
	"slices"
	"time"

	"github.com/kilnproject/kiln/builder/disk"
	"github.com/kilnproject/kiln/builder/output"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

// writeDisk writes the raw GPT disk <stem>.raw to the work directory: the ESP with the kernel,
// systemd-boot, the initramfs and image.json, and the root filesystem rootImg. It returns the
// disk's path and records its layout in md.
func (b *baker) writeDisk(rootImg string, boot bootFiles, initrd string, imageJSON []byte, md *nodeimage.Metadata) (string, error) {
	t := time.Now()
	def := b.def
	raw := filepath.Join(b.work, b.stem+".raw")
	var multiple int64
	if slices.Contains(def.Formats, "gce") {
		multiple = output.GCESizeMultiple // GCE takes whole GiB only
	}
	res, err := disk.Build(raw, disk.Spec{
		Size: def.Disk.Size.Bytes(), ESPSize: def.Disk.ESPSize.Bytes(), SizeMultiple: multiple,
		RootFS: rootImg, RootFSType: def.Disk.RootFS,
		Kernel: boot.kernel, Initrd: initrd, Bootloader: boot.bootloader,
		Cmdline: b.kernelArgs(md), Platform: def.Platform,
		ImageJSON: imageJSON, Title: fmt.Sprintf("kiln %s %s (%s)", def.Name, b.prof.Role, md.Kernel.Version),
		Seed: b.stem + "@" + md.Base.Digest,
	})
	if err != nil {
		return "", err
	}
	md.Disk = &nodeimage.DiskInfo{Size: fileSize(raw), GUID: res.DiskGUID, Cmdline: res.Cmdline, Partitions: res.Partitions}
	b.step("disk written", t)
	return raw, nil
}
