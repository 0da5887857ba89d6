package rootfs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/kilnproject/kiln/internal/testkit"
)

// Names and link targets the fuzzer combines; $S is the sentinel directory beside the tree, $B
// the directory holding both, $U a climb from the tree to the host's root.
var (
	fuzzNames = []string{"a", "b", "evil", "a/b", "evil/x", "evil/victim", "evil/sub/deep", "d/", "d/e",
		".wh.a", ".wh.evil", "evil/.wh.victim", "evil/.wh.sub", "evil/.wh..wh..opq", ".wh..wh..opq",
		"a/.wh.b", "a/.wh..wh..opq", "d/.wh..wh..opq", "x/y/z", "a/b/c", "evil/sub/", "$S/victim"}
	fuzzTargets = []string{"a", "b", "/", "..", "../../..", "$S", "$S/victim", "$S/sub", "$B", "$U$S",
		"$U$B", "a/b", "evil", "/evil/x", ".", "d", "../evil", "evil/sub", "$S/link", "a/../.."}
)

// fuzzLayers decodes data into layers of tar entries: each entry takes three bytes (kind, name,
// target); kind 4 starts a new layer and kind 5 takes a raw name from the bytes that follow.
func fuzzLayers(data []byte, sent, base string) [][]testkit.Entry {
	up := strings.Repeat("../", strings.Count(base, "/")+3)
	expand := func(s string) string {
		s = strings.ReplaceAll(s, "$U", up[:len(up)-1])
		s = strings.ReplaceAll(s, "$S", sent)
		return strings.ReplaceAll(s, "$B", base)
	}
	layers := [][]testkit.Entry{nil}
	for len(data) >= 3 {
		kind, n, tg := data[0]%6, int(data[1]), int(data[2])
		data = data[3:]
		name := expand(fuzzNames[n%len(fuzzNames)])
		target := expand(fuzzTargets[tg%len(fuzzTargets)])
		var h testkit.Entry
		switch kind {
		case 0:
			h = file(name, target)
		case 1:
			h = dirEnt(name, int64(tg)<<3|0o5)
		case 2:
			h = symlink(name, target)
		case 3:
			h = hardlink(name, target)
		case 4:
			if len(layers) < 4 {
				layers = append(layers, nil)
			}
			continue
		case 5:
			l := min(n%32, len(data))
			h = symlink(string(data[:l]), target)
			if tg%2 == 0 {
				h = file(string(data[:l]), "raw")
			}
			data = data[l:]
		}
		layers[len(layers)-1] = append(layers[len(layers)-1], h)
	}
	return layers
}

func FuzzFlatten(f *testing.F) {
	seed := func(entries ...[3]byte) []byte {
		var b []byte
		for _, e := range entries {
			b = append(b, e[:]...)
		}
		return b
	}
	idx := func(list []string, s string) byte {
		for i, x := range list {
			if x == s {
				return byte(i)
			}
		}
		panic(s)
	}
	n, tg := func(s string) byte { return idx(fuzzNames, s) }, func(s string) byte { return idx(fuzzTargets, s) }
	f.Add(seed([3]byte{2, n("evil"), tg("$S")}, [3]byte{4, 0, 0}, [3]byte{0, n("evil/.wh.victim"), 0}))
	f.Add(seed([3]byte{2, n("evil"), tg("$U$S")}, [3]byte{0, n("evil/.wh..wh..opq"), 0}))
	f.Add(seed([3]byte{1, n("d/"), 0}, [3]byte{2, n("d/"), tg("$S")}))
	f.Add(seed([3]byte{2, n("evil"), tg("$S")}, [3]byte{3, n("a"), tg("/evil/x")}, [3]byte{0, n("evil/sub/deep"), 0}))
	f.Add(seed([3]byte{2, n("a"), tg("b")}, [3]byte{2, n("b"), tg("a")}, [3]byte{0, n("a/b"), 0}))
	f.Fuzz(func(t *testing.T, data []byte) {
		base := t.TempDir()
		sent := sentinel(t, base)
		before := testkit.Snapshot(t, sent)
		var layers []v1.Layer
		for _, hs := range fuzzLayers(data, sent, base) {
			b, err := testkit.Archive(hs...)
			if err != nil {
				return // not a tar archive/tar can write
			}
			layers = append(layers, static.NewLayer(b, types.OCIUncompressedLayer))
		}
		img, err := mutate.AppendLayers(empty.Image, layers...)
		if err != nil {
			t.Fatal(err)
		}
		tree := filepath.Join(base, "tree")
		_, ferr := Flatten(img, tree)
		if d := before.Diff(testkit.Snapshot(t, sent), nil); len(d) > 0 {
			t.Fatalf("flattening changed the sentinel directory beside the tree (Flatten: %v):\n%s", ferr, strings.Join(d, "\n"))
		}
		// Nothing new appeared beside the tree either.
		ents, err := os.ReadDir(base)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			if e.Name() != "sentinel" && e.Name() != "tree" {
				t.Fatalf("flattening left %s beside the tree (Flatten: %v)", e.Name(), ferr)
			}
		}
	})
}
