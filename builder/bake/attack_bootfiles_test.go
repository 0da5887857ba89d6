package bake

import (
	"bytes"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kilnproject/kiln/builder/disk"
	"github.com/kilnproject/kiln/internal/nodeimage"
	"github.com/kilnproject/kiln/internal/testkit"
)

// hostSentinel is a file of the build host, outside every tree a test bakes: a base whose
// boot files point at it must never get its bytes into an image.
type hostSentinel struct {
	dir, path string
	content   []byte
	tree      testkit.Tree // the sentinel's directory as made
}

func newHostSentinel(t *testing.T, names ...string) *hostSentinel {
	t.Helper()
	s := &hostSentinel{dir: t.TempDir()}
	s.content = []byte("HOST-SENTINEL " + strings.Repeat("build host secret ", 8) + t.Name() + "\n")
	for i, n := range append([]string{"sentinel"}, names...) {
		p := filepath.Join(s.dir, n)
		if err := os.WriteFile(p, s.content, 0o600); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			s.path = p
		}
	}
	s.tree = testkit.Snapshot(t, s.dir)
	return s
}

// climbing is a relative symlink target that climbs out of any tree (".." up to "/") and
// then down to the sentinel.
func (s *hostSentinel) climbing() string {
	return strings.Repeat("../", 64) + strings.TrimPrefix(s.path, "/")
}

// check fails the test if the sentinel's bytes are in any file under dir or in msg, or if
// the sentinel's directory changed.
func (s *hostSentinel) check(t *testing.T, dir, msg string) {
	t.Helper()
	if strings.Contains(msg, string(s.content)) || strings.Contains(msg, "HOST-SENTINEL") {
		t.Errorf("the host sentinel's content is in the error: %s", msg)
	}
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil
		}
		if s.in(t, p) {
			t.Errorf("the host sentinel's content is in %s", p)
		}
		return nil
	})
	s.tree.Unchanged(t, s.dir)
}

// in reports whether file p holds the sentinel's bytes. It reads p in pieces: a baked raw
// disk is a sparse file of a GiB.
func (s *hostSentinel) in(t *testing.T, p string) bool {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	keep := 0 // bytes carried over from the previous piece, so a match across pieces counts
	for {
		n, err := f.Read(buf[keep:])
		if bytes.Contains(buf[:keep+n], s.content) {
			return true
		}
		if err == io.EOF {
			return false
		}
		if err != nil {
			t.Fatal(err)
		}
		total := keep + n
		keep = min(total, len(s.content)-1)
		copy(buf, buf[total-keep:total])
	}
}

// withEntries returns base with each of es replacing the entry of the same name (or added),
// and the entries named in drop left out.
func withEntries(base []testkit.Entry, drop []string, es ...testkit.Entry) []testkit.Entry {
	var out []testkit.Entry
	for _, b := range base {
		skip := false
		for _, d := range drop {
			skip = skip || b.Name == d
		}
		for _, e := range es {
			skip = skip || b.Name == e.Name
		}
		if !skip {
			out = append(out, b)
		}
	}
	return append(out, es...)
}

// espFileSize returns the size of path on the ESP of a baked raw disk.
func espFileSize(t *testing.T, raw, path string) int64 {
	t.Helper()
	_, esp, err := disk.Read(raw)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range esp.Files {
		if f.Path == path {
			return f.Size
		}
	}
	t.Fatalf("no %s on the ESP of %s (files: %+v)", path, raw, esp.Files)
	return 0
}

// bootFile is a file of the base tree that a bake copies onto the ESP.
type bootFile struct {
	what    string // how errors name it
	path    string // in the tree
	espPath string
	inside  string // where its in-tree copy lives in the shapes that stay inside the tree
	body    string // that copy's content
	extra   []bootFileCase
}

// bootFileCase is one shape of base: hostile when want is set, harmless otherwise.
type bootFileCase struct {
	name string
	base func(s *hostSentinel) []testkit.Entry
	want []string // error parts; none: the bake succeeds
}

const (
	bootKernel = "boot/vmlinuz-" + testKernel
	modKernel  = "usr/lib/modules/" + testKernel + "/vmlinuz"
	kernelBody = "fake kernel image from inside the tree"
)

