package rootfs

import (
	"archive/tar"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/kilnproject/kiln/internal/testkit"
)

// The attack tests build hostile layers themselves and check from the build host's side that
// nothing outside the tree changed: a sentinel directory beside the tree is hashed (names,
// types, modes, times, link counts, contents, symlink targets) before and after.

func file(name, body string) testkit.Entry {
	return testkit.Entry{Name: name, Type: tar.TypeReg, Body: body}
}
func dirEnt(name string, mode int64) testkit.Entry {
	return testkit.Entry{Name: name, Type: tar.TypeDir, Mode: mode}
}
func symlink(name, target string) testkit.Entry {
	return testkit.Entry{Name: name, Type: tar.TypeSymlink, Link: target}
}
func hardlink(name, target string) testkit.Entry {
	return testkit.Entry{Name: name, Type: tar.TypeLink, Link: target}
}

// sentinel makes a directory outside any tree, with a file, a subdirectory and a symlink, and
// old times so that a change of time shows.
func sentinel(t testing.TB, parent string) string {
	t.Helper()
	s := filepath.Join(parent, "sentinel")
	for _, d := range []string{s, filepath.Join(s, "sub")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for name, body := range map[string]string{"victim": "host data\n", "sub/deep": "deeper host data\n"} {
		if err := os.WriteFile(filepath.Join(s, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("victim", filepath.Join(s, "link")); err != nil {
		t.Fatal(err)
	}
	old := time.Unix(5e8, 0)
	for _, p := range []string{"victim", "sub/deep", "sub", "."} {
		if err := os.Chtimes(filepath.Join(s, p), old, old); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// inTree is where the image path p (absolute) lies on the host.
func inTree(tree, p string) string { return filepath.Join(tree, filepath.FromSlash(p)) }

// symlinkAttack is hostile layers that write through symlinks, and where the write must land or how Flatten must fail.
type symlinkAttack struct {
	name string
	// layers builds the hostile layers given the sentinel's host path.
	layers func(sent string) [][]testkit.Entry
	// lands, when set, is the image path where the write must end up inside the tree.
	lands string
	// err, when set, must appear in Flatten's error with the entry's name.
	err, entry string
}

var symlinkAttacks = []symlinkAttack{
	{
		name: "file through an absolute symlink",
		layers: func(s string) [][]testkit.Entry {
			return [][]testkit.Entry{{symlink("evil", s), file("evil/planted", "x")}}
		},
		lands: "/planted",
	},
	{
		name: "file through a climbing relative symlink",
		layers: func(s string) [][]testkit.Entry {
			return [][]testkit.Entry{{dirEnt("a/", 0o755), symlink("a/evil", strings.Repeat("../", 20)+strings.TrimPrefix(s, "/")),
				file("a/evil/planted", "x")}}
		},
		lands: "/planted",
	},
	{
		name: "file over a host file through a symlinked parent",
		layers: func(s string) [][]testkit.Entry {
			return [][]testkit.Entry{{symlink("evil", s)}, {file("evil/victim", "overwritten")}}
		},
		lands: "/victim",
	},
	{
		name: "directory and chmod through a symlink",
		layers: func(s string) [][]testkit.Entry {
			return [][]testkit.Entry{{symlink("evil", s), dirEnt("evil/sub/", 0o777)}}
		},
		lands: "/sub",
	},
	{
		name: "directory times through a directory replaced by a symlink",
		layers: func(s string) [][]testkit.Entry {
			return [][]testkit.Entry{{dirEnt("d/", 0o755), symlink("d", s)}}
		},
	},
	{
		name: "nested directory times through a parent replaced by a symlink",
		layers: func(s string) [][]testkit.Entry {
			return [][]testkit.Entry{{dirEnt("d/", 0o755), dirEnt("d/sub/", 0o755), symlink("d", s)}}
		},
	},
	{
		name: "hard link to a host file through a symlinked parent",
		layers: func(s string) [][]testkit.Entry {
			return [][]testkit.Entry{{symlink("evil", s), hardlink("stolen", "evil/victim")}}
		},
		err: "no such file", entry: "stolen",
	},
	{
		name: "hard link to a symlink that points at a host file",
		layers: func(s string) [][]testkit.Entry {
			return [][]testkit.Entry{{symlink("evil", s+"/victim"), hardlink("stolen", "evil"), file("stolen", "overwritten")}}
		},
	},
	{
		name: "symlink loop",
		layers: func(s string) [][]testkit.Entry {
			return [][]testkit.Entry{{symlink("a", "b"), symlink("b", "a"), file("a/x", "x")}}
		},
		err: "too many levels of symbolic links", entry: "a/x",
	},
	{
		name: "symlink to itself",
		layers: func(s string) [][]testkit.Entry {
			return [][]testkit.Entry{{symlink("loop", "/loop/../loop"), file("loop/x", "x")}}
		},
		err: "too many levels of symbolic links", entry: "loop/x",
	},
}

func TestAttackWritesThroughSymlinks(t *testing.T) {
	for _, tc := range symlinkAttacks {
		t.Run(tc.name, func(t *testing.T) {
			layersOf := func(s string) []v1.Layer {
				var ls []v1.Layer
				for _, hs := range tc.layers(s) {
					ls = append(ls, testkit.Layer(t, hs...))
				}
				return ls
			}
			tree, sent, err := attack(t, layersOf)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), tc.entry) {
					t.Fatalf("Flatten = %v; want an error naming %s with %q", err, tc.entry, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Flatten: %v", err)
			}
			if tc.lands != "" {
				if _, err := os.Lstat(inTree(tree, sent+tc.lands)); err != nil {
					t.Errorf("the write did not land inside the tree at %s: %v", sent+tc.lands, err)
				}
			}
		})
	}
}

// attack flattens the layers that layersOf builds (given the sentinel's host path) into a fresh
// tree beside a fresh sentinel directory and returns the tree, the sentinel and Flatten's error.
// It fails the test if the sentinel changed.
func attack(t *testing.T, layersOf func(sentinel string) []v1.Layer) (tree, sent string, err error) {
	t.Helper()
	return attackWith(t, FlattenOptions{}, layersOf)
}

// attackWith is attack with options for Flatten.
func attackWith(t *testing.T, o FlattenOptions, layersOf func(sentinel string) []v1.Layer) (tree, sent string, err error) {
	t.Helper()
	base := t.TempDir()
	sent = sentinel(t, base)
	before := testkit.Snapshot(t, sent)
	src, _ := writeLayout(t, layersOf(sent)...)
	img, err := OpenBase(context.Background(), src)
	if err != nil {
		t.Fatal(err)
	}
	tree = filepath.Join(base, "tree")
	_, err = FlattenWith(img, tree, o)
	if d := before.Diff(testkit.Snapshot(t, sent), nil); len(d) > 0 {
		t.Errorf("the build host's sentinel directory %s changed (Flatten: %v):\n%s", sent, err, strings.Join(d, "\n"))
	}
	var pe *fs.PathError
	if errors.As(err, &pe) && strings.HasPrefix(pe.Path, "/") && !strings.HasPrefix(pe.Path, tree) {
		t.Errorf("Flatten touched the host path %s: %v", pe.Path, err)
	}
	return tree, sent, err
}
