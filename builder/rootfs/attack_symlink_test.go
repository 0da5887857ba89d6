package rootfs

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The attack tests build hostile layers themselves and check from the build host's side that
// nothing outside the tree changed: a sentinel directory beside the tree is hashed (names,
// types, modes, times, link counts, contents, symlink targets) before and after.

// hostile is a layer built from raw tar headers (Size is set from body for regular files).
func hostile(t testing.TB, hdrs ...hdrBody) v1.Layer {
	t.Helper()
	b, err := tarOf(hdrs...)
	if err != nil {
		t.Fatal(err)
	}
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil },
		tarball.WithMediaType(types.OCILayer))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

type hdrBody struct {
	tar.Header
	body string
}

func tarOf(hdrs ...hdrBody) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range hdrs {
		hdr := h.Header
		if hdr.Mode == 0 {
			hdr.Mode = 0o644
		}
		if hdr.ModTime.IsZero() {
			hdr.ModTime = time.Unix(1e9, 0)
		}
		if hdr.Typeflag == tar.TypeReg {
			hdr.Size = int64(len(h.body))
		}
		if err := tw.WriteHeader(&hdr); err != nil {
			return nil, err
		}
		if _, err := io.WriteString(tw, h.body); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func file(name, body string) hdrBody {
	return hdrBody{Header: tar.Header{Name: name, Typeflag: tar.TypeReg}, body: body}
}
func dirEnt(name string, mode int64) hdrBody {
	return hdrBody{Header: tar.Header{Name: name, Typeflag: tar.TypeDir, Mode: mode}}
}
func symlink(name, target string) hdrBody {
	return hdrBody{Header: tar.Header{Name: name, Typeflag: tar.TypeSymlink, Linkname: target}}
}
func hardlink(name, target string) hdrBody {
	return hdrBody{Header: tar.Header{Name: name, Typeflag: tar.TypeLink, Linkname: target}}
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

// snapshot hashes everything observable about the tree at dir.
func snapshot(t testing.TB, dir string) string {
	t.Helper()
	h := sha256.New()
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		fmt.Fprintf(h, "%s %v %d %d", rel, fi.Mode(), fi.ModTime().UnixNano(), fi.Size())
		if st, ok := fi.Sys().(interface{ Nlink() uint64 }); ok {
			fmt.Fprintf(h, " %d", st.Nlink())
		}
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			fmt.Fprintf(h, " -> %s", target)
		case fi.Mode().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			fmt.Fprintf(h, " %x", sha256.Sum256(b))
		}
		fmt.Fprintln(h)
		return nil
	})
	if err != nil {
		t.Fatalf("snapshot %s: %v", dir, err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// inTree is where the image path p (absolute) lies on the host.
func inTree(tree, p string) string { return filepath.Join(tree, filepath.FromSlash(p)) }

func TestAttackWritesThroughSymlinks(t *testing.T) {
	for _, tc := range []struct {
		name string
		// layers builds the hostile layers given the sentinel's host path.
		layers func(sent string) [][]hdrBody
		// lands, when set, is the image path where the write must end up inside the tree.
		lands string
		// err, when set, must appear in Flatten's error with the entry's name.
		err, entry string
	}{
		{
			name: "file through an absolute symlink",
			layers: func(s string) [][]hdrBody {
				return [][]hdrBody{{symlink("evil", s), file("evil/planted", "x")}}
			},
			lands: "/planted",
		},
		{
			name: "file through a climbing relative symlink",
			layers: func(s string) [][]hdrBody {
				return [][]hdrBody{{dirEnt("a/", 0o755), symlink("a/evil", strings.Repeat("../", 20)+strings.TrimPrefix(s, "/")),
					file("a/evil/planted", "x")}}
			},
			lands: "/planted",
		},
		{
			name: "file over a host file through a symlinked parent",
			layers: func(s string) [][]hdrBody {
				return [][]hdrBody{{symlink("evil", s)}, {file("evil/victim", "overwritten")}}
			},
			lands: "/victim",
		},
		{
			name: "directory and chmod through a symlink",
			layers: func(s string) [][]hdrBody {
				return [][]hdrBody{{symlink("evil", s), dirEnt("evil/sub/", 0o777)}}
			},
			lands: "/sub",
		},
		{
			name: "directory times through a directory replaced by a symlink",
			layers: func(s string) [][]hdrBody {
				return [][]hdrBody{{dirEnt("d/", 0o755), symlink("d", s)}}
			},
		},
		{
			name: "nested directory times through a parent replaced by a symlink",
			layers: func(s string) [][]hdrBody {
				return [][]hdrBody{{dirEnt("d/", 0o755), dirEnt("d/sub/", 0o755), symlink("d", s)}}
			},
		},
		{
			name: "hard link to a host file through a symlinked parent",
			layers: func(s string) [][]hdrBody {
				return [][]hdrBody{{symlink("evil", s), hardlink("stolen", "evil/victim")}}
			},
			err: "no such file", entry: "stolen",
		},
		{
			name: "hard link to a symlink that points at a host file",
			layers: func(s string) [][]hdrBody {
				return [][]hdrBody{{symlink("evil", s+"/victim"), hardlink("stolen", "evil"), file("stolen", "overwritten")}}
			},
		},
		{
			name: "symlink loop",
			layers: func(s string) [][]hdrBody {
				return [][]hdrBody{{symlink("a", "b"), symlink("b", "a"), file("a/x", "x")}}
			},
			err: "too many levels of symbolic links", entry: "a/x",
		},
		{
			name: "symlink to itself",
			layers: func(s string) [][]hdrBody {
				return [][]hdrBody{{symlink("loop", "/loop/../loop"), file("loop/x", "x")}}
			},
			err: "too many levels of symbolic links", entry: "loop/x",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			layersOf := func(s string) []v1.Layer {
				var ls []v1.Layer
				for _, hs := range tc.layers(s) {
					ls = append(ls, hostile(t, hs...))
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
	before := snapshot(t, sent)
	src, _ := writeLayout(t, layersOf(sent)...)
	img, err := OpenBase(context.Background(), src)
	if err != nil {
		t.Fatal(err)
	}
	tree = filepath.Join(base, "tree")
	_, err = FlattenWith(img, tree, o)
	if after := snapshot(t, sent); after != before {
		t.Errorf("the build host's sentinel directory %s changed (Flatten: %v)", sent, err)
	}
	var pe *fs.PathError
	if errors.As(err, &pe) && strings.HasPrefix(pe.Path, "/") && !strings.HasPrefix(pe.Path, tree) {
		t.Errorf("Flatten touched the host path %s: %v", pe.Path, err)
	}
	return tree, sent, err
}
