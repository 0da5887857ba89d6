package gce

import (
	"bytes"
	"context"
	"crypto/md5"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"hash/crc32"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/oauth2"
	compute "google.golang.org/api/compute/v1"
	"google.golang.org/api/option"

	"github.com/kilnproject/kiln/builder/output"
	"github.com/kilnproject/kiln/builder/publish/publishtest"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

const (
	testProject = "kiln-test"
	testBucket  = "kiln-images"
)

// gceOutput bakes what kiln bake leaves for the gce format: a sparse raw disk with data in
// two places (random, so the tarball does not shrink to nothing) turned into
// <dir>/gce-worker.tar.gz by builder/output, and gce-worker.json listing it with its sha256.
func gceOutput(t testing.TB, dataMiB int) string {
	t.Helper()
	dir := t.TempDir()
	raw := filepath.Join(dir, "gce-worker.raw")
	f, err := os.Create(raw)
	if err != nil {
		t.Fatal(err)
	}
	data := make([]byte, dataMiB<<20)
	rand.Read(data)
	for _, off := range []int64{0, 48 << 20} {
		if _, err := f.WriteAt(data[:len(data)/2], off); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Truncate(1 << 30); err != nil { // whole GiB, as the gce definition rounds
		t.Fatal(err)
	}
	f.Close()
	tgz := filepath.Join(dir, "gce-worker.tar.gz")
	if err := output.Convert(context.Background(), raw, "gce", tgz); err != nil {
		t.Fatal(err)
	}
	os.Remove(raw)
	writeSidecar(t, tgz, sha256Of(t, tgz))
	return tgz
}

// writeSidecar writes the bake's <stem>.json for the gce output tgz, recording digest.
func writeSidecar(t testing.TB, tgz, digest string) {
	t.Helper()
	fi, err := os.Stat(tgz)
	if err != nil {
		t.Fatal(err)
	}
	md := nodeimage.Metadata{Name: "gce", Role: "worker", Platform: "gce", Created: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC),
		Outputs: []nodeimage.OutputInfo{{Format: "gce", File: filepath.Base(tgz), Size: fi.Size(), SHA256: digest}}}
	data, _ := json.Marshal(md)
	if err := os.WriteFile(strings.TrimSuffix(tgz, ".tar.gz")+".json", data, 0o644); err != nil {
		t.Fatal(err)
	}
}

func sha256Of(t testing.TB, file string) string {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// gceEnv is the emulator and the compute fake a publish talks to.
type gceEnv struct {
	gcs     *publishtest.GCS
	compute *publishtest.Compute
}

func newGCEEnv(t testing.TB) *gceEnv {
	gcs := publishtest.NewGCS(t, publishtest.GoogleToken, testBucket)
	return &gceEnv{gcs: gcs, compute: publishtest.NewCompute(t, publishtest.GoogleToken, testProject, gcs)}
}

// options publishes file as image name through env, in chunks of 256 KiB.
func (e *gceEnv) options(file, name string) Options {
	return Options{
		file: file, Project: testProject, Bucket: testBucket, Name: name, Family: "kiln-worker",
		Labels: map[string]string{"role": "worker"}, ChunkSize: 256 << 10,
		StorageEndpoint: e.gcs.URL(), ComputeEndpoint: e.compute.URL(),
		ClientOptions: []option.ClientOption{option.WithTokenSource(oauth2.StaticTokenSource(&oauth2.Token{AccessToken: publishtest.GoogleToken}))},
		Log:           slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
}

// The first publish uploads the tarball in several chunks, declaring its CRC32C and MD5 for the
// service to check, creates the image from exactly those bytes with kiln's features and
// labels, and deletes the object (its generation); the second finds the image by its name and
// digest and uploads nothing.
func TestPublishGCE(t *testing.T) {
	env := newGCEEnv(t)
	file := gceOutput(t, 2)
	want, _ := os.ReadFile(file)
	digest := sha256Of(t, file)

	var progress []int64
	o := env.options(file, "kiln-worker-1")
	o.Progress = func(sent, total int64) { progress = append(progress, sent) }
	res, err := publishFile(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if res.Image != "kiln-worker-1" || res.Reused || res.Object != "gs://kiln-images/kiln-worker-1.tar.gz" || !strings.HasSuffix(res.SelfLink, "/global/images/kiln-worker-1") {
		t.Errorf("result %+v", res)
	}
	if got := env.compute.Source("kiln-worker-1"); !bytes.Equal(got, want) {
		t.Errorf("the image was made from %d bytes that differ from the %d of %s", len(got), len(want), file)
	}
	if _, chunks, _ := env.gcs.Uploads(); chunks < 3 || len(progress) < 3 || progress[len(progress)-1] != int64(len(want)) {
		t.Errorf("%d chunks, progress %v: want a resumable upload of %d bytes in several chunks", chunks, progress, len(want))
	}
	crc := make([]byte, 4)
	binary.BigEndian.PutUint32(crc, crc32.Checksum(want, crc32.MakeTable(crc32.Castagnoli)))
	md := md5.Sum(want)
	if d := env.gcs.Declared(); len(d) != 1 || d[0]["crc32c"] != base64.StdEncoding.EncodeToString(crc) || d[0]["md5Hash"] != base64.StdEncoding.EncodeToString(md[:]) {
		t.Errorf("declared checksums %v, want the file's", d)
	}
	im := env.compute.Image("kiln-worker-1")
	if im.Family != "kiln-worker" || im.Labels["role"] != "worker" || im.Labels[DigestLabel] != digest[:63] || !strings.Contains(im.Description, "sha256:"+digest) {
		t.Errorf("image family %q labels %v description %q", im.Family, im.Labels, im.Description)
	}
	if objs := env.gcs.Objects(t, testBucket); len(objs) != 0 {
		t.Errorf("objects left: %v", objs)
	}

	if d := env.gcs.Deletes(); len(d) != 1 || d[0].Get("ifGenerationMatch") == "" || d[0].Get("ifGenerationMatch") != d[0].Get("generation") {
		t.Errorf("object deletes %v, want one, of the generation uploaded, with it as ifGenerationMatch", d)
	}

	starts, _, _ := env.gcs.Uploads()
	inserts := env.compute.Count("POST images/")
	again, err := publishFile(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if !again.Reused || again.Image != "kiln-worker-1" || again.Object != "" || !strings.Contains(again.Reason, "image kiln-worker-1 of project kiln-test is READY") || !strings.Contains(again.Reason, "sha256:"+digest) {
		t.Errorf("second publish: %+v, want kiln-worker-1 reused, and why", again)
	}
	if now, _, _ := env.gcs.Uploads(); now != starts || env.compute.Count("POST images/") != inserts {
		t.Errorf("second publish uploaded (%d→%d) or inserted (%d→%d)", starts, now, inserts, env.compute.Count("POST images/"))
	}
}

// An image is reused only when it has the name asked for, is READY, and carries the file's
// digest in its label and, whole, at the end of its description: another principal's image
// of another name, with the same label and description, is not answered for this file.
func TestPublishGCEReuse(t *testing.T) {
	for _, tc := range []struct {
		name   string
		plant  func(digest string) *compute.Image
		reused bool
		want   string // the error; "" for none
	}{
		{name: "same label and description, another name", plant: func(d string) *compute.Image {
			return &compute.Image{Name: "kiln-planted", Status: "READY", Labels: map[string]string{DigestLabel: d[:63]}, Description: "kiln image; sha256:" + d}
		}},
		{name: "the name, READY, label and description", reused: true, plant: func(d string) *compute.Image {
			return &compute.Image{Name: "kiln-worker", Status: "READY", Labels: map[string]string{DigestLabel: d[:63]}, Description: "kiln image; sha256:" + d}
		}},
		{name: "the name and label, the description another digest", want: "made from another file", plant: func(d string) *compute.Image {
			other := d[:63] + map[bool]string{true: "1", false: "0"}[d[63] == '0']
			return &compute.Image{Name: "kiln-worker", Status: "READY", Labels: map[string]string{DigestLabel: d[:63]}, Description: "kiln image; sha256:" + other}
		}},
		{name: "the name and label, no description", want: "made from another file", plant: func(d string) *compute.Image {
			return &compute.Image{Name: "kiln-worker", Status: "READY", Labels: map[string]string{DigestLabel: d[:63]}}
		}},
		{name: "the name, not READY", want: "is PENDING", plant: func(d string) *compute.Image {
			return &compute.Image{Name: "kiln-worker", Status: "PENDING", Labels: map[string]string{DigestLabel: d[:63]}, Description: "kiln image; sha256:" + d}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := newGCEEnv(t)
			file := gceOutput(t, 1)
			digest := sha256Of(t, file)
			planted := tc.plant(digest)
			env.compute.PutImage(planted)
			res, err := publishFile(context.Background(), env.options(file, "kiln-worker"))
			if tc.want != "" {
				if err == nil || !strings.Contains(err.Error(), tc.want) || starts(env) != 0 || env.compute.Count("POST images/") != 0 {
					t.Fatalf("publish = %+v, %v, %d uploads, %d inserts; want %q before any upload", res, err, starts(env), env.compute.Count("POST images/"), tc.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if res.Image != "kiln-worker" || res.Reused != tc.reused || tc.reused != (res.Reason != "") {
				t.Errorf("publish = %+v, want kiln-worker, reused %t", res, tc.reused)
			}
			if !tc.reused {
				want, _ := os.ReadFile(file)
				if !bytes.Equal(env.compute.Source("kiln-worker"), want) || env.compute.Image(planted.Name).Labels[DigestLabel] != digest[:63] {
					t.Errorf("kiln-worker not made from %s, or %s touched", file, planted.Name)
				}
			}
		})
	}
}

// A file that differs from its metadata is refused before any request, even when an image of
// the metadata's digest exists under the name.
func TestPublishGCEHashesFirst(t *testing.T) {
	env := newGCEEnv(t)
	file := gceOutput(t, 1)
	digest := sha256Of(t, file)
	env.compute.PutImage(&compute.Image{Name: "kiln-worker", Status: "READY", Labels: map[string]string{DigestLabel: digest[:63]}, Description: "kiln image; sha256:" + digest})
	fh, _ := os.OpenFile(file, os.O_WRONLY, 0)
	fh.WriteAt([]byte("not what was baked"), 1000)
	fh.Close()
	res, err := publishFile(context.Background(), env.options(file, "kiln-worker"))
	if err == nil || !strings.Contains(err.Error(), file) || !strings.Contains(err.Error(), "its metadata says "+digest) {
		t.Fatalf("publish of a file that differs from its metadata = %+v, %v; want refused, naming it and both digests", res, err)
	}
	if n, m := env.gcs.Requests(), env.compute.Count(""); n+m != 0 {
		t.Errorf("%d Cloud Storage and %d Compute requests, want none", n, m)
	}
}

// An object another client writes at the upload's name is never deleted: not when it appears
// during the upload (the upload's precondition fails with 412), nor when it replaces the
// uploaded one while the image is created (the image, which may hold its bytes, is deleted,
// and the delete of the object is conditional on the generation kiln uploaded).
func TestPublishGCEObjectRace(t *testing.T) {
	theirs := []byte("another client's object")
	for _, tc := range []struct {
		name  string
		race  func(env *gceEnv)
		want  string
		image bool // images.insert was called
	}{
		{name: "412 during the upload", want: "was created by someone else during the upload, and is left as it is",
			race: func(env *gceEnv) { env.gcs.RaceObject(testBucket, "kiln-worker.tar.gz", theirs) }},
		{name: "replaced while the image is created", want: "was replaced while image kiln-worker was created from it", image: true,
			race: func(env *gceEnv) { env.compute.ReplaceSource(theirs) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := newGCEEnv(t)
			tc.race(env)
			res, err := publishFile(context.Background(), env.options(gceOutput(t, 1), "kiln-worker"))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("publish = %+v, %v; want an error with %q", res, err, tc.want)
			}
			t.Log(err)
			if got, err := env.gcs.Object(testBucket, "kiln-worker.tar.gz"); err != nil || !bytes.Equal(got, theirs) {
				t.Errorf("the other client's object = %q, %v; want it left", got, err)
			}
			if im := env.compute.Image("kiln-worker"); im != nil {
				t.Errorf("image left, made from %q", env.compute.Source("kiln-worker"))
			}
			if n := env.compute.Count("POST images/"); (n == 1) != tc.image {
				t.Errorf("%d images.insert calls", n)
			}
			for _, d := range env.gcs.Deletes() {
				if d.Get("ifGenerationMatch") == "" {
					t.Errorf("an object delete without ifGenerationMatch: %v", d)
				}
			}
		})
	}
}

// A chunk that fails (the service answers 503, the connection drops while it is sent or
// before the answer) is sent again and the
// object still arrives byte for byte; --keep-object leaves it.
func TestPublishGCEResumes(t *testing.T) {
	for _, fault := range []publishtest.GCSFault{publishtest.GCS503, publishtest.GCSCut, publishtest.GCSDrop} {
		t.Run(string(fault), func(t *testing.T) {
			env := newGCEEnv(t)
			env.gcs.Fail(fault, 2)
			file := gceOutput(t, 2)
			o := env.options(file, "kiln-worker")
			o.KeepObject = true
			if _, err := publishFile(context.Background(), o); err != nil {
				t.Fatal(err)
			}
			want, _ := os.ReadFile(file)
			obj, err := env.gcs.Object(testBucket, "kiln-worker.tar.gz")
			if err != nil {
				t.Fatal(err)
			}
			if _, _, faulted := env.gcs.Uploads(); !faulted || !bytes.Equal(obj, want) {
				t.Errorf("fault injected %v; object %d bytes, file %d: differ", faulted, len(obj), len(want))
			}
		})
	}
}

// Failures leave nothing behind and say what failed.
func TestPublishGCEFails(t *testing.T) {
	tests := []struct {
		name    string
		setup   func(t testing.TB, env *gceEnv, o *Options)
		wantErr string
		inserts int // images.insert calls expected
	}{
		{
			name:    "insert forbidden",
			setup:   func(_ testing.TB, env *gceEnv, _ *Options) { env.compute.ForbidInsert() },
			wantErr: "images.insert kiln-worker: permission compute.images.create denied",
			inserts: 1,
		},
		{
			name:    "upload forbidden",
			setup:   func(_ testing.TB, env *gceEnv, _ *Options) { env.gcs.Forbid() },
			wantErr: "permission storage.objects.create denied",
		},
		{
			name:    "operation fails",
			setup:   func(_ testing.TB, env *gceEnv, _ *Options) { env.compute.FailOperation() },
			wantErr: "IMAGE_IMPORT_ERROR: Image import failed",
			inserts: 1,
		},
		{
			name: "sha256 differs from the metadata",
			setup: func(t testing.TB, _ *gceEnv, o *Options) {
				writeSidecar(t, o.file, strings.Repeat("ab", 32))
			},
			wantErr: "the file changed since the bake",
		},
		{
			name: "corrupted on the way",
			setup: func(_ testing.TB, env *gceEnv, o *Options) {
				o.ChunkSize = 64 << 20 // one request, whose MD5 and CRC32C the emulator checks
				env.gcs.Fail(publishtest.GCSCorrupt, 1)
			},
			wantErr: "doesn't match calculated",
		},
		{
			name: "name taken by another image",
			setup: func(_ testing.TB, env *gceEnv, _ *Options) {
				env.compute.PutImage(&compute.Image{Name: "kiln-worker", Status: "READY", Labels: map[string]string{DigestLabel: "0123"}})
			},
			wantErr: "--name kiln-worker: image exists in project kiln-test, made from another file",
		},
		{
			name: "not the gce format",
			setup: func(_ testing.TB, _ *gceEnv, o *Options) {
				o.file = strings.TrimSuffix(o.file, ".tar.gz") + ".qcow2"
			},
			wantErr: "a qcow2 output; GCE takes the gce format",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := newGCEEnv(t)
			o := env.options(gceOutput(t, 1), "kiln-worker")
			tt.setup(t, env, &o)
			_, err := publishFile(context.Background(), o)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
			}
			t.Log(err)
			if objs := env.gcs.Objects(t, testBucket); len(objs) != 0 {
				t.Errorf("objects left: %v", objs)
			}
			if im := env.compute.Image("kiln-worker"); im != nil && im.Status != "READY" {
				t.Errorf("image left: %s", im.Status)
			}
			if n := env.compute.Count("POST images/"); n != tt.inserts {
				t.Errorf("%d images.insert calls, want %d", n, tt.inserts)
			}
		})
	}
}

// starts is how many uploads env's emulator saw start.
func starts(env *gceEnv) int {
	n, _, _ := env.gcs.Uploads()
	return n
}

// An object already at the upload's name is used when it holds the same bytes (and left, as
// this publish did not create it), and refused untouched when it holds others.
func TestPublishGCEObjectExists(t *testing.T) {
	for _, same := range []bool{true, false} {
		t.Run(map[bool]string{true: "same bytes", false: "other bytes"}[same], func(t *testing.T) {
			env := newGCEEnv(t)
			file := gceOutput(t, 1)
			content, _ := os.ReadFile(file)
			if !same {
				content = []byte("another image")
			}
			env.gcs.PutObject(testBucket, "kiln-worker.tar.gz", content)
			res, err := publishFile(context.Background(), env.options(file, "kiln-worker"))
			switch {
			case same && (err != nil || res.Reused || starts(env) != 0):
				t.Errorf("publish over the same bytes: %+v, %v, %d uploads; want the image made without uploading", res, err, starts(env))
			case !same && (err == nil || !strings.Contains(err.Error(), "exists and holds other bytes")):
				t.Errorf("publish over other bytes: %v, want refused", err)
			}
			obj, err := env.gcs.Object(testBucket, "kiln-worker.tar.gz")
			if err != nil || !bytes.Equal(obj, content) {
				t.Errorf("the object was not left as it was: %v", err)
			}
		})
	}
}
