package bake

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kilnproject/kiln/builder/artifact"
	"github.com/kilnproject/kiln/builder/disk"
	"github.com/kilnproject/kiln/builder/output"
	"github.com/kilnproject/kiln/builder/rootfs"
	"github.com/kilnproject/kiln/internal/nodeimage"
	"github.com/kilnproject/kiln/internal/testkit"
)

const testKernel = "6.1.0-test"

// writeTar writes a tar archive of entries to path.
func writeTar(t *testing.T, path string, entries []testkit.Entry) {
	t.Helper()
	if err := os.WriteFile(path, testkit.Tar(t, entries...), 0o644); err != nil {
		t.Fatal(err)
	}
}

// fakeBase is a tiny base OS: a "kernel", built-in modules, systemd-boot, a unit directory,
// a merged-/usr lib symlink and a file owned by a non-root user.
func fakeBase(withKernel bool) []testkit.Entry {
	var builtin strings.Builder
	for _, m := range defaultModules {
		fmt.Fprintf(&builtin, "kernel/drivers/fake/%s.ko\n", m)
	}
	es := []testkit.Entry{
		{Name: "usr/", Dir: true}, {Name: "usr/lib/", Dir: true}, {Name: "lib", Link: "usr/lib"},
		{Name: "usr/bin/", Dir: true}, {Name: "bin", Link: "usr/bin"}, {Name: "sbin", Link: "usr/sbin"},
		{Name: "etc/", Dir: true}, {Name: "etc/os-release", Body: "ID=fake\n"},
		{Name: "var/", Dir: true}, {Name: "var/log/", Dir: true}, {Name: "var/mail/", Dir: true, Mode: 0o2775, GID: 8},
		{Name: "tmp/", Dir: true, Mode: 0o1777},
		{Name: "usr/lib/systemd/system/", Dir: true, Mode: 0o755},
		{Name: "usr/lib/systemd/boot/efi/systemd-bootx64.efi", Body: "MZ fake systemd-boot"},
		{Name: "usr/lib/systemd/system/multi-user.target", Body: "[Unit]\nDescription=Multi-User\n"},
		{Name: "usr/lib/systemd/system/demo.service", Body: "[Service]\nExecStart=/bin/true\n[Install]\nWantedBy=multi-user.target\n"},
	}
	if withKernel {
		es = append(es,
			testkit.Entry{Name: "boot/vmlinuz-" + testKernel, Body: "fake kernel image"},
			testkit.Entry{Name: "usr/lib/modules/" + testKernel + "/modules.dep", Body: ""},
			testkit.Entry{Name: "usr/lib/modules/" + testKernel + "/modules.builtin", Body: builtin.String()},
		)
	}
	return es
}

// testRepo lays out images/, profiles/ and overlays/ like the repository and imports a base.
type testRepo struct {
	dir, def, out, init string
	cache               *artifact.Cache
}

