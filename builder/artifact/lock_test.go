package artifact

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"

	"github.com/kilnproject/kiln/builder/spec"
)

// lockRepo writes a definition with an OCI layout base tagged bookworm and
// a worker profile with one artifact pinned in the profile and one not.
func lockRepo(t *testing.T, url string) (def *spec.Definition, prof *spec.Profile, baseDigest, pinned string) {
	t.Helper()
	root := t.TempDir()
	p, err := layout.Write(filepath.Join(root, "oci"), empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	img := randomImage(t)
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{RefNameAnnotation: "bookworm"})); err != nil {
		t.Fatal(err)
	}
	pinned = hexSum([]byte("runc"))
	os.MkdirAll(filepath.Join(root, "images"), 0o755)
	os.MkdirAll(filepath.Join(root, "profiles"), 0o755)
	os.WriteFile(filepath.Join(root, "images", "qemu.yaml"), []byte("name: qemu\nplatform: qemu\nbase:\n  layout: ../oci\n  tag: bookworm\n"), 0o644)
	os.WriteFile(filepath.Join(root, "profiles", "worker.yaml"), []byte(fmt.Sprintf(`role: worker
artifacts:
  - name: runc
    path: runc
    sha256: %s
    dest: /usr/sbin/runc
  - name: crictl
    url: %s
    dest: /usr/local/bin/crictl
    mode: "0755"
`, pinned, url)), 0o644)
	os.WriteFile(filepath.Join(root, "profiles", "runc"), []byte("runc"), 0o644)
	def, err = spec.LoadDefinition(filepath.Join(root, "images", "qemu.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	prof, err = def.Profile("worker")
	if err != nil {
		t.Fatal(err)
	}
	return def, prof, digestOf(t, img), pinned
}

// pinRepo is lockRepo's definition and profile, with the server its crictl comes from.
type pinRepo struct {
	def        *spec.Definition
	prof       *spec.Profile
	srv        *server
	content    []byte // crictl
	sum        string // of content
	baseDigest string
	runcSum    string
	lockFile   string
}

func TestPinAndBake(t *testing.T) {
	content := payload(50 << 10)
	srv := newServer(t, content, 16<<10, 0)
	def, prof, baseDigest, runcSum := lockRepo(t, srv.URL+"/blob")
	r := pinRepo{def: def, prof: prof, srv: srv, content: content, sum: hexSum(content),
		baseDigest: baseDigest, runcSum: runcSum, lockFile: LockPath(def)}
	if want := filepath.Join(filepath.Dir(def.File), "qemu.lock"); r.lockFile != want {
		t.Errorf("LockPath = %s, want %s", r.lockFile, want)
	}

	// Before kiln lock, bake refuses.
	old, err := ReadLock(r.lockFile)
	if err != nil {
		t.Fatal(err)
	}
	wantUnpinned := []string{
		def.File + ":4: base: oci:../oci:bookworm is not pinned: no digest here or in qemu.lock (run kiln lock)",
		prof.File + ":7: artifacts: \"crictl\" (" + srv.URL + "/blob) is not pinned: no sha256 here or in the lock file (run kiln lock)",
	}
	if got := Unpinned(def, prof, old); !reflect.DeepEqual(got, wantUnpinned) {
		t.Errorf("Unpinned:\n got %q\nwant %q", got, wantUnpinned)
	}
	if _, err := Sources(prof, old); err == nil || !strings.Contains(err.Error(), wantUnpinned[1]) {
		t.Errorf("Sources of an unpinned profile: %v", err)
	}

	cache := NewCache(t.TempDir())
	pn := &Pinner{Cache: cache, Resolver: OCIResolver{}}
	data := checkFirstPin(t, r, pn, old)
	l, err := ReadLock(r.lockFile)
	if err != nil {
		t.Fatal(err)
	}
	checkBakeFromLock(t, r, cache, l)

	// kiln lock again: nothing to do, same bytes.
	lock2, notes, err := pn.Pin(context.Background(), def, []*spec.Profile{prof}, l)
	if err != nil || len(notes) != 0 {
		t.Errorf("second Pin: notes %q, %v", notes, err)
	}
	lock2.Write(r.lockFile)
	if again, _ := os.ReadFile(r.lockFile); string(again) != string(data) {
		t.Errorf("lock file changed on a second kiln lock:\n%s", again)
	}

	// A changed URL is unpinned again; Update re-downloads everything.
	moved := *prof
	moved.Artifacts = append([]spec.Artifact(nil), prof.Artifacts...)
	moved.Artifacts[1].URL = srv.URL + "/blob?v=2"
	moved.Artifacts[1].Source = moved.Artifacts[1].URL
	if u := Unpinned(nil, &moved, l); len(u) != 1 {
		t.Errorf("changed URL: Unpinned = %q", u)
	}
	pn.Update = true
	if _, notes, err := pn.Pin(context.Background(), def, []*spec.Profile{prof}, l); err != nil || len(notes) != 2 {
		t.Errorf("Pin with Update: notes %q, %v", notes, err)
	}
}

// checkFirstPin runs kiln lock on the unpinned repo: it resolves the base, downloads crictl
// once, says so, and writes the lock file, whose bytes it returns.
func checkFirstPin(t *testing.T, r pinRepo, pn *Pinner, old *Lock) []byte {
	t.Helper()
	lock, notes, err := pn.Pin(context.Background(), r.def, []*spec.Profile{r.prof}, old)
	if err != nil {
		t.Fatal(err)
	}
	wantNotes := []string{
		"pinned base oci:../oci:bookworm to " + r.baseDigest,
		"pinned worker/crictl: downloaded " + r.srv.URL + "/blob once, sha256 " + r.sum + ", no publisher's checksum beside it to check",
	}
	if !reflect.DeepEqual(notes, wantNotes) {
		t.Errorf("notes:\n got %q\nwant %q", notes, wantNotes)
	}
	if err := lock.Write(r.lockFile); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(r.lockFile)
	wantFile := fmt.Sprintf(`{
  "version": 1,
  "base": {
    "ref": "oci:../oci:bookworm",
    "digest": "%s"
  },
  "artifacts": {
    "worker/crictl": {
      "source": "%s/blob",
      "sha256": "%s",
      "pinnedFrom": "download"
    }
  }
}
`, r.baseDigest, r.srv.URL, r.sum)
	if string(data) != wantFile {
		t.Errorf("lock file:\n%s\nwant:\n%s", data, wantFile)
	}
	return data
}

// checkBakeFromLock bakes as a bake does with lock l: everything is pinned, and crictl comes
// from the cache without another download.
func checkBakeFromLock(t *testing.T, r pinRepo, cache *Cache, l *Lock) {
	t.Helper()
	if u := Unpinned(r.def, r.prof, l); len(u) != 0 {
		t.Errorf("still unpinned: %q", u)
	}
	if d := l.BaseDigest(r.def.Base); d != r.baseDigest {
		t.Errorf("BaseDigest = %s", d)
	}
	srcs, err := Sources(r.prof, l)
	if err != nil {
		t.Fatal(err)
	}
	wantSrcs := []Source{
		{Name: "runc", Path: filepath.Join(filepath.Dir(r.prof.File), "runc"), SHA256: r.runcSum},
		{Name: "crictl", URL: r.srv.URL + "/blob", SHA256: r.sum},
	}
	if !reflect.DeepEqual(srcs, wantSrcs) {
		t.Errorf("Sources:\n got %+v\nwant %+v", srcs, wantSrcs)
	}
	root := t.TempDir()
	for i, s := range srcs {
		blob, err := cache.Fetch(context.Background(), s)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := place(blob, r.prof.Artifacts[i], root, MaxUnpacked); err != nil {
			t.Fatal(err)
		}
	}
	if fi, err := os.Stat(filepath.Join(root, "usr/local/bin/crictl")); err != nil || fi.Mode() != 0o755 || fi.Size() != int64(len(r.content)) {
		t.Errorf("crictl in the tree: %v %v", fi, err)
	}
	// The download once, and kiln lock's two looks for a checksum beside it (404).
	if n := r.srv.hits.Load(); n != 3 {
		t.Errorf("server hit %d times, want 3", n)
	}
}

func TestReadLockErrors(t *testing.T) {
	tests := []struct {
		name, content, want string
	}{
		{"unknown field", `{"version": 1, "bases": {}}`, `json: unknown field "bases"`},
		{"version", `{"version": 2}`, "version 2, this kiln reads version 1"},
		{"bad sha", `{"version": 1, "artifacts": {"worker/x": {"source": "x", "sha256": "abc"}}}`, `artifact worker/x: sha256 "abc" is not 64 lower-case hex digits`},
		{"bad digest", `{"version": 1, "base": {"ref": "x", "digest": "sha256:abc"}}`, `base digest "sha256:abc" is not sha256:<64 hex>`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "qemu.lock")
			os.WriteFile(p, []byte(tt.content), 0o644)
			_, err := ReadLock(p)
			if err == nil || !strings.HasPrefix(err.Error(), "lock file "+p+": ") || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %v, want one naming %s and %q", err, p, tt.want)
			}
		})
	}
}
