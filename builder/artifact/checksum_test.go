package artifact

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kilnproject/kiln/builder/spec"
	"github.com/kilnproject/kiln/internal/testkit"
)

// A release mirror as publishers lay theirs out: files with a checksum beside them in
// dl.k8s.io's form (<file>.sha256, the digest alone) or sha256sum's (<file>.sha256sum), a
// release-wide SHA256SUMS, a file with a wrong checksum beside it and one with none.
func checksumMirror(t *testing.T, files map[string][]byte) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		data, ok := files[strings.TrimPrefix(r.URL.Path, "/")]
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Write(data)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// pinProfile writes a worker profile of the given artifacts (YAML list items) and loads it.
func pinProfile(t *testing.T, artifacts string) (*spec.Definition, *spec.Profile) {
	t.Helper()
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "images"), 0o755)
	os.MkdirAll(filepath.Join(root, "profiles"), 0o755)
	os.WriteFile(filepath.Join(root, "images", "qemu.yaml"), []byte("name: qemu\nplatform: qemu\nbase:\n  layout: ../oci\n  tag: bookworm\n  digest: sha256:"+strings.Repeat("a", 64)+"\n"), 0o644)
	os.WriteFile(filepath.Join(root, "profiles", "worker.yaml"), []byte("role: worker\nartifacts:\n"+artifacts), 0o644)
	def, err := spec.LoadDefinition(filepath.Join(root, "images", "qemu.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	prof, err := def.Profile("worker")
	if err != nil {
		t.Fatal(err)
	}
	return def, prof
}

func TestPinChecksThePublishersChecksum(t *testing.T) {
	kubelet, containerd, crictl, plain := []byte("kubelet v1"), []byte("containerd v2"), []byte("crictl v1"), []byte("no checksum")
	srv := checksumMirror(t, map[string][]byte{
		"v1/kubelet":                     kubelet,
		"v1/kubelet.sha256":              []byte(hexSum(kubelet) + "\n"),
		"v2/containerd.tar.gz":           containerd,
		"v2/containerd.tar.gz.sha256sum": []byte(hexSum(containerd) + "  containerd.tar.gz\n"),
		"v1/crictl.tar.gz":               crictl,
		"v1/SHA256SUMS":                  []byte("# release v1\n" + hexSum(kubelet) + "  kubelet\n" + strings.ToUpper(hexSum(crictl)) + " *bin/crictl.tar.gz\n"),
		"v1/plain":                       plain,
	})
	item := func(name, path, extra string) string {
		return fmt.Sprintf("  - name: %s\n    url: %s/%s\n    dest: /usr/bin/%s\n%s", name, srv.URL, path, name, extra)
	}
	def, prof := pinProfile(t, item("kubelet", "v1/kubelet", "")+item("containerd", "v2/containerd.tar.gz", "")+
		item("crictl", "v1/crictl.tar.gz", "    checksum: "+srv.URL+"/v1/SHA256SUMS\n")+item("plain", "v1/plain", ""))
	pn := &Pinner{Cache: NewCache(t.TempDir())}
	l, notes, err := pn.Pin(context.Background(), def, []*spec.Profile{prof}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{
		"kubelet": srv.URL + "/v1/kubelet.sha256", "containerd": srv.URL + "/v2/containerd.tar.gz.sha256sum",
		"crictl": srv.URL + "/v1/SHA256SUMS", "plain": PinnedByDownload,
	} {
		if e := l.Artifacts["worker/"+name]; e.PinnedFrom != want {
			t.Errorf("%s: pinned from %q, want %q", name, e.PinnedFrom, want)
		}
	}
	if len(notes) != 4 || !strings.HasSuffix(notes[0], ", as the publisher's "+srv.URL+"/v1/kubelet.sha256 says") ||
		!strings.HasSuffix(notes[3], ", no publisher's checksum beside it to check") {
		t.Errorf("notes:\n%s", strings.Join(notes, "\n"))
	}
}

// A checksum that contradicts the download, or a named checksum file that is missing or
// does not list the file, stops kiln lock with the file and the checksum's URL named, and no
// lock is made.
func TestPinRefusesAContradictingChecksum(t *testing.T) {
	kubelet := []byte("kubelet v1")
	other := hexSum([]byte("another kubelet"))
	srv := checksumMirror(t, map[string][]byte{
		"v1/kubelet":        kubelet,
		"v1/kubelet.sha256": []byte(other + "\n"),
		"v2/kubelet":        kubelet,
		"v2/SHA256SUMS":     []byte(hexSum(kubelet) + "  kubectl\n"),
		"v3/kubelet":        kubelet,
		"v3/kubelet.sha256": []byte("not-a-digest\n"),
	})
	for _, tc := range []struct {
		name, path, extra string
		want              []string
	}{
		{"wrong checksum beside", "v1/kubelet", "", []string{srv.URL + "/v1/kubelet hashes to sha256 " + hexSum(kubelet), "publisher's " + srv.URL + "/v1/kubelet.sha256 says " + other}},
		{"named checksum missing", "v1/kubelet", "    checksum: " + srv.URL + "/v1/SHA256SUMS\n", []string{srv.URL + "/v1/SHA256SUMS", "no checksum file there"}},
		{"file not listed", "v2/kubelet", "    checksum: " + srv.URL + "/v2/SHA256SUMS\n", []string{srv.URL + "/v2/SHA256SUMS", "lists no sha256 for kubelet"}},
		{"not a digest", "v3/kubelet", "", []string{srv.URL + "/v3/kubelet.sha256", `line 1: "not-a-digest" is not a sha256`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			def, prof := pinProfile(t, fmt.Sprintf("  - name: kubelet\n    url: %s/%s\n    dest: /usr/bin/kubelet\n%s", srv.URL, tc.path, tc.extra))
			pn := &Pinner{Cache: NewCache(t.TempDir())}
			l, _, err := pn.Pin(context.Background(), def, []*spec.Profile{prof}, nil)
			if err == nil || l != nil {
				t.Fatalf("Pin: %v, %v; want it refused", l, err)
			}
			for _, w := range append(tc.want, "worker.yaml:", "artifact kubelet") {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			var mismatch *ChecksumMismatchError
			if (tc.name == "wrong checksum beside") != errors.As(err, &mismatch) {
				t.Errorf("error %v: a *ChecksumMismatchError only for a contradicting checksum", err)
			}
		})
	}
}

func TestChecksumFor(t *testing.T) {
	sum := hexSum([]byte("x"))
	for _, tc := range []struct {
		name, file, want, err string
	}{
		{"digest alone", sum + "\n", sum, ""},
		{"sha256sum text mode", sum + "  x.tar.gz\n", sum, ""},
		{"sha256sum binary mode, upper case", strings.ToUpper(sum) + " *x.tar.gz\n", sum, ""},
		{"several files, with a directory", hexSum([]byte("y")) + "  y.tar.gz\n" + sum + "  release/x.tar.gz\n", sum, ""},
		{"other file only", sum + "  y.tar.gz\n", "", "lists no sha256 for x.tar.gz"},
		{"empty", "\n", "", "lists no sha256 for x.tar.gz"},
		{"short digest", "abc\n", "", `line 1: "abc" is not a sha256`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := checksumFor([]byte(tc.file), "x.tar.gz")
			if got != tc.want || (err == nil) != (tc.err == "") || (err != nil && !strings.Contains(err.Error(), tc.err)) {
				t.Errorf("checksumFor = %q, %v; want %q, %q", got, err, tc.want, tc.err)
			}
		})
	}
}

// A checksum file the server fails to give at first (a 503, a 500) is fetched again as an
// artifact download would be, and the pin it confirms is recorded; a server that keeps
// failing stops kiln lock naming the checksum's URL and the answer.
func TestPinRetriesTheChecksumFile(t *testing.T) {
	kubelet := []byte("kubelet v1")
	for _, tc := range []struct {
		name     string
		failures int // answers of 503 before the checksum file is served
		want     string
	}{
		{"two failures", 2, ""},
		{"always failing", 100, "503 Service Unavailable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var asked int
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				switch r.URL.Path {
				case "/v1/kubelet":
					w.Write(kubelet)
				case "/v1/kubelet.sha256":
					if asked++; asked <= tc.failures {
						http.Error(w, "busy", http.StatusServiceUnavailable)
						return
					}
					w.Write([]byte(hexSum(kubelet) + "\n"))
				default:
					http.NotFound(w, r)
				}
			}))
			defer srv.Close()
			def, prof := pinProfile(t, fmt.Sprintf("  - name: kubelet\n    url: %s/v1/kubelet\n    dest: /usr/bin/kubelet\n", srv.URL))
			c := NewCache(t.TempDir())
			c.Retry = DownloadRetry{Clock: &testkit.InstantClock{}}
			l, _, err := (&Pinner{Cache: c}).Pin(context.Background(), def, []*spec.Profile{prof}, nil)
			if tc.want != "" {
				if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), srv.URL+"/v1/kubelet.sha256") {
					t.Fatalf("Pin = %v; want an error naming the checksum URL and %q", err, tc.want)
				}
				if asked != 5 {
					t.Errorf("the checksum file was asked for %d times, want the 5 attempts of a download", asked)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := l.Artifacts["worker/kubelet"].PinnedFrom; got != srv.URL+"/v1/kubelet.sha256" || asked != tc.failures+1 {
				t.Errorf("pinned from %q after %d requests, want the checksum file after %d", got, asked, tc.failures+1)
			}
		})
	}
}
