package qemutests

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/kilnproject/kiln/builder/disk"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

// cloudImage is what a cloud's image must carry and how its outputs must come out.
type cloudImage struct {
	def     string
	args    []string // on the loader entry's command line
	modules []string // in the initramfs, or built into the kernel
	rules   string   // udev rules file, from overlays/<def>
}

var cloudImages = []cloudImage{
	{def: "aws", args: []string{"kiln.platform=aws", "console=ttyS0,115200n8", "nvme_core.io_timeout=4294967295"},
		modules: []string{"nvme", "nvme_core", "ena"}, rules: "usr/lib/udev/rules.d/65-kiln-aws-ebs.rules"},
	{def: "gce", args: []string{"kiln.platform=gce", "console=ttyS0,115200n8", "nvme_core.io_timeout=4294967295"},
		modules: []string{"virtio_scsi", "sd_mod", "gve", "virtio_net", "virtio_pci", "nvme"}, rules: "usr/lib/udev/rules.d/65-kiln-gce-disk.rules"},
}

// images/aws.yaml and images/gce.yaml bake for the worker role into what each cloud imports:
// the loader entry carries the cloud's kernel arguments, the initramfs its disk and NIC
// drivers (or the kernel has them built in), the root its udev rules for stable disk names;
// AWS gets a raw disk and a streamOptimized VMDK, GCE a gzip'd oldgnu tar holding one sparse
// disk.raw of whole GiB.
func TestCloudImagesBake(t *testing.T) {
	top := newEnv(t)
	for _, ci := range cloudImages {
		t.Run(ci.def, func(t *testing.T) {
			e := *top
			e.t = t
			raw := e.bake(ci.def, "worker")
			out := filepath.Dir(raw)
			var md nodeimage.Metadata
			b, err := os.ReadFile(filepath.Join(out, ci.def+"-worker.json"))
			if err != nil || json.Unmarshal(b, &md) != nil {
				t.Fatalf("image metadata: %v", err)
			}
			if ci.def == "gce" {
				if _, err := os.Stat(raw); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("gce lists no raw format, yet %s is there (%v)", raw, err)
				}
				raw = checkGCEImage(t, filepath.Join(out, ci.def+"-worker.tar.gz"))
			} else {
				checkVMDK(t, raw, strings.TrimSuffix(raw, ".raw")+".vmdk")
			}
			_, esp, err := disk.Read(raw)
			if err != nil {
				t.Fatal(err)
			}
			options := loaderOptions(esp.Entry)
			for _, a := range ci.args {
				if !slices.Contains(options, a) {
					t.Errorf("loader entry options %q lack %s", options, a)
				}
			}
			root, err := extractPartition(raw, nodeimage.RootAName, t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			builtin := squashfsFile(t, root, "usr/lib/modules/"+md.Kernel.Version+"/modules.builtin")
			for _, m := range ci.modules {
				if !hasModule(md.Initramfs.Modules, m) && !hasModule(strings.Fields(builtin), m) {
					t.Errorf("module %s is neither in the initramfs %q nor built into %s", m, md.Initramfs.Modules, md.Kernel.Version)
				}
			}
			want, err := os.ReadFile(filepath.Join(repoRoot(t), "overlays", ci.def, ci.rules))
			if err != nil {
				t.Fatal(err)
			}
			if got := squashfsFile(t, root, ci.rules); got != string(want) {
				t.Errorf("/%s in the root differs from overlays/%s", ci.rules, ci.def)
			}
		})
	}
}

