package qemutests

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kilnproject/kiln/builder/output"
	"github.com/kilnproject/kiln/builder/vm"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

// images/metal.yaml bakes for the worker role into a raw disk and a pxe directory made of the
// same parts: the directory's kernel and initramfs are the ESP's, byte for byte, its rootfs.img
// is root-a's root filesystem, every file's sha256 is what the metadata records (kiln inspect
// agrees), the kernel arguments are the disk's without root=, and the NIC and live-boot modules
// the definition names are in the initramfs or built into the kernel.
func TestMetalImageBake(t *testing.T) {
	e := newEnv(t)
	raw := e.bake("metal", "worker")
	out := filepath.Dir(raw)
	dir := filepath.Join(out, "metal-worker"+nodeimage.PXEDirSuffix)
	var md nodeimage.Metadata
	b, err := os.ReadFile(filepath.Join(out, "metal-worker.json"))
	if err != nil || json.Unmarshal(b, &md) != nil || md.PXE == nil {
		t.Fatalf("image metadata without a pxe object: %v\n%s", err, b)
	}
	if _, err := output.CheckPXE(dir, md.PXE); err != nil {
		t.Error(err)
	}
	for _, f := range md.PXE.Files() {
		i := slices.IndexFunc(md.Outputs, func(o nodeimage.OutputInfo) bool { return o.File == md.PXE.Dir+"/"+f.File })
		if i < 0 || md.Outputs[i].SHA256 != f.SHA256 || md.Outputs[i].Format != "pxe" {
			t.Errorf("outputs lack %s with sha256 %s: %+v", f.File, f.SHA256, md.Outputs)
		}
	}
	boot, err := vm.ExtractBoot(context.Background(), raw, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	sameBytes(t, boot.Initrd, filepath.Join(dir, nodeimage.PXEInitrdName))
	sameBytes(t, boot.Kernel, filepath.Join(dir, nodeimage.PXEKernelName))
	rootA, err := extractPartition(raw, nodeimage.RootAName, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if !samePrefix(t, rootA, filepath.Join(dir, nodeimage.PXERootFSName)) {
		t.Errorf("rootfs.img (%d bytes) is not the root filesystem in root-a", md.PXE.RootFS.Size)
	}
	for _, a := range []string{"console=tty0", "console=ttyS0,115200n8", "kiln.platform=metal"} {
		if !slices.Contains(strings.Fields(md.PXE.KernelArgs), a) {
			t.Errorf("pxe kernelArgs %q lack %s", md.PXE.KernelArgs, a)
		}
	}
	var disk []string
	for _, a := range strings.Fields(boot.Cmdline) {
		if !strings.HasPrefix(a, "root=") && !strings.HasPrefix(a, "rootfstype=") {
			disk = append(disk, a)
		}
	}
	if strings.Join(disk, " ") != md.PXE.KernelArgs {
		t.Errorf("pxe kernelArgs %q; the disk boots with %q", md.PXE.KernelArgs, boot.Cmdline)
	}
	builtin := squashfsFile(t, rootA, "usr/lib/modules/"+md.Kernel.Version+"/modules.builtin")
	for _, m := range []string{"virtio_net", "mlx4_en", "mlx5_core", "loop", "vfat", "nls_cp437", "nls_ascii", "nls_utf8", "nvme", "sd_mod"} {
		if !hasModule(md.Initramfs.Modules, m) && !hasModule(strings.Fields(builtin), m) {
			t.Errorf("module %s is neither in the initramfs nor built into %s", m, md.Kernel.Version)
		}
	}
	if text := e.run(e.repo, e.kiln, "inspect", dir); strings.Count(text, "  ok\n") != 4 {
		t.Errorf("kiln inspect %s: want 4 files ok:\n%s", dir, text)
	}
	t.Logf("pxe: vmlinuz %d KiB, initrd.img %d KiB, rootfs.img %d MiB", md.PXE.Kernel.Size>>10, md.PXE.Initrd.Size>>10, md.PXE.RootFS.Size>>20)
}

// sameBytes fails the test unless the two files hold the same bytes.
func sameBytes(t *testing.T, want, got string) {
	t.Helper()
	a, err := os.ReadFile(want)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(got)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, b) {
		t.Errorf("%s (%d bytes) is not %s (%d bytes)", got, len(b), want, len(a))
	}
}

// samePrefix reports whether the partition image part starts with the bytes of the file img
// (the partition has headroom after the filesystem).
func samePrefix(t *testing.T, part, img string) bool {
	t.Helper()
	f, err := os.Open(img)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	p, err := os.Open(part)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	fi, _ := f.Stat()
	a, b := make([]byte, 1<<20), make([]byte, 1<<20)
	for off := int64(0); off < fi.Size(); off += int64(len(a)) {
		n, err := io.ReadFull(f, a)
		if err != nil && err != io.ErrUnexpectedEOF {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(p, b[:n]); err != nil || !bytes.Equal(a[:n], b[:n]) {
			return false
		}
	}
	return true
}
