package spec

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// repo makes a repository skeleton (images/, profiles/, overlays/base/) in a
// temporary directory and returns its root.
func repo(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	for _, d := range []string{"images", "profiles", "overlays/base"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func write(t *testing.T, path, content string) string {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

const validBase = "name: qemu\nplatform: qemu\nbase:\n  layout: base/layout\n  tag: bookworm\n"

func TestLoadDefinitionErrors(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		want []string // each line of the error, "F" stands for the file
	}{
		{"malformed yaml", "name: qemu\nplatform: [qemu\n", []string{
			"F:2: invalid YAML: did not find expected ',' or ']'"}},
		{"tab indentation", "name: qemu\nbase:\n\tlayout: x\n", []string{
			"F:3: invalid YAML: found character that cannot start any token"}},
		{"empty", "", []string{"F: the document is empty"}},
		{"not a mapping", "- a\n- b\n", []string{"F:1: expected a mapping at the top level, got a list"}},
		{"two documents", validBase + "---\nname: x\n", []string{"F:6: more than one YAML document; expected one"}},
		{"unknown field", validBase + "disk:\n  sise: 4GiB\n", []string{
			"F:7: disk.sise: unknown field (known: compression, esp_size, rootfs, size)"}},
		{"unknown top-level field", validBase + "format: [raw]\n", []string{
			"F:6: format: unknown field (known: base, disk, formats, iso, kernel, name, overlays, platform, profiles)"}},
		{"duplicate field", validBase + "name: other\n", []string{"F:6: name: set twice (first at line 1)"}},
		{"missing required", "name: qemu\n", []string{"F:1: platform: required", "F:1: base: required"}},
		{"wrong type mapping", validBase + "disk: 4GiB\n", []string{"F:6: disk: expected a mapping, got the string \"4GiB\""}},
		{"wrong type list", validBase + "formats: raw\n", []string{"F:6: formats: expected a list, got the string \"raw\""}},
		{"wrong type string", "name: 12\nplatform: qemu\nbase: {image: debian:bookworm}\n", []string{"F:1: name: expected a string, got the integer 12"}},
		{"bad size", validBase + "disk:\n  size: 4GB2\n", []string{
			"F:7: disk.size: invalid size \"4GB2\": want a whole number of bytes or one with a unit (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB), e.g. 4GiB"}},
		{"size not MiB", validBase + "disk:\n  size: 1000000\n", []string{"F:7: disk.size: 1000000B is not a whole number of MiB"}},
		{"small esp", validBase + "disk:\n  esp_size: 32MiB\n", []string{"F:7: disk.esp_size: 32MiB is too small for a FAT32 ESP (at least 64MiB)"}},
		{"disk smaller than esp", validBase + "disk:\n  size: 128MiB\n", []string{"F:7: disk.size: 128MiB leaves no room after the 256MiB ESP"}},
		{"gce disk not whole GiB", validBase + "disk:\n  size: 4608MiB\nformats: [raw, gce]\n", []string{
			"F:7: disk.size: 4608MiB is not a whole number of GiB, which the gce format needs (GCE images are whole GiB; leave size out to have it rounded up)"}},
		{"bad compression", validBase + "disk:\n  rootfs: erofs\n  compression: zstd\n", []string{
			"F:8: disk.compression: \"zstd\" does not work with erofs (one of: lz4hc, lz4, none)"}},
		{"bad rootfs", validBase + "disk: {rootfs: ext4}\n", []string{"F:6: disk.rootfs: \"ext4\" is not a root filesystem type (squashfs or erofs)"}},
		{"bad name", "name: Qemu_1\nplatform: qemu\nbase: {image: debian:bookworm}\n", []string{
			"F:1: name: \"Qemu_1\": use lower-case letters, digits and '-' (at most 63)"}},
		{"bad platform", "name: q\nplatform: azure\nbase: {image: debian:bookworm}\n", []string{
			"F:2: platform: \"azure\" is not a platform (one of: qemu, aws, gce, metal)"}},
		{"bad format", validBase + "formats:\n  - raw\n  - iso9660\n  - raw\n", []string{
			"F:8: formats[1]: \"iso9660\" is not an output format (one of: raw, qcow2, vmdk, vhd, gce, pxe, iso)",
			"F:9: formats[2]: \"raw\" listed twice"}},
		{"two base sources", "name: q\nplatform: qemu\nbase:\n  layout: x\n  image: debian:bookworm\n", []string{
			"F:5: base.image: give only one of layout, image or tarball (already have layout)"}},
		{"no base source", "name: q\nplatform: qemu\nbase:\n  digest: sha256:" + strings.Repeat("a", 64) + "\n", []string{
			"F:4: base: one of layout, image or tarball is required"}},
		{"bad digest", validBase + "  digest: sha256:abc\n", []string{
			"F:6: base.digest: \"sha256:abc\" is not a digest (sha256: and 64 lower-case hex digits)"}},
		{"digest conflict", "name: q\nplatform: qemu\nbase:\n  image: debian@sha256:" + strings.Repeat("a", 64) + "\n  digest: sha256:" + strings.Repeat("b", 64) + "\n", []string{
			"F:5: base.digest: sha256:" + strings.Repeat("b", 64) + " differs from the digest in image: sha256:" + strings.Repeat("a", 64)}},
		{"tag with image", "name: q\nplatform: qemu\nbase:\n  image: debian\n  tag: bookworm\n", []string{
			"F:5: base.tag: only used with layout (put the tag in image: name:tag)"}},
		{"unset variable", "name: q\nplatform: qemu\nbase:\n  layout: ${KILN_TEST_UNSET}/x\n", []string{
			"F:4: base.layout: environment variable KILN_TEST_UNSET is not set"}},
		{"kernel arg kiln sets", validBase + "kernel:\n  args: [console=ttyS0, root=/dev/sda2, \"a b\"]\n  modules: [virtio_blk.ko]\n", []string{
			"F:7: kernel.args[1]: \"root=/dev/sda2\": kiln sets root= itself",
			"F:7: kernel.args[2]: \"a b\": one argument per list entry, without spaces",
			"F:8: kernel.modules[0]: \"virtio_blk.ko\" is not a module name (like virtio_blk, without .ko)"}},
		{"unquoted comma in flow list", validBase + "kernel: {args: [console=ttyS0,115200]}\n", []string{
			"F:6: kernel.args[1]: expected a string, got the integer 115200 (in a [a, b] list a comma separates entries: quote entries that contain one)"}},
		{"iso without the iso format", validBase + "formats: [raw]\niso: {install: {dev: auto}}\n", []string{
			"F:7: iso: tunes the iso format, which formats does not list (add iso to formats)"}},
		{"iso install fields", validBase + "formats: [iso]\niso:\n  install: {dev: sda, wipe: \"yes\", size: 1}\n  live: {}\n", []string{
			"F:8: iso.install.wipe: the string \"yes\": want true (write over a disk holding data) or false",
			"F:8: iso.install.size: unknown field (known: dev, wipe)",
			"F:9: iso.live: unknown field (known: install)"}},
		{"iso install bad dev", validBase + "formats: [iso]\niso: {install: {dev: /dev/../sda}}\n", []string{
			"F:7: iso.install.dev: \"/dev/../sda\": want auto, /dev/<disk> or a /dev/disk/by-id name (kiln.install.dev=)"}},
		{"missing overlay", validBase + "overlays: [base, nope]\n", []string{
			"F:6: overlays[1]: overlay nope: R/overlays/nope is not a directory"}},
		{"missing profiles dir", validBase + "profiles: ../roles\n", []string{
			"F:6: profiles: R/roles is not a directory"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := repo(t)
			file := write(t, filepath.Join(root, "images", "qemu.yaml"), tt.yaml)
			_, err := LoadDefinition(file)
			if err == nil {
				t.Fatalf("LoadDefinition succeeded, want errors:\n%s", strings.Join(tt.want, "\n"))
			}
			got := strings.TrimPrefix(err.Error(), "image definition: ")
			want := strings.Join(tt.want, "\n")
			want = strings.ReplaceAll(want, "F:", file+":")
			want = strings.ReplaceAll(want, "R/", root+"/")
			if got != want {
				t.Errorf("error:\n got: %s\nwant: %s", got, want)
			}
		})
	}
}

// The repository's own definitions load.
func TestRepositoryDefinitions(t *testing.T) {
	files, err := filepath.Glob("../../images/*.yaml")
	if err != nil || len(files) < 3 {
		t.Fatalf("definitions %v: %v", files, err)
	}
	for _, f := range files {
		def, err := LoadDefinition(f)
		if err != nil {
			t.Errorf("%v", err)
			continue
		}
		if want := strings.TrimSuffix(filepath.Base(f), ".yaml"); def.Name != want {
			t.Errorf("%s: name %q; want %q, which names its lock file %s.lock", f, def.Name, want, want)
		}
	}
}

func TestLoadDefinition(t *testing.T) {
	t.Setenv("KILN_CACHE", "/var/cache/kiln-test")
	root := repo(t)
	file := write(t, filepath.Join(root, "images", "qemu.yaml"), `# comment
name: qemu
platform: qemu
base:
  layout: ${KILN_CACHE}/base/bookworm
  tag: bookworm
disk: {size: 4GiB, rootfs: erofs, esp_size: 256MiB}
formats: [raw, qcow2]
kernel:
  args: ["console=ttyS0,115200", quiet]
  modules: [virtio_blk]
overlays: [base]
`)
	def, err := LoadDefinition(file)
	if err != nil {
		t.Fatal(err)
	}
	want := &Definition{
		File:     file,
		Name:     "qemu",
		Platform: "qemu",
		Base: Base{
			Layout: "/var/cache/kiln-test/base/bookworm",
			Tag:    "bookworm",
			Ref:    "oci:${KILN_CACHE}/base/bookworm:bookworm",
			Pos:    Pos{File: file, Line: 5},
		},
		Disk:        Disk{Size: 4 * gib, RootFS: "erofs", Compression: "lz4hc", ESPSize: 256 * mib},
		Formats:     []string{"raw", "qcow2"},
		Kernel:      Kernel{Args: []string{"console=ttyS0,115200", "quiet"}, Modules: []string{"virtio_blk"}},
		Overlays:    []string{filepath.Join(root, "overlays", "base")},
		ProfilesDir: filepath.Join(root, "profiles"),
		ProfilesPos: Pos{File: file},
	}
	if !reflect.DeepEqual(def, want) {
		t.Errorf("definition:\n got %+v\nwant %+v", def, want)
	}
}

// iso.install makes the ISO an installer; its dev defaults to auto and wipe to false.
func TestISOInstall(t *testing.T) {
	tests := []struct {
		name, yaml string
		want       *ISO
	}{
		{"no iso field", "formats: [iso]\n", nil},
		{"no install", "formats: [iso]\niso: {}\n", &ISO{}},
		{"defaults", "formats: [iso]\niso: {install: {}}\n", &ISO{Install: &ISOInstall{Dev: "auto"}}},
		{"by path, wipe", "formats: [raw, iso]\niso:\n  install: {dev: /dev/nvme0n1, wipe: true}\n", &ISO{Install: &ISOInstall{Dev: "/dev/nvme0n1", Wipe: true}}},
		{"by id", "formats: [iso]\niso:\n  install: {dev: virtio-install-0, wipe: false}\n", &ISO{Install: &ISOInstall{Dev: "virtio-install-0"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := repo(t)
			def, err := LoadDefinition(write(t, filepath.Join(root, "images", "qemu.yaml"), validBase+tt.yaml))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(def.ISO, tt.want) {
				t.Errorf("ISO: got %+v, want %+v", def.ISO, tt.want)
			}
		})
	}
}

func TestBaseSources(t *testing.T) {
	hex := strings.Repeat("c", 64)
	tests := []struct {
		base string
		want Base
	}{
		{"{image: registry.example.com/debian:bookworm}", Base{Image: "registry.example.com/debian:bookworm", Ref: "docker://registry.example.com/debian:bookworm"}},
		{"{image: \"registry.example.com/debian@sha256:" + hex + "\"}", Base{Image: "registry.example.com/debian", Digest: "sha256:" + hex, Ref: "docker://registry.example.com/debian@sha256:" + hex}},
		{"{tarball: /srv/base.tar, digest: \"sha256:" + hex + "\"}", Base{Tarball: "/srv/base.tar", Digest: "sha256:" + hex, Ref: "docker-archive:/srv/base.tar"}},
		{"{layout: ../oci}", Base{Layout: "ROOT/oci", Ref: "oci:../oci"}},
	}
	for _, tt := range tests {
		t.Run(tt.base, func(t *testing.T) {
			root := repo(t)
			file := write(t, filepath.Join(root, "images", "q.yaml"), "name: q\nplatform: aws\nbase: "+tt.base+"\n")
			def, err := LoadDefinition(file)
			if err != nil {
				t.Fatal(err)
			}
			tt.want.Layout = strings.Replace(tt.want.Layout, "ROOT", root, 1)
			tt.want.Pos = Pos{File: file, Line: 3}
			if def.Base != tt.want {
				t.Errorf("base:\n got %+v\nwant %+v", def.Base, tt.want)
			}
			if def.Disk.RootFS != "squashfs" || def.Disk.Compression != "zstd" || def.Disk.ESPSize != 256*mib || !reflect.DeepEqual(def.Formats, []string{"raw"}) {
				t.Errorf("defaults: disk %+v formats %v", def.Disk, def.Formats)
			}
		})
	}
}

func TestParseSize(t *testing.T) {
	tests := []struct {
		in   string
		want Size
		str  string
	}{
		{"4GiB", 4 << 30, "4GiB"},
		{"512MiB", 512 << 20, "512MiB"},
		{"512 MiB", 512 << 20, "512MiB"},
		{"1536MiB", 1536 << 20, "1536MiB"},
		{"1073741824", 1 << 30, "1GiB"},
		{"100MB", 100e6, "100000000B"},
		{"2KiB", 2048, "2KiB"},
		{"7B", 7, "7B"},
		{"0", 0, "0B"},
	}
	for _, tt := range tests {
		got, err := parseSize(tt.in)
		if err != nil || got != tt.want || got.String() != tt.str {
			t.Errorf("ParseSize(%q) = %d (%s), %v; want %d (%s)", tt.in, got, got, err, tt.want, tt.str)
		}
	}
	for _, bad := range []string{"", "4G", "-1MiB", "1.5GiB", "GiB", "99999999999TiB", "4 gib"} {
		if _, err := parseSize(bad); err == nil {
			t.Errorf("ParseSize(%q) succeeded", bad)
		}
	}
}

func TestProposedFiles(t *testing.T) {
	def, err := LoadDefinition("testdata/repo/images/qemu.yaml")
	if err != nil {
		t.Fatal(err)
	}
	p, err := def.Profile("worker")
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Artifacts) != 3 || p.Artifacts[0].Extract.Format != "tar.gz" || p.Artifacts[1].Extract.Dir != "/opt/cni/bin" {
		t.Errorf("worker profile: %+v", p)
	}
}