var treeBootFiles = []bootFile{
	{
		what: "kernel", path: bootKernel, espPath: nodeimage.KernelPath,
		inside: "usr/lib/linux/image", body: kernelBody,
		extra: []bootFileCase{
			{
				name: "kernel in the module directory symlinked to a host file",
				base: func(s *hostSentinel) []testkit.Entry {
					return withEntries(fakeBase(true), []string{bootKernel}, testkit.Entry{Name: modKernel, Link: s.path})
				},
				want: []string{"kernel /" + modKernel, "refused"},
			},
			{
				name: "kernel through a symlinked directory inside the tree",
				base: func(s *hostSentinel) []testkit.Entry {
					return withEntries(fakeBase(true), []string{bootKernel},
						testkit.Entry{Name: "usr/lib/boot-files/vmlinuz-" + testKernel, Body: kernelBody},
						testkit.Entry{Name: "boot", Link: "usr/lib/boot-files"})
				},
			},
		},
	},
	{
		what: "systemd-boot", path: "usr/lib/systemd/boot/efi/systemd-bootx64.efi", espPath: "/EFI/BOOT/BOOTX64.EFI",
		inside: "usr/share/sd/systemd-bootx64.efi", body: "MZ systemd-boot from inside the tree",
	},
}

// shapes returns the four shapes every boot file is tried in, then f's own.
func (f bootFile) shapes() []bootFileCase {
	dir := path.Dir(f.path)
	named := f.what + " /" + f.path
	return append([]bootFileCase{
		{
			name: "absolute symlink to a host file",
			base: func(s *hostSentinel) []testkit.Entry {
				return withEntries(fakeBase(true), nil, testkit.Entry{Name: f.path, Link: s.path})
			},
			want: []string{named, `a symlink to "` + atSentinel + `"`, "refused"},
		},
		{
			name: "relative symlink climbing out",
			base: func(s *hostSentinel) []testkit.Entry {
				return withEntries(fakeBase(true), nil, testkit.Entry{Name: f.path, Link: s.climbing()})
			},
			want: []string{named, "a symlink to", "refused"},
		},
		{
			name: "directory symlinked to the host",
			base: func(s *hostSentinel) []testkit.Entry {
				return withEntries(fakeBase(true), []string{f.path}, testkit.Entry{Name: dir, Link: s.dir})
			},
			want: []string{named, "refused"},
		},
		{
			name: "relative symlink inside the tree",
			base: func(s *hostSentinel) []testkit.Entry {
				up := strings.Repeat("../", strings.Count(dir, "/")+1)
				return withEntries(fakeBase(true), nil,
					testkit.Entry{Name: f.inside, Body: f.body},
					testkit.Entry{Name: f.path, Link: up + f.inside})
			},
		},
	}, f.extra...)
}

// A base's kernel image and systemd-boot are read inside the base tree only. One that is
// a symlink to a file of the build host (absolute, or relative and climbing out with ".."),
// or that sits in a directory symlinked out of the tree, fails the bake with an error
// naming it, and the host file's bytes reach no output. Symlinks that stay inside the tree
// still work.
func TestBakeBootFilesStayInTree(t *testing.T) {
	for _, f := range treeBootFiles {
		for _, tc := range f.shapes() {
			t.Run(f.what+"/"+tc.name, func(t *testing.T) {
				s := newHostSentinel(t, path.Base(f.path))
				r := newRepo(t, tc.base(s), "role: worker\n")
				r.lock(t)
				_, err := r.bake(t)
				checkBootFileBake(t, f, tc, s, r, err)
			})
		}
	}
}

// checkBootFileBake checks the outcome of baking one shape of f.
func checkBootFileBake(t *testing.T, f bootFile, tc bootFileCase, s *hostSentinel, r *testRepo, err error) {
	t.Helper()
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	s.check(t, r.dir, msg)
	if len(tc.want) == 0 {
		if err != nil {
			t.Fatalf("bake: %v", err)
		}
		if got := espFileSize(t, filepath.Join(r.out, "test-worker.raw"), f.espPath); got != int64(len(f.body)) {
			t.Errorf("ESP %s has %d bytes, want the %d of the tree's %s", f.espPath, got, len(f.body), f.what)
		}
		return
	}
	var want []string
	for _, w := range tc.want {
		want = append(want, strings.ReplaceAll(w, atSentinel, s.path))
	}
	r.wantBakeError(t, err, want)
}

// atSentinel stands for the host sentinel's path in a wanted error part.
const atSentinel = "<sentinel path>"
