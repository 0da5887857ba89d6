package blockdev

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/kilnproject/kiln/internal/nodeimage"
	"github.com/kilnproject/kiln/internal/testkit"
)

// runTool runs the named host tool, skipping the test when it is missing.
const mib = int64(1 << 20)

func runTool(t *testing.T, name string, args ...string) {
	testkit.Run(t, testkit.Tool(t, name, ""), args...)
}

// writeAt writes b into the file at p at offset off.
func writeAt(t *testing.T, p string, off int64, b string) {
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt([]byte(b), off); err != nil {
		t.Fatal(err)
	}
}

// sparseWith returns a 64 MiB sparse file with b written at offset off.
func sparseWith(t *testing.T, off int64, b string) string {
	p := testkit.SparseFile(t, 64*mib)
	writeAt(t, p, off, b)
	return p
}

// probeCase is one device image and what the probes say about it.
type probeCase struct {
	name string
	make func(t *testing.T) string
	want string
}

var probeCases = []probeCase{
	{name: "blank sparse partition", want: FSNone,
		make: func(t *testing.T) string { return testkit.SparseFile(t, 64*mib) }},
	{name: "tiny blank device", want: FSNone,
		make: func(t *testing.T) string { return testkit.SparseFile(t, 4096) }},
	{name: "ext4 from mkfs.ext4", want: FSExt4,
		make: func(t *testing.T) string {
			p := testkit.SparseFile(t, 64*mib)
			runTool(t, "mkfs.ext4", "-q", "-F", "-L", nodeimage.DataLabel, p)
			return p
		}},
	{name: "vfat", want: "vfat",
		make: func(t *testing.T) string {
			p := testkit.SparseFile(t, 64*mib)
			runTool(t, "mkfs.vfat", p)
			return p
		}},
	{name: "squashfs", want: "squashfs",
		make: func(t *testing.T) string {
			src := t.TempDir()
			if err := os.WriteFile(filepath.Join(src, "f"), []byte("x"), 0o644); err != nil {
				t.Fatal(err)
			}
			p := filepath.Join(t.TempDir(), "root.sqfs")
			runTool(t, "mksquashfs", src, p, "-quiet", "-no-progress")
			return p
		}},
	{name: "erofs", want: "erofs",
		make: func(t *testing.T) string {
			src := t.TempDir()
			if err := os.WriteFile(filepath.Join(src, "f"), []byte("x"), 0o644); err != nil {
				t.Fatal(err)
			}
			p := filepath.Join(t.TempDir(), "root.erofs")
			runTool(t, "mkfs.erofs", "--quiet", p, src)
			return p
		}},
	{name: "xfs signature", want: "xfs",
		make: func(t *testing.T) string { return sparseWith(t, 0, "XFSB\x00\x00\x10\x00") }},
	{name: "old GPT", want: "gpt",
		make: func(t *testing.T) string { return sparseWith(t, 512, "EFI PART") }},
	{name: "unknown data deep in the first MiB", want: fsUnknown,
		make: func(t *testing.T) string { return sparseWith(t, 900<<10, "precious bytes") }},
}

// checkProbe probes the device at p and checks the result against tt.
func checkProbe(t *testing.T, tt probeCase, p string) {
	got, err := ProbeFilesystem(p)
	if err != nil {
		t.Fatal(err)
	}
	if got != tt.want {
		t.Errorf("ProbeFilesystem = %q, want %q", got, tt.want)
	}
}

func TestProbeFilesystem(t *testing.T) {
	for _, tt := range probeCases {
		t.Run(tt.name, func(t *testing.T) {
			checkProbe(t, tt, tt.make(t))
		})
	}
	t.Run("missing device", func(t *testing.T) {
		if _, err := ProbeFilesystem(filepath.Join(t.TempDir(), "nope")); err == nil {
			t.Error("no error for a missing device")
		}
	})
}

// TestProbeDisk: every kind of data a whole disk can hold, at its head or its end, is named;
// only a disk holding none of it is empty.
func TestProbeDisk(t *testing.T) {
	const size = 64 * mib
	le := func(v uint32) string { return string([]byte{byte(v), byte(v >> 8), byte(v >> 16), byte(v >> 24)}) }
	tests := []struct {
		name string
		make func(t *testing.T) string
		want []string
	}{
		{name: "blank", want: nil, make: func(t *testing.T) string { return testkit.SparseFile(t, size) }},
		{name: "GPT from sgdisk", want: []string{"gpt", "gpt (backup header at the end)"},
			make: func(t *testing.T) string {
				p := testkit.SparseFile(t, size)
				runTool(t, "sgdisk", "-n", "1:0:+8M", p)
				return p
			}},
		{name: "only the backup GPT left", want: []string{"gpt (backup header at the end)"},
			make: func(t *testing.T) string {
				p := testkit.SparseFile(t, size)
				runTool(t, "sgdisk", "-n", "1:0:+8M", p)
				writeAt(t, p, 0, string(make([]byte, mib)))
				return p
			}},
		{name: "ext4 on the whole disk", want: []string{FSExt4},
			make: func(t *testing.T) string {
				p := testkit.SparseFile(t, size)
				runTool(t, "mkfs.ext4", "-q", "-F", p)
				return p
			}},
		{name: "RAID 1.2 superblock", want: []string{"linux_raid_member"},
			make: func(t *testing.T) string { return sparseWith(t, 4096, le(mdMagic)) }},
		{name: "RAID 1.0 superblock at the end", want: []string{"linux_raid_member (superblock at the end)"},
			make: func(t *testing.T) string { return sparseWith(t, size-8192, le(mdMagic)) }},
		{name: "RAID 0.90 superblock at the end", want: []string{"linux_raid_member (superblock at the end)"},
			make: func(t *testing.T) string { return sparseWith(t, size-65536, le(mdMagic)) }},
		{name: "LVM physical volume", want: []string{"LVM2_member"},
			make: func(t *testing.T) string {
				return sparseWith(t, 512, "LABELONE\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x20\x00\x00\x00LVM2 001")
			}},
		{name: "LUKS", want: []string{"crypto_LUKS"},
			make: func(t *testing.T) string { return sparseWith(t, 0, "LUKS\xba\xbe\x00\x02") }},
		{name: "unknown bytes", want: []string{fsUnknown},
			make: func(t *testing.T) string { return sparseWith(t, 700<<10, "left-over") }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ProbeDisk(tt.make(t))
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("ProbeDisk = %q, want %q", got, tt.want)
			}
		})
	}
}
