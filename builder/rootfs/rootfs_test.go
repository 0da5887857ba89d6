package rootfs

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/kilnproject/kiln/internal/testkit"
)

// writeLayout stores an image made of layers in a new OCI layout and returns its source.
func writeLayout(t *testing.T, layers ...v1.Layer) (Source, layout.Path) {
	t.Helper()
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img, err := mutate.AppendLayers(img, layers...)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "layout")
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	d, _ := img.Digest()
	return Source{Layout: dir, Digest: d.String()}, p
}

func TestFlattenHonoursWhiteouts(t *testing.T) {
	src, _ := writeLayout(t,
		testkit.Layer(t, testkit.Entry{Name: "etc/", Dir: true, Mode: 0o755}, testkit.Entry{Name: "etc/gone", Body: "x"},
			testkit.Entry{Name: "etc/keep", Body: "keep"}, testkit.Entry{Name: "opt/", Dir: true, Mode: 0o755},
			testkit.Entry{Name: "opt/old", Body: "old"}, testkit.Entry{Name: "lib", Link: "usr/lib"},
			testkit.Entry{Name: "usr/lib/", Dir: true, Mode: 0o755},
			testkit.Entry{Name: "var/mail/", Dir: true, Mode: 0o2775, GID: 8}),
		testkit.Layer(t, testkit.Entry{Name: "etc/.wh.gone"}, testkit.Entry{Name: "opt/.wh..wh..opq"},
			testkit.Entry{Name: "opt/new", Body: "new"}, testkit.Entry{Name: "lib/extra", Body: "via the lib symlink"}),
	)
	img, err := OpenBase(context.Background(), src)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	tree, err := Flatten(img, dir)
	if err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]string{"etc/keep": "keep", "opt/new": "new", "usr/lib/extra": "via the lib symlink"} {
		if b, err := os.ReadFile(filepath.Join(dir, p)); err != nil || string(b) != want {
			t.Errorf("%s = %q, %v; want %q", p, b, err, want)
		}
	}
	for _, p := range []string{"etc/gone", "opt/old"} {
		if _, err := os.Lstat(filepath.Join(dir, p)); !os.IsNotExist(err) {
			t.Errorf("%s survived its whiteout (%v)", p, err)
		}
	}
	if o := tree.Owners["var/mail"]; o.GID != 8 || o.Mode&os.ModeSetgid == 0 {
		t.Errorf("owner of var/mail = %+v, want gid 8 with setgid", o)
	}
	var pf strings.Builder
	if err := tree.PseudoFile(&pf); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"/var/mail m 2775 0 8\n", "/etc/keep m 0644 0 0\n", "/lib m 0777 0 0\n"} {
		if !strings.Contains(pf.String(), want) {
			t.Errorf("pseudo file lacks %q:\n%s", want, pf.String())
		}
	}
}

func TestOpenBaseAndFlattenVerifyDigests(t *testing.T) {
	layer := testkit.Layer(t, testkit.Entry{Name: "etc/os-release", Body: "ID=test\n"})
	src, _ := writeLayout(t, layer)

	wrong := src
	wrong.Digest = "sha256:" + strings.Repeat("1", 64)
	if _, err := OpenBase(context.Background(), wrong); err == nil || !strings.Contains(err.Error(), "no image with that digest") {
		t.Errorf("OpenBase with a digest not in the layout: %v", err)
	}

	// Corrupt the layer blob on disk: flattening must notice and say which layer.
	ld, _ := layer.Digest()
	blob := filepath.Join(src.Layout, "blobs", ld.Algorithm, ld.Hex)
	var evil bytes.Buffer
	evilLayer := testkit.Layer(t, testkit.Entry{Name: "etc/os-release", Body: "ID=evil\n"})
	rc, _ := evilLayer.Compressed()
	io.Copy(&evil, rc)
	if err := os.WriteFile(blob, evil.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	img, err := OpenBase(context.Background(), src)
	if err != nil {
		t.Fatal(err)
	}
	_, err = Flatten(img, t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "layer digest mismatch") || !strings.Contains(err.Error(), ld.String()) {
		t.Fatalf("Flatten of a tampered layer: %v", err)
	}
}

func TestFlattenRefusesEscapes(t *testing.T) {
	src, _ := writeLayout(t, testkit.Layer(t, testkit.Entry{Name: "../outside", Body: "x"}))
	img, err := OpenBase(context.Background(), src)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Flatten(img, t.TempDir()); err == nil || !strings.Contains(err.Error(), "escapes the root") {
		t.Fatalf("Flatten of ../outside: %v", err)
	}
}

func TestFindKernel(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files []string
		want  string
		err   string
	}{
		{name: "boot", files: []string{"boot/vmlinuz-6.1.0-1", "usr/lib/modules/6.1.0-1/modules.dep"}, want: "6.1.0-1"},
		{name: "usr lib", files: []string{"usr/lib/modules/6.2.0/vmlinuz", "usr/lib/modules/6.2.0/modules.dep"}, want: "6.2.0"},
		{name: "none", files: []string{"etc/os-release"}, err: "base has no kernel"},
		{name: "no modules", files: []string{"boot/vmlinuz-6.1.0-1"}, err: "no matching /usr/lib/modules"},
		{name: "two", files: []string{"boot/vmlinuz-1", "usr/lib/modules/1/modules.dep", "boot/vmlinuz-2", "usr/lib/modules/2/modules.dep"}, err: "2 kernels (1, 2)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for _, f := range tc.files {
				os.MkdirAll(filepath.Join(dir, filepath.Dir(f)), 0o755)
				os.WriteFile(filepath.Join(dir, f), []byte("x"), 0o644)
			}
			k, err := (&Tree{Dir: dir}).FindKernel()
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("FindKernel = %v, %v; want error %q", k, err, tc.err)
				}
				return
			}
			if err != nil || k.Version != tc.want {
				t.Fatalf("FindKernel = %+v, %v; want %s", k, err, tc.want)
			}
		})
	}
}
