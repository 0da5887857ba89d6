package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kilnproject/kiln/builder/output"
	"github.com/kilnproject/kiln/builder/publish/gce"
	"github.com/kilnproject/kiln/builder/publish/publishtest"
	"github.com/kilnproject/kiln/internal/exitcode"
)

// gceFakes starts the Cloud Storage emulator with the bucket kiln-images and the Compute
// fake of project kiln-test; both take no credentials, as an emulator reached with --no-auth.
func gceFakes(t *testing.T) (*publishtest.GCS, *publishtest.Compute) {
	t.Setenv("STORAGE_EMULATOR_HOST", "")
	gcs := publishtest.NewGCS(t, "", "kiln-images")
	return gcs, publishtest.NewCompute(t, "", "kiln-test", gcs)
}

// gceTarball makes the gce output of a bake: a 1 GiB disk with 1 MiB of data turned into
// gce-worker.tar.gz by builder/output, and its metadata.
func gceTarball(t *testing.T) string {
	dir := t.TempDir()
	raw := rawDisk(t, dir, "gce-worker", randomAt(1<<30, 512<<10, 0, 48<<20))
	tgz := filepath.Join(dir, "gce-worker.tar.gz")
	if err := output.Convert(context.Background(), raw, "gce", tgz); err != nil {
		t.Fatal(err)
	}
	os.Remove(raw)
	sidecar(t, tgz, "gce", "gce", 1<<30)
	return tgz
}

// kiln publish gce, given the emulator by --storage-endpoint or STORAGE_EMULATOR_HOST, uploads
// the tarball, creates the image from exactly its bytes, prints it, and deletes the object
// unless --keep-object; run again, it prints the same image, reused, and uploads nothing.
func TestPublishGCECommand(t *testing.T) {
	for _, how := range []string{"--storage-endpoint", "STORAGE_EMULATOR_HOST"} {
		t.Run(how, func(t *testing.T) {
			gcs, compute := gceFakes(t)
			tgz := gceTarball(t)
			args := []string{"publish", "gce", tgz, "--project", "kiln-test", "--bucket", "kiln-images", "--name", "kiln-worker-1",
				"--family", "kiln-worker", "--label", "role=worker", "--compute-endpoint", compute.URL(), "--no-auth", "-o", "json"}
			keep := how == "STORAGE_EMULATOR_HOST"
			if keep {
				t.Setenv("STORAGE_EMULATOR_HOST", strings.TrimPrefix(gcs.URL(), "http://"))
				args = append(args, "--keep-object")
			} else {
				args = append(args, "--storage-endpoint", gcs.URL())
			}
			var res gce.Result
			kilnJSON(t, &res, args...)
			im := compute.Image("kiln-worker-1")
			if im == nil || res.Image != im.Name || res.SelfLink != im.SelfLink || res.Object != "gs://kiln-images/kiln-worker-1.tar.gz" || res.Reused {
				t.Fatalf("-o json: %+v; the fake holds %+v", res, im)
			}
			want, _ := os.ReadFile(tgz)
			if !bytes.Equal(compute.Source(im.Name), want) {
				t.Errorf("the image was not made from the bytes of %s", tgz)
			}
			if im.Family != "kiln-worker" || im.Labels["role"] != "worker" || im.Labels[gce.DigestLabel] == "" {
				t.Errorf("image family %q, labels %v", im.Family, im.Labels)
			}
			if objs := gcs.Objects(t, "kiln-images"); keep != (len(objs) == 1) {
				t.Errorf("objects in the bucket after the publish (--keep-object %t): %v", keep, objs)
			}

			starts, _, _ := gcs.Uploads()
			var again gce.Result
			kilnJSON(t, &again, args...)
			if now, _, _ := gcs.Uploads(); !again.Reused || again.Image != res.Image || again.SelfLink != res.SelfLink || now != starts {
				t.Errorf("second publish printed %+v after %d uploads (%d before), want %s reused", again, now, starts, res.Image)
			}
			if res.Reason != "" || !strings.Contains(again.Reason, "image kiln-worker-1 of project kiln-test is READY") {
				t.Errorf("-o json reason %q, then %q: want none, then why the image was reused", res.Reason, again.Reason)
			}
		})
	}
}

// A refused call fails the publish with exit 1, naming the permission, and deletes the object
// it uploaded.
func TestPublishGCECommandFails(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fault func(*publishtest.GCS, *publishtest.Compute)
		want  string
	}{
		{"insert forbidden", func(_ *publishtest.GCS, c *publishtest.Compute) { c.ForbidInsert() }, "permission compute.images.create denied"},
		{"upload forbidden", func(g *publishtest.GCS, _ *publishtest.Compute) { g.Forbid() }, "permission storage.objects.create denied"},
		{"import fails", func(_ *publishtest.GCS, c *publishtest.Compute) { c.FailOperation() }, "IMAGE_IMPORT_ERROR"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gcs, compute := gceFakes(t)
			tc.fault(gcs, compute)
			args := []string{"publish", "gce", gceTarball(t), "--project", "kiln-test", "--bucket", "kiln-images", "--name", "kiln-worker",
				"--storage-endpoint", gcs.URL(), "--compute-endpoint", compute.URL(), "--no-auth", "-o", "json"}
			out, errs, code := runCLI(t, args...)
			if code != exitcode.Failure || out != "" || !strings.Contains(errs, tc.want) {
				t.Errorf("kiln %s: exit %d, stdout %q, stderr %s; want exit %d naming %q", strings.Join(args, " "), code, out, errs, exitcode.Failure, tc.want)
			}
			if objs := gcs.Objects(t, "kiln-images"); len(objs) != 0 {
				t.Errorf("objects left: %v", objs)
			}
			if im := compute.Image("kiln-worker"); im != nil {
				t.Errorf("image left: %s", im.Status)
			}
		})
	}
}
