package initramfs

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/kilnproject/kiln/internal/testkit"
)

// elfModule returns a minimal ELF64 relocatable object, like a kernel module,
// whose .modinfo section holds the given "key=value" entries.
func elfModule(modinfo ...string) []byte {
	var info []byte
	for _, e := range modinfo {
		info = append(append(info, e...), 0)
	}
	shstr := []byte("\x00.modinfo\x00.shstrtab\x00")
	const ehsize, shsize = 64, 64
	infoOff := uint64(ehsize)
	strOff := infoOff + uint64(len(info))
	shOff := (strOff + uint64(len(shstr)) + 7) &^ 7
	var b bytes.Buffer
	h := elf.Header64{Type: uint16(elf.ET_REL), Machine: uint16(elf.EM_X86_64), Version: uint32(elf.EV_CURRENT),
		Shoff: shOff, Ehsize: ehsize, Shentsize: shsize, Shnum: 3, Shstrndx: 2}
	copy(h.Ident[:], elf.ELFMAG)
	h.Ident[elf.EI_CLASS], h.Ident[elf.EI_DATA], h.Ident[elf.EI_VERSION] = byte(elf.ELFCLASS64), byte(elf.ELFDATA2LSB), byte(elf.EV_CURRENT)
	binary.Write(&b, binary.LittleEndian, h)
	b.Write(info)
	b.Write(shstr)
	b.Write(make([]byte, shOff-uint64(b.Len())))
	for _, s := range []elf.Section64{
		{},
		{Name: 1, Type: uint32(elf.SHT_PROGBITS), Flags: uint64(elf.SHF_ALLOC), Off: infoOff, Size: uint64(len(info)), Addralign: 1},
		{Name: 10, Type: uint32(elf.SHT_STRTAB), Off: strOff, Size: uint64(len(shstr)), Addralign: 1},
	} {
		binary.Write(&b, binary.LittleEndian, s)
	}
	return b.Bytes()
}

// fakeModulesDir lays out a kernel module directory like depmod leaves it,
// every module file a small ELF object.
func fakeModulesDir(t testing.TB, root, kver string) string {
	t.Helper()
	dir := filepath.Join(root, "usr/lib/modules", kver)
	dep := strings.Join([]string{
		"kernel/drivers/virtio/virtio.ko: kernel/drivers/virtio/virtio_ring.ko",
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
		"kernel/test/soft_a.ko:",
		"kernel/test/soft_b.ko:",
		"",
	}, "\n")
	builtin := "kernel/fs/ext4/ext4.ko\nkernel/drivers/nvme/host/nvme.ko\nkernel/crypto/crc32c_generic.ko\n"
	write(t, filepath.Join(dir, "modules.dep"), dep)
	write(t, filepath.Join(dir, "modules.builtin"), builtin)
	write(t, filepath.Join(dir, "modules.softdep"), "softdep libcrc32c pre: crc32c\nsoftdep soft_a pre: soft_b\nsoftdep soft_b pre: soft_a\n")
	write(t, filepath.Join(dir, "modules.alias"), "alias crc32c crc32c_intel\nalias crc32c crc32c_generic\n")
	for _, line := range strings.Split(dep, "\n") {
		if mod, _, ok := strings.Cut(line, ":"); ok {
			data := elfModule("name=" + moduleName(mod))
			if strings.HasSuffix(mod, ".xz") {
				data = testkit.Compress(t, ".xz", data)
			}
			write(t, filepath.Join(dir, mod), string(data))
		}
	}
	return dir
}

