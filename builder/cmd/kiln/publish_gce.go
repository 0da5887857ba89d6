package main

import (
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/api/option"

	"github.com/kilnproject/kiln/builder/publish/gce"
	"github.com/kilnproject/kiln/internal/exitcode"
)

// publishGCELong is `kiln publish gce --help`.
const publishGCELong = `Publish gce takes the gce output of a bake (<image>-<role>.tar.gz: disk.raw in a sparse tar,
with <image>-<role>.json beside it), checks its SHA-256 against that metadata, uploads it to
the bucket as gs://B/<name>.tar.gz (--object) in a resumable upload whose CRC32C and MD5
Cloud Storage checks, creates the image N from it (UEFI_COMPATIBLE, VIRTIO_SCSI_MULTIQUEUE,
GVNIC, x86_64, the family and labels given) and waits until it is READY. Then it deletes the
uploaded object, unless --keep-object.

The file is hashed and checked against its metadata before any request: a file that is not
what its metadata says is refused, naming both digests. The image is labelled kiln-sha256
with the first 63 hex digits of the file's SHA-256 (a label value holds 63 characters) and
its description ends with the whole "sha256:<hex>". Publishing the same file again under the
same --name finds that image, READY, with the label and the whole digest at the end of its
description, and prints it without uploading ("reused": true, and "reason"); an image of
another name is never reused, whatever it carries. A --name already taken by an image of
another file (or whose description lacks the whole digest) is an error.

A failure deletes what this publish created (an image left FAILED; the object, only while it
is the generation kiln uploaded, a precondition Cloud Storage checks) or says what is left.
An object that appears at --object during the upload is someone else's: the upload fails
(412) and leaves it alone. If the object is replaced while the image is created, the image
may hold the other bytes: it is deleted and the publish fails. A chunk that fails is sent
again (--chunk-size).

Credentials are Application Default Credentials (GOOGLE_APPLICATION_CREDENTIALS, gcloud auth
application-default login, workload identity, the metadata server). The permissions needed
are listed in docs/publish.md. --storage-endpoint and
--compute-endpoint reach private endpoints or emulators (the API's path is added to a URL
without one); STORAGE_EMULATOR_HOST is honoured as by every Cloud Storage client and sends
no credentials to Cloud Storage. --no-auth sends none to either API, for emulators and test
fakes; a plain-http endpoint is refused without it, so credentials never go in clear text.

-o json prints {"image", "selfLink", "object", "reused", "reason", "provenance"} for the next step of a CI
job; "object" is the gs:// URL the image was made from, empty when it was reused; "reason",
present when the image was reused, says which image it is and why kiln took it for this
file.`

// publishGCEExample is `kiln publish gce`'s examples.
const publishGCEExample = `  kiln bake images/gce.yaml --role worker -o out
  kiln publish gce out/gce-worker.tar.gz --project my-project --bucket my-images \
      --name kiln-worker-20261203 --family kiln-worker --label role=worker -o json
  kiln publish gce out/gce-worker.tar.gz --project my-project --bucket my-images \
      --name kiln-worker-v1-2-0 --key release.pub

  # against a local Cloud Storage emulator and Compute fake
  kiln publish gce out/gce-worker.tar.gz --project p --bucket b --name n --no-auth \
      --storage-endpoint http://127.0.0.1:4443 --compute-endpoint http://127.0.0.1:8080`

// publishGCEOptions are `kiln publish gce`'s flags.
type publishGCEOptions struct {
	o        gce.Options
	labels   []string
	format   string
	chunkMiB int
	noAuth   bool
	key      string
}