func newRepo(t *testing.T, base []testkit.Entry, profile string) *testRepo {
	t.Helper()
	testkit.Tool(t, "mksquashfs", "squashfs-tools")
	dir := t.TempDir()
	r := &testRepo{dir: dir, def: filepath.Join(dir, "images/test.yaml"), out: filepath.Join(dir, "out")}
	for _, d := range []string{"images", "profiles", "overlays/base/etc/kiln"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if base != nil {
		tarPath := filepath.Join(dir, "base.tar")
		writeTar(t, tarPath, base)
		if _, err := rootfs.ImportTar(tarPath, filepath.Join(dir, "layout"), "test", time.Unix(0, 0)); err != nil {
			t.Fatal(err)
		}
	}
	write(t, filepath.Join(dir, "overlays/base/etc/kiln/motd"), "from the overlay\n")
	write(t, r.def, `name: test
platform: qemu
base:
  layout: ../layout
  tag: test
disk:
  size: 1GiB
  rootfs: squashfs
formats: [raw]
kernel:
  args: [console=ttyS0]
overlays: [base]
`)
	write(t, filepath.Join(dir, "profiles/worker.yaml"), profile)
	// The initramfs needs a static ELF as /init; busybox-static is one.
	r.init = "/bin/busybox"
	if _, err := os.Stat(r.init); err != nil {
		t.Skip("no static binary to stand in for kiln-init: install busybox-static")
	}
	r.cache = artifact.NewCache(filepath.Join(dir, "cache"))
	return r
}

func write(t *testing.T, p, s string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

func (r *testRepo) lock(t *testing.T) {
	t.Helper()
	def, prof := mustLoad(t, r.def)
	pn := &artifact.Pinner{Cache: r.cache, Resolver: artifact.OCIResolver{}}
	l, _, err := pn.Pin(context.Background(), def, prof, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Write(artifact.LockPath(def)); err != nil {
		t.Fatal(err)
	}
}

func (r *testRepo) bake(t *testing.T) (*Result, error) {
	t.Helper()
	return Bake(context.Background(), Options{Definition: r.def, Role: "worker", OutDir: r.out,
		KilnInit: r.init, Stage1: r.init, Cache: r.cache, Version: "test", Created: time.Unix(0, 0)})
}

// wantBakeError fails the test unless err mentions every part of want and the failed bake
// left nothing behind.
func (r *testRepo) wantBakeError(t *testing.T, err error, want []string) {
	t.Helper()
	if err == nil {
		t.Fatal("bake succeeded")
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not mention %q", err, w)
		}
	}
	r.assertNoOutput(t)
}

// assertNoOutput checks that a failed bake left nothing behind.
func (r *testRepo) assertNoOutput(t *testing.T) {
	t.Helper()
	ents, err := os.ReadDir(r.out)
	if os.IsNotExist(err) {
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		t.Errorf("failed bake left %s in the output directory", e.Name())
	}
}

func serve(t *testing.T, files map[string]string) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, ok := files[req.URL.Path]
		if !ok {
			http.NotFound(w, req)
			return
		}
		w.Write([]byte(body))
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

func sum(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

func TestBakeLaysEverythingIntoTheImage(t *testing.T) {
	url := serve(t, map[string]string{"/tool": "#!/bin/sh\necho tool\n"})
	r := newRepo(t, fakeBase(true), fmt.Sprintf(`role: worker
artifacts:
  - name: tool
    url: %s/tool
    sha256: %s
    dest: /usr/local/bin/tool
    mode: "0755"
units:
  enable: [demo.service]
`, url, sum("#!/bin/sh\necho tool\n")))
	r.lock(t)
	res, err := r.bake(t)
	if err != nil {
		t.Fatal(err)
	}
	raw := filepath.Join(r.out, "test-worker.raw")
	if res.Outputs[0] != raw {
		t.Fatalf("outputs %v, want %s first", res.Outputs, raw)
	}
	parts, esp, err := disk.Read(raw)
	if err != nil {
		t.Fatal(err)
	}
	root, ok := parts.Partition("root-a")
	if !ok {
		t.Fatalf("no root-a partition in %+v", parts.Partitions)
	}
	if !strings.Contains(parts.Cmdline, "root=PARTUUID="+root.GUID) || !strings.Contains(parts.Cmdline, "console=ttyS0") {
		t.Errorf("cmdline %q does not name root-a %s and the definition's args", parts.Cmdline, root.GUID)
	}
	var md nodeimage.Metadata
	if err := json.Unmarshal(esp.ImageJSON, &md); err != nil {
		t.Fatalf("ESP image.json: %v", err)
	}
	if md.Kernel.Version != testKernel || md.Role != "worker" || len(md.Artifacts) != 1 || md.Artifacts[0].SHA256 != sum("#!/bin/sh\necho tool\n") {
		t.Errorf("image.json = %+v", md)
	}
	// The root filesystem holds the base, the artifact, the overlay, kiln-init and the unit link.
	for path, want := range map[string]string{
		"/usr/local/bin/tool":  "echo tool",
		"/etc/kiln/motd":       "from the overlay",
		"/usr/bin/kiln-init":   "BusyBox",
		"/etc/os-release":      "ID=fake",
		"/etc/kiln/image.json": `"role": "worker"`,
	} {
		got := unsquash(t, raw, root.Start, "-cat", path)
		if !strings.Contains(got, want) {
			t.Errorf("%s in root-a = %q, want it to contain %q", path, got, want)
		}
	}
	ls := unsquash(t, raw, root.Start, "-lln")
	for _, want := range []string{
		"lrwxrwxrwx 0/0", "multi-user.target.wants/demo.service -> /usr/lib/systemd/system/demo.service",
		"-rwxr-xr-x 0/0", "squashfs-root/usr/local/bin/tool",
		"drwxrwsr-x 0/8", "squashfs-root/var/mail",
	} {
		if !strings.Contains(ls, want) {
			t.Errorf("root-a listing lacks %q:\n%s", want, ls)
		}
	}
	if _, err := os.Stat(filepath.Join(r.out, "test-worker.json")); err != nil {
		t.Errorf("metadata file: %v", err)
	}

	// The same bake again, into the same directory: the base and the artifact come from the
	// cache (linked, not flattened or copied) and the image is byte for byte the first one,
	// the setgid /var/mail included.
	first, _, err := output.HashFile(raw)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.bake(t); err != nil {
		t.Fatalf("second bake into the same directory: %v", err)
	}
	if ls := unsquash(t, raw, root.Start, "-lln"); !strings.Contains(ls, "drwxrwxrwt 0/0") || !strings.Contains(ls, "drwxrwsr-x 0/8") {
		t.Errorf("the warm bake's /tmp or /var/mail lost its sticky or setgid bit:\n%s", ls)
	}
	if again, _, err := output.HashFile(raw); err != nil || again != first {
		t.Errorf("the warm bake's raw is %s (%v), the cold one's %s: same inputs, other bytes", again, err, first)
	}
	if ents, err := os.ReadDir(filepath.Join(r.cache.Root, "artifact-trees")); err != nil || len(ents) != 1 {
		t.Errorf("artifact-trees holds %d entries (%v), want the tool's one", len(ents), err)
	}
}

func unsquash(t *testing.T, raw string, offset int64, args ...string) string {
	t.Helper()
	a := append([]string{"-o", fmt.Sprint(offset)}, args[0])
	a = append(a, raw)
	a = append(a, args[1:]...)
	out, err := exec.Command("unsquashfs", a...).CombinedOutput()
	if err != nil {
		t.Fatalf("unsquashfs %v: %v\n%s", a, err, out)
	}
	return string(out)
}

func TestBakeRefusesBadInput(t *testing.T) {
	good := "#!/bin/sh\necho tool\n"
	url := serve(t, map[string]string{"/tool": good})
	artifactProfile := func(sha string) string {
		return fmt.Sprintf("role: worker\nartifacts:\n  - name: tool\n    url: %s/tool\n%s    dest: /usr/local/bin/tool\n", url, sha)
	}
	for _, tc := range []struct {
		name    string
		base    []testkit.Entry
		profile string
		lock    bool
		mutate  func(t *testing.T, r *testRepo)
		want    []string
	}{
		{
			name: "wrong sha256", base: fakeBase(true), lock: true,
			profile: artifactProfile("    sha256: " + strings.Repeat("ab", 32) + "\n"),
			want:    []string{`"tool"`, "sha256 mismatch", strings.Repeat("ab", 32), sum(good)},
		},
		{
			name: "unpinned artifact", base: fakeBase(true), lock: false,
			profile: artifactProfile(""),
			want:    []string{"unpinned", "worker.yaml:", `"tool"`, "kiln lock"},
		},
		{
			name: "missing base", base: nil, lock: false,
			profile: "role: worker\n",
			mutate: func(t *testing.T, r *testRepo) {
				write(t, r.def, strings.Replace(testkit.ReadFile(t, r.def), "tag: test", "tag: test\n  digest: sha256:"+strings.Repeat("0", 64), 1))
			},
			want: []string{"layout", "no such file or directory"},
		},
		{
			name: "base without kernel", base: fakeBase(false), lock: true,
			profile: "role: worker\n",
			want:    []string{"base has no kernel", "linux-image"},
		},
		{
			name: "malformed YAML", base: fakeBase(true), lock: false,
			profile: "role: worker\n",
			mutate: func(t *testing.T, r *testRepo) {
				write(t, r.def, "name: test\nplatform: qemu\nbase:\n  layout: ../layout\n   tag: [oops\n")
			},
			want: []string{"test.yaml:5:", "invalid YAML"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRepo(t, tc.base, tc.profile)
			if tc.lock {
				r.lock(t)
			}
			if tc.mutate != nil {
				tc.mutate(t, r)
			}
			_, err := r.bake(t)
			r.wantBakeError(t, err, tc.want)
		})
	}
}

// Every output's sha256 and size in the metadata are the published file's, with the outputs
// hashed in the background while the next format is written (raw listed after a
// conversion, to hash it beside that conversion).
func TestBakeRecordsEachOutputsHash(t *testing.T) {
	r := newRepo(t, fakeBase(true), "role: worker\n")
	write(t, r.def, strings.Replace(testkit.ReadFile(t, r.def), "formats: [raw]", "formats: [qcow2, raw, vhd]", 1))
	r.lock(t)
	if _, err := r.bake(t); err != nil {
		t.Fatal(err)
	}
	var md nodeimage.Metadata
	if err := json.Unmarshal([]byte(testkit.ReadFile(t, filepath.Join(r.out, "test-worker.json"))), &md); err != nil {
		t.Fatal(err)
	}
	var files []string
	for _, o := range md.Outputs {
		files = append(files, o.File)
		p := filepath.Join(r.out, o.File)
		if got := fileSHA256(p); got == "" || got != o.SHA256 || fileSize(p) != o.Size {
			t.Errorf("%s: metadata says sha256 %s, %d bytes; the file has %s, %d bytes", o.File, o.SHA256, o.Size, got, fileSize(p))
		}
	}
	if want := []string{"test-worker.qcow2", "test-worker.raw", "test-worker.vhd"}; !slices.Equal(files, want) {
		t.Errorf("outputs %v, want %v", files, want)
	}
	// The SBOM beside them, named with its hash: kiln's Go modules (this test's build), the
	// two stand-in init binaries (not Go programs) as files, the kernel; the fake base has no
	// dpkg database and the profile no artifact.
	s := md.SBOM
	if s == nil || s.File != "test-worker.spdx.json" || fileSHA256(filepath.Join(r.out, s.File)) != s.SHA256 ||
		s.Packages["file"] != 2 || s.Packages["kernel"] != 1 || s.Packages["go"] == 0 || s.Packages["deb"] != 0 {
		t.Fatalf("metadata sbom = %+v", s)
	}
	if c := s.CycloneDX; c == nil || c.File != "test-worker.cdx.json" || fileSHA256(filepath.Join(r.out, c.File)) != c.SHA256 {
		t.Errorf("metadata sbom.cyclonedx = %+v, want the CycloneDX file beside the outputs with its sha256", c)
	}
}

// TestBakeWaitsForPrune: a bake that starts while kiln cache prune holds the cache says it
// waits, takes nothing from the cache until the prune is done, and then bakes.
func TestBakeWaitsForPrune(t *testing.T) {
	r := newRepo(t, fakeBase(true), "role: worker\n")
	r.lock(t)
	prune, err := holdCache(r.cache.Root, true, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	logs := make(chan string, 100)
	log := slog.New(slog.NewTextHandler(chanWriter(logs), nil))
	done := make(chan error, 1)
	go func() {
		_, err := Bake(context.Background(), Options{Definition: r.def, Role: "worker", OutDir: r.out,
			KilnInit: r.init, Stage1: r.init, Cache: r.cache, Version: "test", Created: time.Unix(0, 0), Log: log})
		done <- err
	}()
	select {
	case l := <-logs:
		if !strings.Contains(l, "waiting for kiln cache prune to finish") {
			t.Fatalf("the bake's first line during a prune: %s", l)
		}
	case err := <-done:
		t.Fatalf("the bake ran during a prune (%v)", err)
	}
	if _, err := os.Stat(r.out); !os.IsNotExist(err) {
		t.Errorf("the waiting bake made its output directory: %v", err)
	}
	prune()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(r.out, "test-worker.raw")); err != nil {
		t.Error(err)
	}
}

// chanWriter sends each write (one log line) to its channel, while there is room.
type chanWriter chan string

func (c chanWriter) Write(p []byte) (int, error) {
	select {
	case c <- string(p):
	default:
	}
	return len(p), nil
}
