package bake

import (
	"bytes"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kilnproject/kiln/builder/disk"
)

// hostSentinel is a file of the build host, outside every tree a test bakes: a base whose
// boot files point at it must never get its bytes into an image.
type hostSentinel struct {
	dir, path string
	content   []byte
	mtime     time.Time
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
	fi, err := os.Stat(s.path)
	if err != nil {
		t.Fatal(err)
	}
	s.mtime = fi.ModTime()
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
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		p := filepath.Join(s.dir, e.Name())
		b, err := os.ReadFile(p)
		if err != nil || !bytes.Equal(b, s.content) {
			t.Errorf("host file %s changed: %q, %v", p, b, err)
		}
	}
	if fi, err := os.Stat(s.path); err != nil || !fi.ModTime().Equal(s.mtime) {
		t.Errorf("host sentinel %s was touched: %v", s.path, err)
	}
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
func withEntries(base []tarEntry, drop []string, es ...tarEntry) []tarEntry {
	var out []tarEntry
	for _, b := range base {
		skip := false
		for _, d := range drop {
			skip = skip || b.name == d
		}
		for _, e := range es {
			skip = skip || b.name == e.name
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

// A base's kernel image is read inside the base tree only. One that is a symlink to a
// file of the build host (absolute, or relative and climbing out with ".."), or that sits
// in a directory symlinked out of the tree, fails the bake with an error naming it, and
// the host file's bytes reach no output. Symlinks that stay inside the tree still work.
func TestBakeKernelStaysInTree(t *testing.T) {
	const bootKernel = "boot/vmlinuz-" + testKernel
	const modKernel = "usr/lib/modules/" + testKernel + "/vmlinuz"
	const image = "fake kernel image from inside the tree"
	for _, tc := range []struct {
		name string
		base func(s *hostSentinel) []tarEntry
		want []string // error parts; none: the bake succeeds
	}{
		{
			name: "absolute symlink to a host file",
			base: func(s *hostSentinel) []tarEntry {
				return withEntries(fakeBase(true), nil, tarEntry{name: bootKernel, link: s.path})
			},
			want: []string{"kernel /" + bootKernel, `a symlink to "` + atSentinel + `"`, "refused"},
		},
		{
			name: "relative symlink climbing out",
			base: func(s *hostSentinel) []tarEntry {
				return withEntries(fakeBase(true), nil, tarEntry{name: bootKernel, link: s.climbing()})
			},
			want: []string{"kernel /" + bootKernel, "a symlink to", "refused"},
		},
		{
			name: "boot directory symlinked to the host",
			base: func(s *hostSentinel) []tarEntry {
				return withEntries(fakeBase(true), []string{bootKernel}, tarEntry{name: "boot", link: s.dir})
			},
			want: []string{"kernel /" + bootKernel, "refused"},
		},
		{
			name: "kernel in the module directory symlinked to a host file",
			base: func(s *hostSentinel) []tarEntry {
				return withEntries(fakeBase(true), []string{bootKernel}, tarEntry{name: modKernel, link: s.path})
			},
			want: []string{"kernel /" + modKernel, "refused"},
		},
		{
			name: "relative symlink inside the tree",
			base: func(s *hostSentinel) []tarEntry {
				return withEntries(fakeBase(true), nil,
					tarEntry{name: "usr/lib/linux/image", body: image},
					tarEntry{name: bootKernel, link: "../usr/lib/linux/image"})
			},
		},
		{
			name: "kernel through a symlinked directory inside the tree",
			base: func(s *hostSentinel) []tarEntry {
				return withEntries(fakeBase(true), []string{bootKernel},
					tarEntry{name: "usr/lib/boot-files/vmlinuz-" + testKernel, body: image},
					tarEntry{name: "boot", link: "usr/lib/boot-files"})
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newHostSentinel(t, "vmlinuz-"+testKernel)
			r := newRepo(t, tc.base(s), "role: worker\n")
			r.lock(t)
			_, err := r.bake(t)
			msg := ""
			if err != nil {
				msg = err.Error()
			}
			s.check(t, r.dir, msg)
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("bake: %v", err)
				}
				if got := espFileSize(t, filepath.Join(r.out, "test-worker.raw"), disk.KernelPath); got != int64(len(image)) {
					t.Errorf("ESP %s has %d bytes, want the %d of the tree's kernel", disk.KernelPath, got, len(image))
				}
				return
			}
			if err == nil {
				t.Fatal("bake succeeded; want an error naming the kernel")
			}
			for _, w := range tc.want {
				w = strings.ReplaceAll(w, atSentinel, s.path)
				if !strings.Contains(msg, w) {
					t.Errorf("error %q does not mention %q", msg, w)
				}
			}
			r.assertNoOutput(t)
		})
	}
}

// atSentinel stands for the host sentinel's path in a wanted error part.
const atSentinel = "<sentinel path>"
