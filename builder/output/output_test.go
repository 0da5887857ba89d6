package output

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Each format comes out as what the tools that take it read: qemu-img names the format and the
// disk's size, and GCE's tarball holds one sparse disk.raw of the same size.
func TestConvert(t *testing.T) {
	if _, err := exec.LookPath("qemu-img"); err != nil {
		t.Skip("qemu-img not installed")
	}
	dir := t.TempDir()
	// GCE's disk.raw is whole GiB; the file is sparse.
	const size = GCESizeMultiple
	raw := sparseDisk(t, dir, "disk.raw", size)
	tests := []struct{ format, qemuFormat string }{
		{"qcow2", "qcow2"},
		{"vmdk", "vmdk"},
		{"vhd", "vpc"},
		{"gce", ""},
	}
	for _, tt := range tests {
		t.Run(tt.format, func(t *testing.T) {
			f, err := Lookup(tt.format)
			if err != nil {
				t.Fatal(err)
			}
			dst := filepath.Join(dir, "out"+f.Suffix)
			if err := Convert(context.Background(), raw, tt.format, dst); err != nil {
				t.Fatal(err)
			}
			if got := OfFile(dst); got != tt.format {
				t.Errorf("OfFile(%s) = %q, want %q", dst, got, tt.format)
			}
			if tt.format == "gce" {
				checkGCETar(t, dst, size)
				return
			}
			// A fixed VHD is the raw disk plus a footer: qemu-img must be told to read the footer.
			out, err := exec.Command("qemu-img", "info", "--output=json", "-f", tt.qemuFormat, dst).Output()
			if err != nil {
				t.Fatal(err)
			}
			var info struct {
				Format      string `json:"format"`
				VirtualSize int64  `json:"virtual-size"`
			}
			if err := json.Unmarshal(out, &info); err != nil {
				t.Fatal(err)
			}
			if info.Format != tt.qemuFormat || info.VirtualSize != size {
				t.Errorf("qemu-img info: format %s, size %d; want %s, %d", info.Format, info.VirtualSize, tt.qemuFormat, size)
			}
		})
	}
	leftovers, _ := filepath.Glob(filepath.Join(dir, "*.part"))
	gceDirs, _ := filepath.Glob(filepath.Join(dir, ".gce-*"))
	if len(leftovers)+len(gceDirs) > 0 {
		t.Errorf("left behind: %v %v", leftovers, gceDirs)
	}
}

// sparseDisk writes a sparse file of size bytes starting with "kiln".
func sparseDisk(t *testing.T, dir, name string, size int64) string {
	t.Helper()
	raw := filepath.Join(dir, name)
	if err := os.WriteFile(raw, []byte("kiln"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(raw, size); err != nil {
		t.Fatal(err)
	}
	return raw
}

// checkGCETar checks GCE's image file as its importer reads it: gzip'd, one oldgnu sparse
// entry disk.raw of size bytes.
func checkGCETar(t *testing.T, file string, size int64) {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	// The first header block: oldgnu's magic "ustar  \0" and type 'S', a sparse file.
	var block [512]byte
	if _, err := io.ReadFull(zr, block[:]); err != nil {
		t.Fatal(err)
	}
	if magic := string(block[257:265]); magic != "ustar  \x00" || block[156] != 'S' {
		t.Errorf("tar header: magic %q type %q, want oldgnu (\"ustar  \\0\") sparse ('S')", magic, block[156])
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		t.Fatal(err)
	}
	if err := zr.Reset(f); err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	hdr, err := tr.Next()
	if err != nil {
		t.Fatal(err)
	}
	if hdr.Name != "disk.raw" || hdr.Size != size {
		t.Errorf("tar entry %q of %d bytes, want disk.raw of %d", hdr.Name, hdr.Size, size)
	}
	head := make([]byte, 4)
	if _, err := io.ReadFull(tr, head); err != nil || string(head) != "kiln" {
		t.Errorf("disk.raw starts %q, %v", head, err)
	}
	if _, err := tr.Next(); err != io.EOF {
		t.Errorf("more than disk.raw in the tarball: %v", err)
	}
}

// GCE refuses a disk.raw that is not whole GiB; so does the conversion, leaving nothing behind.
func TestConvertGCERefusesPartialGiB(t *testing.T) {
	dir := t.TempDir()
	raw := sparseDisk(t, dir, "disk.raw", GCESizeMultiple+1<<20)
	dst := filepath.Join(dir, "out.tar.gz")
	err := Convert(context.Background(), raw, "gce", dst)
	if err == nil || !strings.Contains(err.Error(), "not a whole number of GiB") {
		t.Fatalf("Convert = %v, want an error about whole GiB", err)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "*")); len(left) != 1 {
		t.Errorf("left behind: %v", left)
	}
}

// A format nobody knows, raw, pxe or iso (which are not converted), is an error that says so, and no
// file is left where the output would have been.
func TestConvertRefuses(t *testing.T) {
	dir := t.TempDir()
	raw := filepath.Join(dir, "disk.raw")
	os.WriteFile(raw, nil, 0o644)
	for format, want := range map[string]string{
		"vdi": `unknown output format "vdi" (one of: raw, qcow2, vmdk, vhd, gce, pxe, iso)`,
		"raw": "raw is the bake's own output",
		"pxe": "pxe is a directory written by WritePXE",
		"iso": "iso is written by WriteISO",
	} {
		dst := filepath.Join(dir, "out."+format)
		err := Convert(context.Background(), raw, format, dst)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Convert(%s) = %v, want %q", format, err, want)
		}
		if _, err := os.Stat(dst); !os.IsNotExist(err) {
			t.Errorf("%s exists after a refused conversion", dst)
		}
	}
}