func write(t testing.TB, name, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(name, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// realTree lays out a root tree holding the module tables of a Debian kernel
// (testdata/modules/<kver>: excerpts of what depmod wrote for it, see
// testdata/modules/README), with /lib a symlink to usr/lib as on Debian, and
// each module file in modules.dep a small ELF object.
func realTree(t *testing.T, kver string) string {
	t.Helper()
	root := t.TempDir()
	src := filepath.Join("testdata", "modules", kver)
	dir := filepath.Join(root, "usr/lib/modules", kver)
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		write(t, filepath.Join(dir, e.Name()), string(data))
	}
	dep, err := os.ReadFile(filepath.Join(dir, "modules.dep"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(dep), "\n") {
		if mod, _, ok := strings.Cut(line, ":"); ok {
			write(t, filepath.Join(dir, mod), string(elfModule("name="+moduleName(mod))))
		}
	}
	if err := os.Symlink("usr/lib", filepath.Join(root, "lib")); err != nil {
		t.Fatal(err)
	}
	return root
}

// The initramfs modules of the default definition, resolved against the
// tables of Debian's generic and cloud kernels, load in exactly the order
// modprobe loads them (the golden files are modprobe --show-depends of the
// same names on the kernels' full tables, each file once).
func TestResolveGolden(t *testing.T) {
	names := []string{"virtio_pci", "virtio_blk", "virtio_scsi", "sd_mod", "nvme", "squashfs", "erofs", "ext4", "overlay", "crc32c"}
	for _, kver := range []string{"6.1.0-57-amd64", "6.1.0-57-cloud-amd64"} {
		t.Run(kver, func(t *testing.T) {
			got, err := resolveModules(realTree(t, kver), kver, names)
			if err != nil {
				t.Fatal(err)
			}
			golden, err := os.ReadFile(filepath.Join("testdata", "modules", kver+".golden"))
			if err != nil {
				t.Fatal(err)
			}
			want := strings.Fields(string(golden))
			if !reflect.DeepEqual(got, want) {
				t.Errorf("Resolve(%q)\n got %s\nwant %s", names, strings.Join(got, "\n     "), strings.Join(want, "\n     "))
			}
		})
	}
}

// The kernels whose real module tables TestResolveRealTables reads.
const debianKver, debianCloudKver = "6.1.0-57-amd64", "6.1.0-57-cloud-amd64"

// realTablesCase is what Resolve must make of modules named against a real kernel's tables.
type realTablesCase struct {
	name    string
	kver    string
	modules []string
	want    []string
}

var realTablesCases = []realTablesCase{
	{
		name:    "softdep pre: libcrc32c needs the crc32c algorithm first",
		kver:    debianKver,
		modules: []string{"libcrc32c"},
		want:    []string{"kernel/arch/x86/crypto/crc32c-intel.ko", "kernel/crypto/crc32c_generic.ko", "kernel/lib/libcrc32c.ko"},
	},
	{
		name:    "softdep of a hard dependency: erofs",
		kver:    debianKver,
		modules: []string{"erofs"},
		want:    []string{"kernel/arch/x86/crypto/crc32c-intel.ko", "kernel/crypto/crc32c_generic.ko", "kernel/lib/libcrc32c.ko", "kernel/fs/erofs/erofs.ko"},
	},
	{
		name:    "an alias names every module that provides it",
		kver:    debianKver,
		modules: []string{"crc32c"},
		want:    []string{"kernel/arch/x86/crypto/crc32c-intel.ko", "kernel/crypto/crc32c_generic.ko"},
	},
	{
		name:    "alias with '-' and '_' equivalent",
		kver:    debianKver,
		modules: []string{"crypto_crc32c"},
		want:    []string{"kernel/arch/x86/crypto/crc32c-intel.ko", "kernel/crypto/crc32c_generic.ko"},
	},
	{
		name:    "wildcard alias",
		kver:    debianKver,
		modules: []string{"virtio:d00000002v00001AF4"},
		want:    []string{"kernel/drivers/virtio/virtio_ring.ko", "kernel/drivers/virtio/virtio.ko", "kernel/drivers/block/virtio_blk.ko"},
	},
	{
		name:    "hard dependencies, last listed first",
		kver:    debianKver,
		modules: []string{"virtio_pci"},
		want: []string{"kernel/drivers/virtio/virtio_ring.ko", "kernel/drivers/virtio/virtio.ko",
			"kernel/drivers/virtio/virtio_pci_modern_dev.ko", "kernel/drivers/virtio/virtio_pci_legacy_dev.ko", "kernel/drivers/virtio/virtio_pci.ko"},
	},
	{
		name:    "softdep pre after the module's hard dependencies, with its own",
		kver:    debianKver,
		modules: []string{"r8169"},
		want: []string{"kernel/drivers/net/phy/libphy.ko", "kernel/drivers/net/phy/mdio_devres.ko",
			"kernel/drivers/net/phy/realtek.ko", "kernel/drivers/net/ethernet/realtek/r8169.ko"},
	},
	{
		name:    "softdep post after the module",
		kver:    debianKver,
		modules: []string{"ipmi_msghandler"},
		want:    []string{"kernel/drivers/char/ipmi/ipmi_msghandler.ko", "kernel/drivers/char/ipmi/ipmi_devintf.ko"},
	},
	{
		name:    "ext4's softdep on crc32c comes before it",
		kver:    debianKver,
		modules: []string{"ext4"},
		want: []string{"kernel/arch/x86/crypto/crc32c-intel.ko", "kernel/crypto/crc32c_generic.ko",
			"kernel/fs/jbd2/jbd2.ko", "kernel/fs/mbcache.ko", "kernel/lib/crc16.ko", "kernel/fs/ext4/ext4.ko"},
	},
	{
		name:    "an alias matching a module skips the built-in one",
		kver:    debianCloudKver,
		modules: []string{"libcrc32c"},
		want:    []string{"kernel/arch/x86/crypto/crc32c-intel.ko", "kernel/lib/libcrc32c.ko"},
	},
	{
		name:    "built-in modules and their aliases need no file",
		kver:    debianCloudKver,
		modules: []string{"crc32c_generic", "crct10dif", "ext4", "nvme"},
		want:    nil,
	},
}

func TestResolveRealTables(t *testing.T) {
	trees := map[string]string{}
	for _, kver := range []string{debianKver, debianCloudKver} {
		trees[kver] = realTree(t, kver)
	}
	for _, tc := range realTablesCases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := resolveModules(trees[tc.kver], tc.kver, tc.modules)
			if err != nil {
				t.Fatalf("Resolve(%q): %v", tc.modules, err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Resolve(%q)\n got %q\nwant %q", tc.modules, got, tc.want)
			}
		})
	}
}