// checkVMDK checks that the VMDK is what AWS VM Import takes, the raw disk as a
// streamOptimized VMDK, and logs the sizes.
func checkVMDK(t *testing.T, raw, vmdk string) {
	t.Helper()
	outb, err := exec.Command("qemu-img", "info", "--output=json", vmdk).Output()
	if err != nil {
		t.Fatalf("qemu-img info %s: %v", vmdk, err)
	}
	var info struct {
		Format         string `json:"format"`
		VirtualSize    int64  `json:"virtual-size"`
		FormatSpecific struct {
			Data struct {
				CreateType string `json:"create-type"`
			} `json:"data"`
		} `json:"format-specific"`
	}
	if err := json.Unmarshal(outb, &info); err != nil {
		t.Fatal(err)
	}
	rawSize, rawAlloc := fileSizes(t, raw)
	if info.Format != "vmdk" || info.FormatSpecific.Data.CreateType != "streamOptimized" || info.VirtualSize != rawSize {
		t.Errorf("%s: format %s (%s) of %d bytes; want vmdk (streamOptimized) of %d", vmdk, info.Format, info.FormatSpecific.Data.CreateType, info.VirtualSize, rawSize)
	}
	vmdkSize, _ := fileSizes(t, vmdk)
	t.Logf("aws: raw %d MiB (%d MiB allocated), vmdk %d MiB", rawSize>>20, rawAlloc>>20, vmdkSize>>20)
}

// checkGCEImage checks the tarball as GCE's importer reads it, gzip'd and holding exactly one
// entry, disk.raw, in oldgnu format, sparse, its size whole GiB; it unpacks disk.raw
// (sparse) and returns its path.
func checkGCEImage(t *testing.T, file string) string {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(bufio.NewReader(f))
	if err != nil {
		t.Fatal(err)
	}
	var block [512]byte
	if _, err := io.ReadFull(zr, block[:]); err != nil {
		t.Fatal(err)
	}
	// oldgnu's magic is "ustar  \0" (ustar and GNU's new format have others); 'S' is its
	// sparse file type.
	if magic := string(block[257:265]); magic != "ustar  \x00" || block[156] != 'S' {
		t.Errorf("first tar header: magic %q type %q, want oldgnu sparse", magic, block[156])
	}
	f.Seek(0, io.SeekStart)
	if err := zr.Reset(bufio.NewReader(f)); err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	var names []string
	var size int64
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names, size = append(names, hdr.Name), hdr.Size
	}
	if len(names) != 1 || names[0] != "disk.raw" || size%(1<<30) != 0 {
		t.Fatalf("tarball holds %q (last %d bytes), want one disk.raw of whole GiB", names, size)
	}
	dir := t.TempDir()
	if b, err := exec.Command("tar", "-xzf", file, "-C", dir).CombinedOutput(); err != nil {
		t.Fatalf("tar -x: %v: %s", err, b)
	}
	raw := filepath.Join(dir, "disk.raw")
	rawSize, rawAlloc := fileSizes(t, raw)
	tgz, _ := fileSizes(t, file)
	t.Logf("gce: disk.raw %d MiB (%d MiB allocated), tar.gz %d MiB", rawSize>>20, rawAlloc>>20, tgz>>20)
	return raw
}

// fileSizes returns a file's size and the bytes allocated to it.
func fileSizes(t *testing.T, name string) (size, allocated int64) {
	t.Helper()
	fi, err := os.Stat(name)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size(), fi.Sys().(*syscall.Stat_t).Blocks * 512
}

// loaderOptions returns the arguments of a loader entry's options line.
func loaderOptions(entry string) []string {
	for _, l := range strings.Split(entry, "\n") {
		if rest, ok := strings.CutPrefix(l, "options "); ok {
			return strings.Fields(rest)
		}
	}
	return nil
}

// squashfsFile reads a file from a squashfs image with unsquashfs.
func squashfsFile(t *testing.T, image, name string) string {
	t.Helper()
	b, err := exec.Command("unsquashfs", "-cat", image, name).Output()
	if err != nil {
		t.Fatalf("unsquashfs -cat %s: %v", name, err)
	}
	return string(b)
}

// hasModule reports whether a module file path in paths is module name ('-' and '_' alike).
func hasModule(paths []string, name string) bool {
	norm := func(s string) string { return strings.ReplaceAll(s, "-", "_") }
	for _, p := range paths {
		base := path.Base(p)
		if i := strings.Index(base, ".ko"); i > 0 && norm(base[:i]) == norm(name) {
			return true
		}
	}
	return false
}
