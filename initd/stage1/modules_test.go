package stage1

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kilnproject/kiln/internal/testkit"
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
			got, err := parseModulesLoad(strings.NewReader(tt.in), "modules.load")
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
	for _, name := range []string{"m.ko.xz", "m.ko.zst", "m.ko.gz"} {
		t.Run(name, func(t *testing.T) {
			buf := bytes.NewBuffer(testkit.Compress(t, filepath.Ext(name), img))
			got, err := decompressModule(name, buf)
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

func TestLoadModulesOrderAndReport(t *testing.T) {
	const dir = "/lib/modules/6.1.0-57-amd64/kernel/"
	list := []string{
		dir + "arch/x86/crypto/crc32c-intel.ko",
		dir + "crypto/crc32c_generic.ko",
		dir + "lib/libcrc32c.ko",
		dir + "fs/erofs/erofs.ko",
		dir + "fs/squashfs/squashfs.ko",
	}
	// What the kernel says when erofs's crc32c symbol is missing (libcrc32c failed before it).
	klog := []byte("<6>[    1.100000] virtio_blk virtio1: [vda] 8388608 512-byte logical blocks\n" +
		"<4>[    1.200000] erofs: Unknown symbol crc32c (err -2)\n" +
		"<4>[    1.200001] erofs: Unknown symbol crc32c (err -2)\n" +
		"<6>[    1.300000] squashfs: version 4.0 (2009/01/31) Phillip Lougher\n")
	results := map[string]error{
		list[0]: fmt.Errorf("load: %w", unix.ENODEV),
		list[2]: fmt.Errorf("%w: a symbol or facility it needs is missing", unix.ENOENT),
		list[3]: fmt.Errorf("%w: a symbol or facility it needs is missing", unix.ENOENT),
	}
	var order []string
	var logBuf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logBuf, nil))
	rep := loadModulesWith(context.Background(), log, list, func(p string) (bool, error) {
		order = append(order, p)
		return results[p] == nil, results[p]
	}, func() []byte { return klog })

	if strings.Join(order, "\n") != strings.Join(list, "\n") {
		t.Errorf("loaded in order %q, want the list's %q", order, list)
	}
	if rep.loaded != 2 || len(rep.unused) != 1 || rep.unused[0] != list[0] {
		t.Errorf("report loaded %d, unused %q; want 2 loaded and crc32c-intel unused", rep.loaded, rep.unused)
	}
	if len(rep.failed) != 2 || rep.failed[0].path != list[2] || rep.failed[1].path != list[3] {
		t.Fatalf("failed %v, want libcrc32c then erofs", rep.failed)
	}
	if len(rep.failed[0].kernel) != 0 {
		t.Errorf("libcrc32c kernel lines %q, want none (the kernel logged nothing about it)", rep.failed[0].kernel)
	}
	msg := rep.failed[1].Error()
	for _, want := range []string{"erofs.ko", "no such file or directory", "kernel: erofs: Unknown symbol crc32c (err -2); erofs: Unknown symbol crc32c (err -2)"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q lacks %q", msg, want)
		}
	}
	logged := logBuf.String()
	if n := strings.Count(logged, `msg="module not loaded"`); n != 2 {
		t.Errorf("%d \"module not loaded\" lines, want 2:\n%s", n, logged)
	}
	for _, l := range strings.Split(logged, "\n") {
		switch {
		case strings.Contains(l, "module="+list[2]) && strings.Contains(l, "kernel="):
			t.Errorf("libcrc32c's line quotes kernel lines the kernel did not write: %s", l)
		case strings.Contains(l, "module="+list[3]) && !strings.Contains(l, `kernel="erofs: Unknown symbol crc32c (err -2);`):
			t.Errorf("erofs's line lacks what the kernel said: %s", l)
		}
	}
	if !strings.Contains(logged, `msg="module not used: no device or CPU feature for it on this machine" module=`+list[0]) {
		t.Errorf("no unused line for crc32c-intel:\n%s", logged)
	}
}

func TestKernelLines(t *testing.T) {
	klog := []byte("<4>[    0.5] crc32c_intel: something\n[    1.0] libcrc32c: a\nlibcrc32c: b\n<3>libcrc32c: c\n<4>[ 2.0] libcrc32c_x: d\n")
	tests := []struct {
		module string
		max    int
		want   []string
	}{
		{"libcrc32c", 3, []string{"libcrc32c: a", "libcrc32c: b", "libcrc32c: c"}},
		{"libcrc32c", 2, []string{"libcrc32c: b", "libcrc32c: c"}},
		{"crc32c_intel", 3, []string{"crc32c_intel: something"}},
		{"erofs", 3, nil},
	}
	for _, tc := range tests {
		if got := kernelLines(klog, tc.module, tc.max); strings.Join(got, "|") != strings.Join(tc.want, "|") {
			t.Errorf("kernelLines(%s, %d) = %q, want %q", tc.module, tc.max, got, tc.want)
		}
	}
}

func TestModuleName(t *testing.T) {
	for in, want := range map[string]string{
		"/lib/modules/6.1.0/kernel/arch/x86/crypto/crc32c-intel.ko": "crc32c_intel",
		"/lib/modules/6.1.0/kernel/fs/erofs/erofs.ko.xz":            "erofs",
		"/lib/modules/6.1.0/kernel/lib/crc-t10dif.ko.zst":           "crc_t10dif",
	} {
		if got := moduleName(in); got != want {
			t.Errorf("ModuleName(%q) = %q, want %q", in, got, want)
		}
	}
}
