package rootfs

import (
	"os"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/kilnproject/kiln/internal/testkit"
)

// whiteoutAttack is hostile layers whose whiteouts reach through symlinks, and what Flatten must do with them.
type whiteoutAttack struct {
	name string
	// layers builds the hostile layers given the sentinel's host path s and a path
	// climbing from the tree's first level to the host's root.
	layers func(s, up string) [][]testkit.Entry
	// gone lists image paths the whiteout must remove inside the tree; $S stands for the
	// sentinel's path, which the first layer mirrors inside the tree.
	gone []string
	err  string
}

var whiteoutAttacks = []whiteoutAttack{
	{
		name: "whiteout through an absolute symlink",
		layers: func(s, _ string) [][]testkit.Entry {
			return [][]testkit.Entry{{file(s[1:]+"/victim", "in tree"), symlink("evil", s)}, {file("evil/.wh.victim", "")}}
		},
		gone: []string{"$S/victim"},
	},
	{
		name: "whiteout through a climbing relative symlink",
		layers: func(s, up string) [][]testkit.Entry {
			return [][]testkit.Entry{{file(s[1:]+"/victim", "in tree"), symlink("evil", up+s[1:])}, {file("evil/.wh.victim", "")}}
		},
		gone: []string{"$S/victim"},
	},
	{
		name: "whiteout of a directory through a symlink",
		layers: func(s, _ string) [][]testkit.Entry {
			return [][]testkit.Entry{{file(s[1:]+"/sub/deep", "in tree"), symlink("evil", s)}, {file("evil/.wh.sub", "")}}
		},
		gone: []string{"$S/sub/deep", "$S/sub"},
	},
	{
		name: "whiteout through a symlink, nothing in the tree",
		layers: func(s, _ string) [][]testkit.Entry {
			return [][]testkit.Entry{{symlink("evil", s)}, {file("evil/.wh.victim", ""), file("evil/sub/.wh.deep", "")}}
		},
	},
	{
		name: "whiteout through a symlink in the same layer",
		layers: func(s, _ string) [][]testkit.Entry {
			return [][]testkit.Entry{{symlink("evil", s), file("evil/.wh.victim", "")}}
		},
	},
	{
		name: "whiteout through a chain of symlinks",
		layers: func(s, up string) [][]testkit.Entry {
			return [][]testkit.Entry{{dirEnt("x/", 0o755), symlink("x/one", "../two"), symlink("two", up+s[1:])}, {file("x/one/.wh.victim", "")}}
		},
	},
	{
		name: "opaque whiteout through an absolute symlink",
		layers: func(s, _ string) [][]testkit.Entry {
			return [][]testkit.Entry{{file(s[1:]+"/victim", "in tree"), symlink("evil", s)}, {file("evil/.wh..wh..opq", "")}}
		},
		gone: []string{"$S/victim"},
	},
	{
		name: "opaque whiteout through a climbing relative symlink",
		layers: func(s, up string) [][]testkit.Entry {
			return [][]testkit.Entry{{symlink("evil", up+s[1:])}, {file("evil/.wh..wh..opq", "")}}
		},
	},
	{
		name: "opaque whiteout below a symlinked directory",
		layers: func(s, _ string) [][]testkit.Entry {
			return [][]testkit.Entry{{symlink("evil", s)}, {file("evil/sub/.wh..wh..opq", "")}}
		},
	},
	{
		name: "whiteout of the symlink itself",
		layers: func(s, _ string) [][]testkit.Entry {
			return [][]testkit.Entry{{symlink("evil", s)}, {file(".wh.evil", "")}}
		},
		gone: []string{"/evil"},
	},
	{
		name: "whiteout naming the parent",
		layers: func(s, _ string) [][]testkit.Entry {
			return [][]testkit.Entry{{symlink("evil", s)}, {file("evil/.wh..", "")}}
		},
		err: "evil/.wh..: whiteout names no entry",
	},
	{
		name: "whiteout through a symlink loop",
		layers: func(s, _ string) [][]testkit.Entry {
			return [][]testkit.Entry{{symlink("a", "b"), symlink("b", "a")}, {file("a/.wh.victim", "")}}
		},
		err: "a/.wh.victim: resolve /a: too many levels of symbolic links",
	},
}

func TestAttackWhiteoutsThroughSymlinks(t *testing.T) {
	for _, tc := range whiteoutAttacks {
		t.Run(tc.name, func(t *testing.T) {
			tree, sent, err := attack(t, func(s string) []v1.Layer {
				up := strings.Repeat("../", strings.Count(s, "/")+4)
				var ls []v1.Layer
				for _, hs := range tc.layers(s, up) {
					ls = append(ls, testkit.Layer(t, hs...))
				}
				return ls
			})
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("Flatten = %v; want an error with %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Flatten: %v", err)
			}
			for _, p := range tc.gone {
				p = strings.ReplaceAll(p, "$S", sent)
				if _, err := os.Lstat(inTree(tree, p)); !os.IsNotExist(err) {
					t.Errorf("%s survived its whiteout inside the tree (%v)", p, err)
				}
			}
		})
	}
}
