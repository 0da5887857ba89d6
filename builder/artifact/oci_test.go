package artifact

import (
	"context"
	"io"
	"log"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/kilnproject/kiln/builder/spec"
)

func randomImage(t *testing.T) v1.Image {
	t.Helper()
	img, err := random.Image(512, 1)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func digestOf(t *testing.T, d interface{ Digest() (v1.Hash, error) }) string {
	t.Helper()
	h, err := d.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return h.String()
}

// multiPlatform returns an index of an amd64 and an arm64 image.
func multiPlatform(t *testing.T) (v1.ImageIndex, v1.Image) {
	amd, arm := randomImage(t), randomImage(t)
	idx := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: arm, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm64"}}},
		mutate.IndexAddendum{Add: amd, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}}},
	)
	return idx, amd
}

func TestResolveRemote(t *testing.T) {
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")

	img := randomImage(t)
	single, _ := name.ParseReference(host + "/debian:bookworm")
	if err := remote.Write(single, img); err != nil {
		t.Fatal(err)
	}
	idx, amd := multiPlatform(t)
	multi, _ := name.ParseReference(host + "/debian:trixie")
	if err := remote.WriteIndex(multi, idx); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		image   string
		want    string
		wantErr string
	}{
		{host + "/debian:bookworm", digestOf(t, img), ""},
		{host + "/debian:trixie", digestOf(t, amd), ""},
		{host + "/debian:sid", "", "404 Not Found"},
	}
	for _, tt := range tests {
		t.Run(tt.image, func(t *testing.T) {
			got, err := OCIResolver{}.ResolveBase(context.Background(), spec.Base{Image: tt.image, Ref: "docker://" + tt.image})
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !strings.HasPrefix(err.Error(), "docker://"+tt.image+": ") {
					t.Errorf("error %v, want one naming the image and %s", err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Errorf("ResolveBase = %s, %v; want %s", got, err, tt.want)
			}
		})
	}
}

func TestResolveLayout(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "oci")
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	bookworm, trixie := randomImage(t), randomImage(t)
	idx, amd := multiPlatform(t)
	if err := p.AppendImage(bookworm, layout.WithAnnotations(map[string]string{RefNameAnnotation: "bookworm"})); err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(trixie, layout.WithAnnotations(map[string]string{RefNameAnnotation: "example.com/debian:trixie"})); err != nil {
		t.Fatal(err)
	}
	if err := p.AppendIndex(idx, layout.WithAnnotations(map[string]string{RefNameAnnotation: "multi"})); err != nil {
		t.Fatal(err)
	}
	only := filepath.Join(t.TempDir(), "only")
	p2, _ := layout.Write(only, empty.Index)
	p2.AppendImage(bookworm)

	tests := []struct {
		layout, tag string
		want        string
		wantErr     string
	}{
		{dir, "bookworm", digestOf(t, bookworm), ""},
		{dir, "trixie", digestOf(t, trixie), ""},
		{dir, "multi", digestOf(t, amd), ""},
		{only, "", digestOf(t, bookworm), ""},
		{dir, "sid", "", `oci:L:sid: no image tagged "sid" in the layout L (tags: bookworm, example.com/debian:trixie, multi)`},
		{dir, "", "", "oci:L: the layout L holds 3 images; choose one with tag: (tags: bookworm, example.com/debian:trixie, multi)"},
		{filepath.Join(dir, "missing"), "x", "", "oci:L:x: open OCI layout L: "},
	}
	for _, tt := range tests {
		t.Run(tt.tag, func(t *testing.T) {
			ref := "oci:" + tt.layout
			if tt.tag != "" {
				ref += ":" + tt.tag
			}
			got, err := OCIResolver{}.ResolveBase(context.Background(), spec.Base{Layout: tt.layout, Tag: tt.tag, Ref: ref})
			if tt.wantErr != "" {
				want := strings.ReplaceAll(tt.wantErr, "L", tt.layout)
				if err == nil || !strings.HasPrefix(err.Error(), want) {
					t.Errorf("error:\n got %v\nwant %s", err, want)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Errorf("ResolveBase = %s, %v; want %s", got, err, tt.want)
			}
		})
	}
}

func TestResolveTarball(t *testing.T) {
	path := filepath.Join(t.TempDir(), "base.tar")
	tag, _ := name.NewTag("kiln/base:bookworm")
	if err := tarball.WriteToFile(path, tag, randomImage(t)); err != nil {
		t.Fatal(err)
	}
	got, err := OCIResolver{}.ResolveBase(context.Background(), spec.Base{Tarball: path, Ref: "docker-archive:" + path})
	if err != nil {
		t.Fatal(err)
	}
	img, err := tarball.ImageFromPath(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := img.RawManifest()
	if want := "sha256:" + hexSum(raw); got != want {
		t.Errorf("digest %s, want the hash of the manifest the tarball gives, %s", got, want)
	}
}
