package rootfs

import (
	"archive/tar"
	"context"
	"errors"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/kilnproject/kiln/internal/testkit"
)

// FlattenOptions.Exact and DiffIDs, as the bake flattens a container image for containerd's
// store: what the tree cannot hold is refused naming the entry, and a layer whose uncompressed
// bytes are not what the config says is refused.
func TestFlattenExactAndDiffIDs(t *testing.T) {
	plain := testkit.Layer(t, testkit.Entry{Name: "bin/", Dir: true}, testkit.Entry{Name: "bin/tool", Body: "tool"})
	for _, tc := range []struct {
		name  string
		entry testkit.Entry
		want  string // in the *InexactError's message; "" for none
	}{
		{"file capability", testkit.Entry{Name: "bin/ping", Body: "x", Xattrs: map[string]string{"security.capability": "\x01\x00\x00\x02"}}, "bin/ping: the extended attribute security.capability"},
		{"device node", testkit.Entry{Name: "dev/null", Type: tar.TypeChar}, "dev/null: a device node"},
		{"fifo", testkit.Entry{Name: "run/fifo", Type: tar.TypeFifo}, "run/fifo: a FIFO"},
		{"plain file", testkit.Entry{Name: "etc/motd", Body: "hi"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src, _ := writeLayout(t, plain, testkit.Layer(t, tc.entry))
			img, err := OpenBase(context.Background(), src)
			if err != nil {
				t.Fatal(err)
			}
			cf, err := img.ConfigFile()
			if err != nil {
				t.Fatal(err)
			}
			_, err = FlattenWith(img, t.TempDir(), FlattenOptions{Exact: true, DiffIDs: cf.RootFS.DiffIDs})
			var inexact *InexactError
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("FlattenWith: %v", err)
			case tc.want != "" && (!errors.As(err, &inexact) || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("FlattenWith = %v, want an InexactError saying %q", err, tc.want)
			}
			if tc.want == "" {
				return
			}
			// Without Exact the base's flatten leaves it out and goes on.
			if _, err := FlattenWith(img, t.TempDir(), FlattenOptions{}); err != nil {
				t.Errorf("without Exact: %v", err)
			}
		})
	}

	t.Run("diff ID mismatch", func(t *testing.T) {
		src, _ := writeLayout(t, plain)
		img, err := OpenBase(context.Background(), src)
		if err != nil {
			t.Fatal(err)
		}
		wrong := v1.Hash{Algorithm: "sha256", Hex: strings.Repeat("ab", 32)}
		_, err = FlattenWith(img, t.TempDir(), FlattenOptions{DiffIDs: []v1.Hash{wrong}})
		if err == nil || !strings.Contains(err.Error(), "the image config says sha256:abab") || !strings.Contains(err.Error(), "layer 0") {
			t.Errorf("FlattenWith with a wrong diff ID = %v", err)
		}
	})
}
