package stage1

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kilnproject/kiln/internal/nodeimage"
	"github.com/kilnproject/kiln/internal/testkit"
)

// runTool runs the named host tool, skipping the test when it is missing.
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
	name      string
	make      func(t *testing.T) string
	want      string
	formatted bool   // CheckDataFilesystem accepts it (ext4 or blank)
	refusal   string // else its error names this
}

var probeCases = []probeCase{
	{name: "blank sparse partition", want: FSNone, formatted: true,
		make: func(t *testing.T) string { return testkit.SparseFile(t, 64*mib) }},
	{name: "tiny blank device", want: FSNone, formatted: true,
		make: func(t *testing.T) string { return testkit.SparseFile(t, 4096) }},
	{name: "ext4 from mkfs.ext4", want: FSExt4, formatted: true,
		make: func(t *testing.T) string {
			p := testkit.SparseFile(t, 64*mib)
			runTool(t, "mkfs.ext4", "-q", "-F", "-L", nodeimage.DataLabel, p)
			return p
		}},
	{name: "vfat", want: "vfat", refusal: "holds vfat",
		make: func(t *testing.T) string {
			p := testkit.SparseFile(t, 64*mib)
			runTool(t, "mkfs.vfat", p)
			return p
		}},
	{name: "squashfs", want: "squashfs", refusal: "holds squashfs",
		make: func(t *testing.T) string {
			src := t.TempDir()
			if err := os.WriteFile(filepath.Join(src, "f"), []byte("x"), 0o644); err != nil {
				t.Fatal(err)
			}
			p := filepath.Join(t.TempDir(), "root.sqfs")
			runTool(t, "mksquashfs", src, p, "-quiet", "-no-progress")
			return p
		}},
	{name: "erofs", want: "erofs", refusal: "holds erofs",
		make: func(t *testing.T) string {
			src := t.TempDir()
			if err := os.WriteFile(filepath.Join(src, "f"), []byte("x"), 0o644); err != nil {
				t.Fatal(err)
			}
			p := filepath.Join(t.TempDir(), "root.erofs")
			runTool(t, "mkfs.erofs", "--quiet", p, src)
			return p
		}},
	{name: "xfs signature", want: "xfs", refusal: "holds xfs",
		make: func(t *testing.T) string { return sparseWith(t, 0, "XFSB\x00\x00\x10\x00") }},
	{name: "old GPT", want: "gpt", refusal: "holds gpt",
		make: func(t *testing.T) string { return sparseWith(t, 512, "EFI PART") }},
	{name: "unknown data deep in the first MiB", want: FSUnknown, refusal: "holds unknown",
		make: func(t *testing.T) string { return sparseWith(t, 900<<10, "precious bytes") }},
}

// checkProbe probes the device at p and checks both probes against tt.
func checkProbe(t *testing.T, tt probeCase, p string) {
	got, err := ProbeFilesystem(p)
	if err != nil {
		t.Fatal(err)
	}
	if got != tt.want {
		t.Errorf("ProbeFilesystem = %q, want %q", got, tt.want)
	}
	fs, err := CheckDataFilesystem(p)
	if tt.formatted {
		if err != nil || fs != tt.want {
			t.Errorf("CheckDataFilesystem = %q, %v; want %q, nil", fs, err, tt.want)
		}
		return
	}
	if err == nil || !strings.Contains(err.Error(), tt.refusal) || !strings.Contains(err.Error(), "refusing to format") {
		t.Errorf("CheckDataFilesystem error = %v, want a refusal naming %q", err, tt.refusal)
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