// resolveCase is modules named against the fake tree of fakeModulesDir, and what Resolve makes of them.
type resolveCase struct {
	name    string
	modules []string
	want    []string
	wantErr []string // substrings of the error
}

var resolveCases = []resolveCase{
	{
		name:    "no dependencies",
		modules: []string{"squashfs"},
		want:    []string{"kernel/fs/squashfs/squashfs.ko"},
	},
	{
		name:    "dependencies first, each once",
		modules: []string{"virtio_pci", "virtio_blk"},
		want: []string{
			"kernel/drivers/virtio/virtio_ring.ko",
			"kernel/drivers/virtio/virtio.ko",
			"kernel/drivers/virtio/virtio_pci_modern_dev.ko",
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
			"kernel/drivers/virtio/virtio_ring.ko",
			"kernel/drivers/virtio/virtio.ko",
			"kernel/drivers/block/virtio_blk.ko",
		},
	},
	{
		name:    "compressed module file, soft dependency through an alias",
		modules: []string{"erofs"},
		want:    []string{"kernel/arch/x86/crypto/crc32c-intel.ko", "kernel/lib/libcrc32c.ko", "kernel/fs/erofs/erofs.ko.xz"},
	},
	{
		name:    "built-in modules are skipped",
		modules: []string{"ext4", "nvme", "crc32c-generic", "squashfs"},
		want:    []string{"kernel/fs/squashfs/squashfs.ko"},
	},
	{
		name:    "a loop of soft dependencies stops where it started",
		modules: []string{"soft_a"},
		want:    []string{"kernel/test/soft_b.ko", "kernel/test/soft_a.ko"},
	},
	{
		name:    "nothing asked",
		modules: nil,
		want:    nil,
	},
	{
		name:    "unknown module names itself and the kernel",
		modules: []string{"squashfs", "no_such_mod", "btrfs"},
		wantErr: []string{"no_such_mod, btrfs", modulesKver},
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

func TestResolve(t *testing.T) {
	root := t.TempDir()
	fakeModulesDir(t, root, modulesKver)
	for _, tc := range resolveCases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := resolveModules(root, modulesKver, tc.modules)
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

// Everything is read inside the root tree: module paths in modules.dep that
// leave the module directory are errors naming them, and so are symlinks that
// lead out of the tree; the build host's files are never read.
func TestResolveStaysInTree(t *testing.T) {
	const kver = "6.1.0-test-amd64"
	host := t.TempDir() // files outside the tree that a careless reader would reach
	write(t, filepath.Join(host, "modules", "modules.dep"), "kernel/x.ko:\n")
	write(t, filepath.Join(host, "modules", "kernel/x.ko"), string(elfModule("name=x")))
	write(t, filepath.Join(host, "evil.ko"), string(elfModule("name=evil")))

	tests := []struct {
		name    string
		setup   func(t *testing.T, dir string) // dir: the tree's usr/lib/modules/<kver>
		modules []string
		wantErr []string
	}{
		{
			name: "dotdot in a module path",
			setup: func(t *testing.T, dir string) {
				write(t, filepath.Join(dir, "modules.dep"), "kernel/a.ko:\n../../../../../evil.ko:\n")
			},
			modules: []string{"evil"},
			wantErr: []string{"modules.dep:2", `"../../../../../evil.ko"`},
		},
		{
			name: "dotdot in a dependency",
			setup: func(t *testing.T, dir string) {
				write(t, filepath.Join(dir, "modules.dep"), "kernel/a.ko: kernel/../../b.ko\n")
			},
			modules: []string{"a"},
			wantErr: []string{"modules.dep:1", `"kernel/../../b.ko"`},
		},
		{
			name:    "absolute module path",
			setup:   func(t *testing.T, dir string) { write(t, filepath.Join(dir, "modules.dep"), host+"/evil.ko:\n") },
			modules: []string{"evil"},
			wantErr: []string{"modules.dep:1", host + "/evil.ko"},
		},
		{
			name: "module file symlinked outside the tree",
			setup: func(t *testing.T, dir string) {
				write(t, filepath.Join(dir, "modules.dep"), "kernel/evil.ko:\n")
				os.MkdirAll(filepath.Join(dir, "kernel"), 0o755)
				if err := os.Symlink(filepath.Join(host, "evil.ko"), filepath.Join(dir, "kernel/evil.ko")); err != nil {
					t.Fatal(err)
				}
			},
			modules: []string{"evil"},
			wantErr: []string{"kernel/evil.ko", "refused"},
		},
		{
			name: "module directory symlinked outside the tree",
			setup: func(t *testing.T, dir string) {
				os.MkdirAll(filepath.Dir(dir), 0o755)
				if err := os.Symlink(filepath.Join(host, "modules"), dir); err != nil {
					t.Fatal(err)
				}
			},
			modules: []string{"x"},
			wantErr: []string{kver + "/modules.dep", "refused"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			tc.setup(t, filepath.Join(root, "usr/lib/modules", kver))
			got, err := resolveModules(root, kver, tc.modules)
			if err == nil {
				t.Fatalf("Resolve = %q, want an error", got)
			}
			for _, s := range tc.wantErr {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not mention %q", err, s)
				}
			}
		})
	}
}

// A module's own .modinfo softdep counts even without modules.softdep, in
// every compression a distribution ships modules in. libcrc32c.ko is the
// module from Debian's 6.1.0-57-amd64 kernel (softdep=pre: crc32c).
func TestResolveModinfoSoftdep(t *testing.T) {
	real, err := os.ReadFile(filepath.Join("testdata", "modules", "libcrc32c.ko"))
	if err != nil {
		t.Fatal(err)
	}
	info, err := parseModinfo(real)
	if err != nil {
		t.Fatal(err)
	}
	if got := info["softdep"]; !reflect.DeepEqual(got, []string{"pre: crc32c"}) {
		t.Fatalf("libcrc32c.ko softdep = %q, want [\"pre: crc32c\"]", got)
	}
	const kver = "6.1.0-test-amd64"
	for _, suffix := range []string{"", ".xz", ".zst", ".gz"} {
		t.Run("ko"+suffix, func(t *testing.T) {
			root := t.TempDir()
			dir := filepath.Join(root, "usr/lib/modules", kver)
			lib := "kernel/lib/libcrc32c.ko" + suffix
			write(t, filepath.Join(dir, "modules.dep"), "kernel/crypto/crc32c_generic.ko:\n"+lib+":\nkernel/fs/ocfs2/post.ko:\nkernel/fs/ocfs2/main.ko:\n")
			write(t, filepath.Join(dir, "modules.alias"), "alias crc32c crc32c_generic\n")
			data := real
			if suffix != "" {
				data = testkit.Compress(t, suffix, real)
			}
			write(t, filepath.Join(dir, lib), string(data))
			write(t, filepath.Join(dir, "kernel/crypto/crc32c_generic.ko"), string(elfModule("name=crc32c_generic")))
			write(t, filepath.Join(dir, "kernel/fs/ocfs2/post.ko"), string(elfModule("name=post")))
			write(t, filepath.Join(dir, "kernel/fs/ocfs2/main.ko"), string(elfModule("name=main", "softdep=pre: libcrc32c post: post")))
			got, err := resolveModules(root, kver, []string{"main"})
			if err != nil {
				t.Fatal(err)
			}
			want := []string{"kernel/crypto/crc32c_generic.ko", lib, "kernel/fs/ocfs2/main.ko", "kernel/fs/ocfs2/post.ko"}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("Resolve(main)\n got %q\nwant %q", got, want)
			}
		})
	}
	t.Run("not an ELF file", func(t *testing.T) {
		root := t.TempDir()
		dir := filepath.Join(root, "usr/lib/modules", kver)
		write(t, filepath.Join(dir, "modules.dep"), "kernel/lib/broken.ko:\n")
		write(t, filepath.Join(dir, "kernel/lib/broken.ko"), "not a module")
		_, err := resolveModules(root, kver, []string{"broken"})
		if err == nil || !strings.Contains(err.Error(), "kernel/lib/broken.ko") || !strings.Contains(err.Error(), "not an ELF module") {
			t.Fatalf("error %v, want one naming kernel/lib/broken.ko as not an ELF module", err)
		}
	})
}

func TestParseSoftdep(t *testing.T) {
	tests := []struct {
		in        string
		pre, post []string
	}{
		{"pre: crc32c", []string{"crc32c"}, nil},
		{"post: ipmi_devintf", nil, []string{"ipmi_devintf"}},
		{"pre: a b post: c pre: d", []string{"a", "b", "d"}, []string{"c"}},
		{"gcm", nil, nil}, // a name before pre:/post: (cifs has these) is ignored, as by modprobe
		{"", nil, nil},
	}
	for _, tc := range tests {
		got := parseSoftdep(strings.Fields(tc.in))
		if !reflect.DeepEqual(got.pre, tc.pre) || !reflect.DeepEqual(got.post, tc.post) {
			t.Errorf("parseSoftdep(%q) = pre %q post %q, want pre %q post %q", tc.in, got.pre, got.post, tc.pre, tc.post)
		}
	}
}

func TestResolveMissingModulesDep(t *testing.T) {
	_, err := resolveModules(t.TempDir(), "6.1.0-x", []string{"squashfs"})
	if err == nil || !strings.Contains(err.Error(), "modules.dep") || !strings.Contains(err.Error(), "6.1.0-x") {
		t.Fatalf("error %v, want one naming modules.dep and the kernel", err)
	}
}

// TestResolveRealKernel runs against a real root tree named by
// KILN_TEST_ROOTFS (e.g. the extracted base.tar).
func TestResolveRealKernel(t *testing.T) {
	root, kver := testkit.RootFS(t)
	got, err := resolveModules(root, kver, []string{"virtio_pci", "virtio_blk", "virtio_scsi", "nvme", "sd_mod",
		"squashfs", "erofs", "ext4", "overlay", "crc32c"})
	if err != nil {
		t.Fatal(err)
	}
	pos := map[string]int{}
	for i, m := range got {
		pos[moduleName(m)] = i
		if _, err := os.Stat(filepath.Join(root, "usr/lib/modules", kver, m)); err != nil {
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