func newPublishGCECmd() *cobra.Command {
	var g publishGCEOptions
	cmd := &cobra.Command{
		Use:     "gce IMAGE.tar.gz --project P --bucket B --name N",
		Short:   "Upload a gce image to Cloud Storage and create a Compute Engine image from it",
		Long:    publishGCELong,
		Example: publishGCEExample,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.run(cmd, args[0])
		},
	}
	o := &g.o
	f := cmd.Flags()
	f.StringVar(&o.Project, "project", "", "the Google Cloud project of the image")
	f.StringVar(&o.Bucket, "bucket", "", "the Cloud Storage bucket the tarball is uploaded to")
	f.StringVar(&o.Name, "name", "", "the image's name")
	f.StringVar(&o.Family, "family", "", "the image family")
	f.StringArrayVar(&g.labels, "label", nil, "a label KEY=VALUE on the image (repeatable; lowercase letters, digits, _ and -)")
	f.StringVar(&o.Object, "object", "", "the object's name in the bucket (default <name>.tar.gz)")
	f.BoolVar(&o.KeepObject, "keep-object", false, "keep the uploaded object once the image is created (by default it is deleted)")
	f.IntVar(&g.chunkMiB, "chunk-size", 16, "MiB sent per request of the resumable upload; a failed chunk is sent again")
	f.StringVar(&o.StorageEndpoint, "storage-endpoint", "", "Cloud Storage API endpoint URL (private endpoint, emulator)")
	f.StringVar(&o.ComputeEndpoint, "compute-endpoint", "", "Compute Engine API endpoint URL (private endpoint, fake)")
	f.BoolVar(&g.noAuth, "no-auth", false, "send no credentials (emulators and test fakes only)")
	f.StringVarP(&g.format, "output", "o", "table", "output format: table or json")
	keyFlag(cmd, &g.key)
	for _, name := range []string{"project", "bucket", "name"} {
		_ = cmd.MarkFlagRequired(name)
	}
	return cmd
}

// run checks the flags and publishes the gce image at file.
func (g *publishGCEOptions) run(cmd *cobra.Command, file string) error {
	o := &g.o
	if g.format != "table" && g.format != "json" {
		return exitcode.Usagef("-o: unknown output format %q (want table or json)", g.format)
	}
	if err := gce.CheckImageName(o.Name); err != nil {
		return exitcode.Usagef("--name: %v", err)
	}
	if o.Family != "" {
		if err := gce.CheckImageName(o.Family); err != nil {
			return exitcode.Usagef("--family: %v", err)
		}
	}
	var err error
	if o.Labels, err = gce.ParseLabels(g.labels); err != nil {
		return exitcode.Usagef("--label %v", err)
	}
	if g.chunkMiB < 1 {
		return exitcode.Usagef("--chunk-size: %d MiB, want at least 1", g.chunkMiB)
	}
	endpoints := map[string]*string{"--storage-endpoint": &o.StorageEndpoint, "--compute-endpoint": &o.ComputeEndpoint}
	for flag, ep := range endpoints {
		if err := checkEndpoint(*ep, g.noAuth, "--no-auth"); err != nil {
			return exitcode.Usagef("%s: %v", flag, err)
		}
	}
	if g.noAuth {
		o.ClientOptions = append(o.ClientOptions, option.WithoutAuthentication())
	}
	im, err := gce.Load(file)
	if err != nil {
		return fmt.Errorf("publish gce: %w", err)
	}
	if err := verifyBeforePublish(im, g.key); err != nil {
		return err
	}
	o.ChunkSize, o.Log = g.chunkMiB<<20, slog.Default()
	o.Progress = gceProgress(cmd.ErrOrStderr())
	return publishTo(cmd, &gce.Publisher{Options: *o}, im, g.format)
}

// checkEndpoint refuses an endpoint that is not an http(s) URL, and a plain-http one unless
// plainOK; allowFlag is the flag that allows it (--no-auth, --insecure-http).
func checkEndpoint(ep string, plainOK bool, allowFlag string) error {
	if ep == "" {
		return nil
	}
	u, err := url.Parse(ep)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return fmt.Errorf("%q: want an http(s) URL", ep)
	}
	if u.Scheme == "http" && !plainOK {
		return fmt.Errorf("%q: credentials would go in clear text; use https, or %s for an emulator", ep, allowFlag)
	}
	return nil
}

// gceProgress reports the upload: one line rewritten in place on a terminal, else a log line
// at every tenth of the file.
func gceProgress(stderr io.Writer) func(sent, total int64) {
	start := time.Now()
	tty := isTerminal(stderr)
	var lastTenth int64 = -1
	return func(sent, total int64) {
		rate := float64(sent) / (1 << 20) / max(time.Since(start).Seconds(), 1e-3)
		if tty {
			fmt.Fprintf(stderr, "\ruploaded %.1f of %.1f MiB, %.1f MiB/s ", float64(sent)/(1<<20), float64(total)/(1<<20), rate)
			if sent == total {
				fmt.Fprintln(stderr)
			}
			return
		}
		if tenth := sent * 10 / max(total, 1); tenth != lastTenth {
			lastTenth = tenth
			slog.Info("upload", "sent", sent, "total", total, "MiB/s", float64(int64(rate*10))/10)
		}
	}
}
