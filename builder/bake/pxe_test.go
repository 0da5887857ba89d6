package bake

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kilnproject/kiln/builder/disk"
	"github.com/kilnproject/kiln/builder/output"
	"github.com/kilnproject/kiln/builder/vm"
	"github.com/kilnproject/kiln/internal/nodeimage"
	"github.com/kilnproject/kiln/internal/testkit"
)

// pxeRepo is a test repository whose definition is a metal image listing formats.
func pxeRepo(t *testing.T, formats string) *testRepo {
	t.Helper()
	r := newRepo(t, fakeBase(true), "role: worker\n")
	def := strings.NewReplacer("platform: qemu", "platform: metal", "formats: [raw]", "formats: "+formats).Replace(testkit.ReadFile(t, r.def))
	write(t, r.def, def)
	r.lock(t)
	return r
}

// A metal image baked with raw and pxe: the pxe directory holds the disk's own kernel and
// initramfs, byte for byte, and root-a's root filesystem image; the metadata records every
// file's sha256 (in outputs and in pxe) and the disk's kernel arguments without root=.
func TestBakePXE(t *testing.T) {
	r := pxeRepo(t, "[raw, pxe]")
	res, err := r.bake(t)
	if err != nil {
		t.Fatal(err)
	}
	raw, dir := filepath.Join(r.out, "test-worker.raw"), filepath.Join(r.out, "test-worker-pxe")
	if want := []string{raw, dir, filepath.Join(r.out, "test-worker.spdx.json"), filepath.Join(r.out, "test-worker.cdx.json"), filepath.Join(r.out, "test-worker.json")}; !slices.Equal(res.Outputs, want) {
		t.Fatalf("outputs %q, want %q", res.Outputs, want)
	}
	var md nodeimage.Metadata
	if err := json.Unmarshal([]byte(testkit.ReadFile(t, filepath.Join(r.out, "test-worker.json"))), &md); err != nil {
		t.Fatal(err)
	}
	if md.PXE == nil {
		t.Fatal("test-worker.json has no pxe object")
	}
	if _, err := output.CheckPXE(dir, md.PXE); err != nil {
		t.Error(err)
	}
	boot, err := vm.ExtractBoot(context.Background(), raw, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	sameFile(t, boot.Initrd, filepath.Join(dir, "initrd.img"))
	sameFile(t, boot.Kernel, filepath.Join(dir, "vmlinuz"))
	parts, _, err := disk.Read(raw)
	if err != nil {
		t.Fatal(err)
	}
	rootA, _ := parts.Partition(nodeimage.RootAName)
	if got := readAt(t, raw, rootA.Start, md.PXE.RootFS.Size); !bytes.Equal(got, []byte(testkit.ReadFile(t, filepath.Join(dir, "rootfs.img")))) {
		t.Error("rootfs.img is not the root filesystem image in root-a")
	}
	verityArgs := fmt.Sprintf(" kiln.verity.roothash=%s kiln.verity.hashoffset=%d", md.Verity.RootHash, md.Verity.HashOffset)
	if md.PXE.KernelArgs != withoutRoot(boot.Cmdline) || md.PXE.KernelArgs != "ro kiln.platform=metal console=ttyS0"+verityArgs {
		t.Errorf("pxe kernelArgs %q; the disk's command line is %q", md.PXE.KernelArgs, boot.Cmdline)
	}
	script := testkit.ReadFile(t, filepath.Join(dir, "boot.ipxe"))
	if !strings.Contains(script, "initrd=initrd.img "+md.PXE.KernelArgs+" kiln.live.rootfs_url=${kiln-base}rootfs.img kiln.live.rootfs_sha256="+md.PXE.RootFS.SHA256+"\n") {
		t.Errorf("boot.ipxe's kernel line lacks the image's arguments and root image digest:\n%s", script)
	}
	var pxeOutputs []nodeimage.OutputInfo
	for _, o := range md.Outputs {
		if o.Format == "pxe" {
			pxeOutputs = append(pxeOutputs, o)
		}
	}
	if len(pxeOutputs) != 4 {
		t.Fatalf("outputs hold %d pxe entries, want 4: %+v", len(pxeOutputs), md.Outputs)
	}
	for i, f := range md.PXE.Files() {
		o := pxeOutputs[i]
		if o.File != "test-worker-pxe/"+f.File || o.SHA256 != f.SHA256 || o.SHA256 != fileSHA256(filepath.Join(r.out, o.File)) {
			t.Errorf("outputs entry %+v does not match the file %s (%s)", o, f.File, f.SHA256)
		}
	}
}

// A pxe-only image bakes no raw disk into the output, yet the same files.
func TestBakePXEOnly(t *testing.T) {
	r := pxeRepo(t, "[pxe]")
	res, err := r.bake(t)
	if err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(r.out)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if want := []string{"test-worker-pxe", "test-worker.cdx.json", "test-worker.json", "test-worker.spdx.json"}; !slices.Equal(names, want) {
		t.Errorf("output directory holds %q, want %q", names, want)
	}
	if _, err := output.CheckPXE(res.Outputs[0], res.Metadata.PXE); err != nil {
		t.Error(err)
	}
}

// A bake that fails after the pxe directory was written leaves neither it nor any other
// output; an argument iPXE would expand fails the bake naming it.
func TestBakePXEFailureLeavesNothing(t *testing.T) {
	t.Run("conversion after pxe fails", func(t *testing.T) {
		r := pxeRepo(t, "[raw, pxe, qcow2]")
		bin := t.TempDir()
		write(t, filepath.Join(bin, "qemu-img"), "#!/bin/sh\necho 'qemu-img: disk full' >&2\nexit 1\n")
		os.Chmod(filepath.Join(bin, "qemu-img"), 0o755)
		t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))
		_, err := r.bake(t)
		r.wantBakeError(t, err, []string{"convert to qcow2", "disk full"})
	})
	t.Run("iPXE variable in a kernel argument", func(t *testing.T) {
		r := pxeRepo(t, "[raw, pxe]")
		write(t, r.def, strings.Replace(testkit.ReadFile(t, r.def), "args: [console=ttyS0]", `args: [console=ttyS0, "kiln.config.url=http://x/${net0/mac}"]`, 1))
		_, err := r.bake(t)
		r.wantBakeError(t, err, []string{"pxe", `"kiln.config.url=http://x/${net0/mac}"`, "iPXE would expand"})
	})
}

func sameFile(t *testing.T, a, b string) {
	t.Helper()
	if x, y := testkit.ReadFile(t, a), testkit.ReadFile(t, b); x != y {
		t.Errorf("%s (%d bytes) differs from %s (%d bytes)", b, len(y), a, len(x))
	}
}

func readAt(t *testing.T, p string, off, n int64) []byte {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, n)
	if _, err := io.ReadFull(io.NewSectionReader(f, off, n), buf); err != nil {
		t.Fatal(err)
	}
	return buf
}

// withoutRoot is a kernel command line without root= and rootfstype=.
func withoutRoot(cmdline string) string {
	var keep []string
	for _, a := range strings.Fields(cmdline) {
		if !strings.HasPrefix(a, "root=") && !strings.HasPrefix(a, "rootfstype=") {
			keep = append(keep, a)
		}
	}
	return strings.Join(keep, " ")
}
