package stage1

import (
	"bytes"
	"compress/gzip"
	"io"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"
	"github.com/ulikunitz/xz"
)

func TestParseModulesLoad(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    []string
		wantErr string
	}{
		{
			name: "order kept, comments and blanks skipped",
			in: "# deps first\n/lib/modules/6.1.0/kernel/drivers/virtio/virtio.ko\n\n" +
				"  /lib/modules/6.1.0/kernel/drivers/block/virtio_blk.ko.xz  \n/lib/modules/6.1.0/kernel/fs/erofs/erofs.ko.zst\n",
			want: []string{
				"/lib/modules/6.1.0/kernel/drivers/virtio/virtio.ko",
				"/lib/modules/6.1.0/kernel/drivers/block/virtio_blk.ko.xz",
				"/lib/modules/6.1.0/kernel/fs/erofs/erofs.ko.zst",
			},
		},
		{name: "empty", in: "\n# nothing\n", want: nil},
		{name: "relative path", in: "/lib/modules/a.ko\nkernel/fs/overlay.ko\n", wantErr: "modules.load:2: module path \"kernel/fs/overlay.ko\" is not absolute"},
		{name: "not a module", in: "/lib/modules/6.1.0/modules.dep\n", wantErr: "modules.load:1: module path \"/lib/modules/6.1.0/modules.dep\" does not end in .ko"},
		{name: "module name instead of path", in: "overlay\n", wantErr: "modules.load:1:"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseModulesLoad(strings.NewReader(tt.in), "modules.load")
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error = %v, want it to contain %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if strings.Join(got, "\n") != strings.Join(tt.want, "\n") {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

func TestDecompressModule(t *testing.T) {
	// An ELF-looking payload; only the bytes matter.
	img := bytes.Repeat([]byte("\x7fELF module body "), 5000)
	compress := map[string]func(w io.Writer) (io.WriteCloser, error){
		"m.ko.xz":  func(w io.Writer) (io.WriteCloser, error) { return xz.NewWriter(w) },
		"m.ko.zst": func(w io.Writer) (io.WriteCloser, error) { return zstd.NewWriter(w) },
		"m.ko.gz":  func(w io.Writer) (io.WriteCloser, error) { return gzip.NewWriter(w), nil },
	}
	for name, mk := range compress {
		t.Run(name, func(t *testing.T) {
			var buf bytes.Buffer
			w, err := mk(&buf)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := w.Write(img); err != nil {
				t.Fatal(err)
			}
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
			got, err := decompressModule(name, &buf)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, img) {
				t.Errorf("decompressed %d bytes, want the original %d", len(got), len(img))
			}
		})
	}
	t.Run("corrupt xz", func(t *testing.T) {
		if _, err := decompressModule("m.ko.xz", strings.NewReader("not xz")); err == nil {
			t.Error("no error for corrupt xz")
		}
	})
}
