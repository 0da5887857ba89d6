package install

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"math/bits"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kilnproject/kiln/internal/testkit"
)

// server serves files by path, optionally failing the first requests or cutting bodies short.
type server struct {
	*httptest.Server
	files    map[string][]byte
	failures atomic.Int32 // this many requests answer 503 first
	cut      int          // when > 0, a body stops after this many bytes (with the full length announced)
	stall    bool         // after cut bytes, the server keeps the connection open and sends nothing
	requests atomic.Int32
}

func newServer(t *testing.T) *server {
	s := &server{files: map[string][]byte{}}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.requests.Add(1)
		if s.failures.Add(-1) >= 0 {
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return
		}
		b, ok := s.files[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Length", fmt.Sprint(len(b)))
		if s.cut > 0 {
			w.Write(b[:s.cut])
			if s.stall {
				w.(http.Flusher).Flush()
				<-r.Context().Done()
			}
			return
		}
		w.Write(b)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *server) url(t *testing.T, name string) *url.URL {
	u, err := url.Parse(s.URL + "/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// nodeConfigIgn is an Ignition config writing a node config whose etcd volume has the serial.
func nodeConfigIgn(serial string) []byte {
	node := "cluster: {name: prod, dnsZone: example.com}\nrole: etcd\netcd: {member: a, members: [a], volume: {serial: " + serial + ", minSize: 0}}\n"
	return []byte(`{"ignition":{"version":"3.4.0"},"storage":{"files":[{"path":"/etc/kiln/node.yaml","mode":384,` +
		`"contents":{"source":"data:;base64,` + base64.StdEncoding.EncodeToString([]byte(node)) + `"}}]}}`)
}

// logBuffer is a logger writing into a buffer the test can read.
func logBuffer() (*slog.Logger, *bytes.Buffer) {
	var b bytes.Buffer
	return slog.New(slog.NewTextHandler(&b, nil)), &b
}

func testOpts(t *testing.T) Options {
	return Options{host: host{sysBlock: t.TempDir()}, retryPause: time.Millisecond, clock: &testkit.InstantClock{},
		progressEvery: time.Millisecond, DiskWait: 200 * time.Millisecond}
}

// TestInstall: an image served plain, zstd- or xz-compressed is installed to a blank disk
// bigger than it or exactly its size, and to a disk holding an earlier install with wipe: the
// disk then has the image's GPT and root-a, and its boot entry has kiln.config.url=.
func TestInstall(t *testing.T) {
	img := makeImage(t)
	srv := newServer(t)
	srv.files["/config.ign"] = nodeConfigIgn("etcd-main")
	tests := []struct {
		name     string
		compress string // "" raw, else a file suffix
		diskSize int64
		earlier  bool // the disk holds an earlier install (kiln.install.wipe=1)
	}{
		{name: "raw", diskSize: 64 * mib},
		{name: "zstd", compress: "zst", diskSize: 64 * mib},
		{name: "xz", compress: "xz", diskSize: 64 * mib},
		{name: "disk the image's size", diskSize: imageSize},
		{name: "over an earlier install with wipe", compress: "zst", diskSize: 80 * mib, earlier: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			name, served := "metal-worker.raw", img.raw
			if tt.compress != "" {
				name, served = name+"."+tt.compress, testkit.Compress(t, tt.compress, img.raw)
			}
			srv.files["/"+name] = served
			target := sparseDisk(t, tt.diskSize)
			if tt.earlier {
				if _, err := install(context.Background(), slog.New(slog.DiscardHandler), params{dev: target, imageURL: srv.url(t, name), sha256: sha(served)}, testOpts(t)); err != nil {
					t.Fatal(err)
				}
			}
			log, logs := logBuffer()
			configURL := srv.URL + "/config.ign"
			p := params{dev: target, imageURL: srv.url(t, name), sha256: sha(served), configURL: configURL, wipe: tt.earlier}
			res, err := install(context.Background(), log, p, testOpts(t))
			if err != nil {
				t.Fatalf("Install: %v\nlog:\n%s", err, logs)
			}
			assertInstalled(t, target, img, testOptions+" kiln.config.url="+configURL)
			assertESPClean(t, target, img)
			want := fmt.Sprintf("kiln-init: installed %s to %s (56 MiB, sha256 ok); rebooting", name, target)
			if got := installedLine(res); got != want {
				t.Errorf("console line %q, want %q", got, want)
			}
			if !strings.Contains(logs.String(), "msg=\"install: progress\" MiB=") {
				t.Errorf("no progress in the log:\n%s", logs)
			}
		})
	}
}

// TestInstallFails: whatever goes wrong after the disk was touched, the disk is left without a
// valid GPT, primary or backup, even where it held a bootable install before, and the error
// says why and that the disk does not boot.
func TestInstallFails(t *testing.T) {
	img := makeImage(t)
	zst := testkit.Compress(t, "zst", img.raw)
	xz := testkit.Compress(t, "xz", img.raw) // xz announces no size: only the stream tells
	hugeDict := xzHugeDict(xz)
	tests := []struct {
		name     string
		file     string
		data     []byte
		sum      string
		cut      int
		stall    bool
		diskSize int64
		wantErr  string
	}{
		{name: "checksum mismatch", file: "img.raw", data: img.raw, sum: sha([]byte("other")), diskSize: 64 * mib, wantErr: "sha256 mismatch"},
		{name: "checksum mismatch, disk the image's size", file: "img.raw", data: img.raw, sum: sha([]byte("other")), diskSize: imageSize, wantErr: "sha256 mismatch"},
		{name: "checksum mismatch, zstd", file: "img.raw.zst", data: zst, sum: sha(img.raw), diskSize: 64 * mib, wantErr: "sha256 mismatch"},
		{name: "short stream", file: "img.raw", data: img.raw, sum: sha(img.raw), cut: 30 * mib, diskSize: 64 * mib, wantErr: "download cut short after"},
		{name: "short zstd stream", file: "img.raw.zst", data: zst, sum: sha(zst), cut: len(zst) / 2, diskSize: 64 * mib, wantErr: "download cut short"},
		{name: "stalled stream", file: "img.raw.zst", data: zst, sum: sha(zst), cut: len(zst) / 2, stall: true, diskSize: 64 * mib, wantErr: "no data arrived for 300ms"},
		{name: "image larger than the disk", file: "img.raw.xz", data: xz, sum: sha(xz), diskSize: 48 * mib, wantErr: "the image is larger than the disk (48 MiB)"},
		{name: "xz asking for a 1 GiB dictionary", file: "img.raw.xz", data: hugeDict, sum: sha(hugeDict), diskSize: 64 * mib,
			wantErr: "xz: block 1 needs a 1024 MiB dictionary (over the decoder's memory bound of 256 MiB)"},
		{name: "not a disk image", file: "img.raw", data: bytes.Repeat([]byte("x"), 3*mib), sum: sha(bytes.Repeat([]byte("x"), 3*mib)), diskSize: 64 * mib, wantErr: "the image has no valid GPT"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := newServer(t)
			srv.files["/ok.raw"] = img.raw
			srv.files["/"+tt.file] = tt.data
			// An earlier, bootable install is on the disk: wipe lets the installer at it.
			target := sparseDisk(t, tt.diskSize)
			if tt.diskSize >= imageSize {
				if _, err := install(context.Background(), slog.New(slog.DiscardHandler), params{dev: target, imageURL: srv.url(t, "ok.raw"), sha256: sha(img.raw)}, testOpts(t)); err != nil {
					t.Fatal(err)
				}
			}
			srv.cut, srv.stall = tt.cut, tt.stall
			p := params{dev: target, imageURL: srv.url(t, tt.file), sha256: tt.sum, wipe: true}
			o := testOpts(t)
			o.stallTimeout = 300 * time.Millisecond
			_, err := install(context.Background(), slog.New(slog.DiscardHandler), p, o)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !strings.Contains(err.Error(), "does not boot") {
				t.Fatalf("Install error = %v, want one with %q that says the disk does not boot", err, tt.wantErr)
			}
			assertUnbootable(t, target)
			b, _ := os.ReadFile(target)
			if bytes.Contains(b, []byte("EFI PART")) {
				t.Errorf("a GPT header is left somewhere on the disk")
			}
		})
	}
}

// xzHugeDict is the xz file with its first block's LZMA2 dictionary declared as 1 GiB (and
// the block header's CRC32 made right): a file of a few hundred KiB that makes a decoder
// without a memory bound allocate and fill a gigabyte.
func xzHugeDict(file []byte) []byte {
	file = bytes.Clone(file)
	h := file[12 : 12+(int(file[12])+1)*4]       // the first block header, after the stream header
	i, fields := 2, 2+bits.OnesCount8(h[1]&0xc0) // the sizes given, the filter ID, its properties' size
	for ; fields > 0; i++ {
		if h[i]&0x80 == 0 {
			fields--
		}
	}
	h[i] = 36 // LZMA2's dictionary property: 2 << (36/2 + 11) bytes
	binary.LittleEndian.PutUint32(h[len(h)-4:], crc32.ChecksumIEEE(h[:len(h)-4]))
	return file
}

// TestInstallRefusesSmallDisk: a disk smaller than the image's announced size (a raw image's
// length) is refused before anything is written.
func TestInstallRefusesSmallDisk(t *testing.T) {
	img := makeImage(t)
	srv := newServer(t)
	srv.files["/img.raw"] = img.raw
	for name, sum := range map[string]string{"img.raw": sha(img.raw)} {
		t.Run(name, func(t *testing.T) {
			target := sparseDisk(t, 48*mib)
			writeAtFile(t, target, 600*1024, "data before")
			before := fileSHA(t, target)
			_, err := install(context.Background(), slog.New(slog.DiscardHandler), params{dev: target, imageURL: srv.url(t, name), sha256: sum, wipe: true}, testOpts(t))
			if !errors.Is(err, errNoTarget) || !strings.Contains(err.Error(), "is smaller than the image (at least 56 MiB)") {
				t.Fatalf("Install error = %v", err)
			}
			if fileSHA(t, target) != before {
				t.Error("the disk changed")
			}
		})
	}
}

func writeAtFile(t *testing.T, p string, off int64, s string) {
	t.Helper()
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt([]byte(s), off); err != nil {
		t.Fatal(err)
	}
}

// TestInstallRefusesData: a disk holding data is left as it was unless kiln.install.wipe=1, and
// the refusal names what the disk holds: an ext4 filesystem holding a file, and a disk that
// was installed before (a second network boot with the same parameters).
func TestInstallRefusesData(t *testing.T) {
	img := makeImage(t)
	srv := newServer(t)
	srv.files["/img.raw"] = img.raw
	p := func(dev string) params {
		return params{dev: dev, imageURL: srv.url(t, "img.raw"), sha256: sha(img.raw)}
	}
	tests := []struct {
		name  string
		make  func(t *testing.T) string
		holds string
	}{
		{name: "ext4 holding a file", holds: "holds ext4", make: func(t *testing.T) string {
			d := sparseDisk(t, 64*mib)
			testkit.Run(t, testkit.Tool(t, "mkfs.ext4", "e2fsprogs"), "-q", "-F", d)
			f := filepath.Join(t.TempDir(), "precious")
			if err := os.WriteFile(f, []byte("precious data\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			testkit.Run(t, testkit.Tool(t, "debugfs", "e2fsprogs"), "-w", "-R", "write "+f+" precious", d)
			return d
		}},
		{name: "installed before", holds: "holds gpt;", make: func(t *testing.T) string {
			d := sparseDisk(t, 64*mib)
			if _, err := install(context.Background(), slog.New(slog.DiscardHandler), p(d), testOpts(t)); err != nil {
				t.Fatal(err)
			}
			return d
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := tt.make(t)
			before := fileSHA(t, d)
			_, err := install(context.Background(), slog.New(slog.DiscardHandler), p(d), testOpts(t))
			if !errors.Is(err, errNoTarget) || !strings.Contains(err.Error(), tt.holds) || !strings.Contains(err.Error(), "without kiln.install.wipe=1") ||
				!strings.Contains(err.Error(), "boot order to disk first") {
				t.Errorf("Install error = %v, want a refusal naming %q, wipe and the boot order", err, tt.holds)
			}
			if fileSHA(t, d) != before {
				t.Error("the refused disk changed")
			}
		})
	}
}

// TestInstallRetries: the image's request is retried on 503 up to Options.attempts; a 404
// fails at once. Nothing is written when the image cannot be fetched.
func TestInstallRetries(t *testing.T) {
	img := makeImage(t)
	tests := []struct {
		name      string
		failures  int32
		file      string
		wantErr   string
		wantTries int32
	}{
		{name: "two 503s", failures: 2, file: "img.raw", wantTries: 3},
		{name: "too many 503s", failures: 10, file: "img.raw", wantErr: "server answered 503 Service Unavailable (gave up after 5 attempts)", wantTries: 5},
		{name: "404", file: "nope.raw", wantErr: "nope.raw: server answered 404 Not Found", wantTries: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := newServer(t)
			srv.files["/img.raw"] = img.raw
			srv.failures.Store(tt.failures)
			target := sparseDisk(t, 64*mib)
			_, err := install(context.Background(), slog.New(slog.DiscardHandler), params{dev: target, imageURL: srv.url(t, tt.file), sha256: sha(img.raw)}, testOpts(t))
			if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Fatalf("Install error = %v, want %q", err, tt.wantErr)
			}
			if n := srv.requests.Load(); n != tt.wantTries {
				t.Errorf("%d requests, want %d", n, tt.wantTries)
			}
			if tt.wantErr != "" && fileSHA(t, target) != sha(make([]byte, 64*mib)) {
				t.Error("the disk was written")
			}
		})
	}
}
