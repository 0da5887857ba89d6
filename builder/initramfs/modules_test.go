package initramfs

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// fakeModulesDir lays out a kernel module directory like depmod leaves it.
func fakeModulesDir(t *testing.T, root, kver string) string {
	t.Helper()
	dir := filepath.Join(root, "usr/lib/modules", kver)
	dep := strings.Join([]string{
		"kernel/drivers/virtio/virtio.ko:",
		"kernel/drivers/virtio/virtio_ring.ko:",
		"kernel/drivers/virtio/virtio_pci_modern_dev.ko:",
		"kernel/drivers/virtio/virtio_pci.ko: kernel/drivers/virtio/virtio_pci_modern_dev.ko kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko",
		"kernel/drivers/block/virtio_blk.ko: kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko",
		"kernel/drivers/scsi/scsi_common.ko:",
		"kernel/drivers/scsi/scsi_mod.ko: kernel/drivers/scsi/scsi_common.ko",
		"kernel/drivers/scsi/sd_mod.ko: kernel/drivers/scsi/scsi_mod.ko kernel/drivers/scsi/scsi_common.ko",
		"kernel/fs/squashfs/squashfs.ko:",
		"kernel/lib/libcrc32c.ko:",
		"kernel/fs/erofs/erofs.ko.xz: kernel/lib/libcrc32c.ko",
		"kernel/arch/x86/crypto/crc32c-intel.ko:",
		"kernel/test/loop_a.ko: kernel/test/loop_b.ko",
		"kernel/test/loop_b.ko: kernel/test/loop_a.ko",
		"kernel/test/dangling.ko: kernel/test/missing.ko",
		"",
	}, "\n")
	builtin := "kernel/fs/ext4/ext4.ko\nkernel/drivers/nvme/host/nvme.ko\nkernel/crypto/crc32c_generic.ko\n"
	write(t, filepath.Join(dir, "modules.dep"), dep)
	write(t, filepath.Join(dir, "modules.builtin"), builtin)
	for _, line := range strings.Split(dep, "\n") {
		if mod, _, ok := strings.Cut(line, ":"); ok {
			write(t, filepath.Join(dir, mod), "module "+mod)
		}
	}
	return dir
}

func write(t *testing.T, name, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(name, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestResolve(t *testing.T) {
	dir := fakeModulesDir(t, t.TempDir(), "6.1.0-test-amd64")
	tests := []struct {
		name    string
		modules []string
		want    []string
		wantErr []string // substrings of the error
	}{
		{
			name:    "no dependencies",
			modules: []string{"squashfs"},
			want:    []string{"kernel/fs/squashfs/squashfs.ko"},
		},
		{
			name:    "dependencies first, each once",
			modules: []string{"virtio_pci", "virtio_blk"},
			want: []string{
				"kernel/drivers/virtio/virtio_pci_modern_dev.ko",
				"kernel/drivers/virtio/virtio.ko",
				"kernel/drivers/virtio/virtio_ring.ko",
				"kernel/drivers/virtio/virtio_pci.ko",
				"kernel/drivers/block/virtio_blk.ko",
			},
		},
		{
			name:    "transitive dependencies",
			modules: []string{"sd_mod"},
			want: []string{
				"kernel/drivers/scsi/scsi_common.ko",
				"kernel/drivers/scsi/scsi_mod.ko",
				"kernel/drivers/scsi/sd_mod.ko",
			},
		},
		{
			name:    "dash and underscore are the same",
			modules: []string{"crc32c_intel", "virtio-blk"},
			want: []string{
				"kernel/arch/x86/crypto/crc32c-intel.ko",
				"kernel/drivers/virtio/virtio.ko",
				"kernel/drivers/virtio/virtio_ring.ko",
				"kernel/drivers/block/virtio_blk.ko",
			},
		},
		{
			name:    "compressed module file",
			modules: []string{"erofs"},
			want:    []string{"kernel/lib/libcrc32c.ko", "kernel/fs/erofs/erofs.ko.xz"},
		},
		{
			name:    "built-in modules are skipped",
			modules: []string{"ext4", "nvme", "crc32c-generic", "squashfs"},
			want:    []string{"kernel/fs/squashfs/squashfs.ko"},
		},
		{
			name:    "nothing asked",
			modules: nil,
			want:    nil,
		},
		{
			name:    "unknown module names itself and the kernel",
			modules: []string{"squashfs", "no_such_mod", "btrfs"},
			wantErr: []string{"no_such_mod, btrfs", "6.1.0-test-amd64"},
		},
		{
			name:    "dependency cycle",
			modules: []string{"loop_a"},
			wantErr: []string{"cycle", "loop_a.ko"},
		},
		{
			name:    "dependency without entry",
			modules: []string{"dangling"},
			wantErr: []string{"kernel/test/missing.ko", "dangling.ko"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Resolve(dir, tc.modules)
			if tc.wantErr != nil {
				if err == nil {
					t.Fatalf("Resolve(%q) = %q, want an error", tc.modules, got)
				}
				for _, s := range tc.wantErr {
					if !strings.Contains(err.Error(), s) {
						t.Errorf("error %q does not mention %q", err, s)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("Resolve(%q): %v", tc.modules, err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Resolve(%q)\n got %q\nwant %q", tc.modules, got, tc.want)
			}
		})
	}
}

func TestResolveMissingModulesDep(t *testing.T) {
	_, err := Resolve(filepath.Join(t.TempDir(), "6.1.0-x"), []string{"squashfs"})
	if err == nil || !strings.Contains(err.Error(), "modules.dep") {
		t.Fatalf("error %v, want one naming modules.dep", err)
	}
}

// TestResolveRealKernel runs against a real root tree named by
// KILN_TEST_ROOTFS (e.g. the extracted base.tar).
func TestResolveRealKernel(t *testing.T) {
	root := os.Getenv("KILN_TEST_ROOTFS")
	if root == "" {
		t.Skip("KILN_TEST_ROOTFS not set")
	}
	deps, _ := filepath.Glob(filepath.Join(root, "usr/lib/modules/*/modules.dep"))
	if len(deps) == 0 {
		t.Fatalf("no usr/lib/modules/*/modules.dep under %s", root)
	}
	dir := filepath.Dir(deps[0])
	got, err := Resolve(dir, []string{"virtio_pci", "virtio_blk", "virtio_scsi", "nvme", "sd_mod",
		"squashfs", "erofs", "ext4", "overlay", "crc32c_generic"})
	if err != nil {
		t.Fatal(err)
	}
	pos := map[string]int{}
	for i, m := range got {
		pos[moduleName(m)] = i
		if _, err := os.Stat(filepath.Join(dir, m)); err != nil {
			t.Errorf("resolved module file: %v", err)
		}
	}
	for _, m := range []string{"virtio_pci", "virtio_blk", "virtio", "virtio_ring", "squashfs", "erofs", "overlay", "sd_mod", "scsi_mod"} {
		if _, ok := pos[m]; !ok {
			t.Errorf("%s missing from %q", m, got)
		}
	}
	for _, before := range [][2]string{{"virtio", "virtio_blk"}, {"virtio_ring", "virtio_pci"}, {"scsi_mod", "sd_mod"}, {"scsi_mod", "virtio_scsi"}} {
		if pos[before[0]] > pos[before[1]] {
			t.Errorf("%s loads after %s: %q", before[0], before[1], got)
		}
	}
	t.Logf("%d module files: %q", len(got), got)
}
