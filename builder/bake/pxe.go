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

// writePXE writes the pxe directory <stem>-pxe to the work directory when the definition lists
// the pxe format: the kernel and initramfs that went on the ESP, the root filesystem image that
// went into root-a, and boot.ipxe. The kernel arguments are the disk's without root= and
// rootfstype=. It records the files in md and returns the directory, "" without pxe.
func (b *baker) writePXE(rootImg string, boot bootFiles, initrd string, md *nodeimage.Metadata) (string, error) {
	if !slices.Contains(b.def.Formats, "pxe") {
		return "", nil
	}
	t := time.Now()
	dir := filepath.Join(b.work, b.stem+nodeimage.PXEDirSuffix)
	info, err := output.WritePXE(dir, output.PXESource{
		Kernel: boot.kernel, Initrd: initrd, RootFS: rootImg,
		KernelArgs: disk.BootArgs(b.def.Platform, b.kernelArgs(md)),
		Title:      fmt.Sprintf("%s %s (%s)", b.def.Name, b.prof.Role, md.Kernel.Version),
	})
	if err != nil {
		return "", err
	}
	md.PXE = info
	b.step("pxe written", t)
	return dir, nil
}
