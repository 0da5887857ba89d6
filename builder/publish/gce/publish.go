// Package gce publishes gce bake outputs (a tarball holding disk.raw) as Compute Engine images
// (publish.Publisher): the tarball goes to Cloud Storage in a resumable upload, the image is
// created from it and the object deleted. A second publish of the same file finds the image of
// the requested name by its digest label and description.
package gce

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"regexp"
	"strings"

	"cloud.google.com/go/storage"
	compute "google.golang.org/api/compute/v1"
	"google.golang.org/api/googleapi"
	"google.golang.org/api/option"

	"github.com/kilnproject/kiln/builder/publish"
)

// Options says what kiln publish gce publishes, and where.
type Options struct {
	Project string
	Bucket  string // where the tarball is uploaded
	Object  string // the object's name; default <Name>.tar.gz
	Name    string // the image's name
	Family  string
	Labels  map[string]string // besides DigestLabel, which is set to the file's digest
	// KeepObject keeps the uploaded tarball once the image is created; by default it is deleted.
	KeepObject bool
	// ChunkSize is the size of each request of the resumable upload (rounded up to 256 KiB by
	// the client); a chunk that fails is sent again. Default 16 MiB.
	ChunkSize int

	// StorageEndpoint and ComputeEndpoint override the APIs' endpoints (private endpoints,
	// emulators): a URL, to which the API's path (storage/v1/, compute/v1/) is added when it
	// has none. STORAGE_EMULATOR_HOST is honoured by the storage client when StorageEndpoint
	// is empty.
	StorageEndpoint string
	ComputeEndpoint string
	// ClientOptions are passed to both API clients (credentials, an HTTP client). Without any,
	// the clients take Application Default Credentials.
	ClientOptions []option.ClientOption

	// Progress, when set, is called as the upload goes with the bytes sent and the total.
	Progress func(sent, total int64)
	Log      *slog.Logger

	// file is the gce output being published (Publish sets it from the image).
	file string
	// img is the image Publish was given (its provenance checked or not); nil loads file.
	img *publish.Image
}

// Result is what kiln publish gce made, for the next step of a CI job.
type Result struct {
	Image    string `json:"image"`
	SelfLink string `json:"selfLink"`
	// Object is the gs:// URL of the tarball the image was made from (deleted unless
	// KeepObject), empty when the image was reused.
	Object string `json:"object"`
	Reused bool   `json:"reused"` // the image of this name and digest existed; nothing was uploaded
	// Reason says, when the image was reused, which image it is and why kiln took it for
	// this file.
	Reason string `json:"reason,omitempty"`
	// Provenance is the hex SHA-256 of the signed provenance the file was checked against
	// (kiln publish --key), recorded on an image this run made; empty without a key.
	Provenance string `json:"provenance,omitempty"`
}

// WriteText writes the result as kiln publish gce prints it (publish.Result).
func (res *Result) WriteText(w io.Writer) error {
	fmt.Fprintf(w, "image     %s\nselfLink  %s\n", res.Image, res.SelfLink)
	if res.Object != "" {
		fmt.Fprintf(w, "object    %s\n", res.Object)
	}
	fmt.Fprintf(w, "reused    %t\n", res.Reused)
	if res.Reason != "" {
		fmt.Fprintf(w, "because   %s\n", res.Reason)
	}
	if res.Provenance != "" {
		fmt.Fprintf(w, "provenance verified: sha256:%s\n", res.Provenance)
	}
	return nil
}

// gceArchitecture and gceGuestOSFeatures are what every kiln image is: x86_64, UEFI boot,
// virtio-scsi multiqueue and gVNIC drivers in its initramfs.
const gceArchitecture = "X86_64"

var gceGuestOSFeatures = []string{"UEFI_COMPATIBLE", "VIRTIO_SCSI_MULTIQUEUE", "GVNIC"}

// gcePublisher holds the clients of one publish.
type gcePublisher struct {
	o       Options
	log     *slog.Logger
	storage *storage.Client
	compute *compute.Service
	img     *publish.Image
}

var _ publish.Publisher = (*Publisher)(nil)

// Publisher publishes gce outputs as Compute Engine images (publish.Publisher).
type Publisher struct {
	Options
}

// Publish publishes im, a gce output (see Load), as the GCE image p.Name, or returns the image
// p.Name when an earlier publish made it from the same file (its label and the whole digest in
// its description); an image of another name is never returned. The file is hashed against its
// metadata before any request. It uploads the tarball to Cloud Storage, creates the image from
// it, waits for that, checks that the object is still the generation it uploaded (otherwise
// the image may hold other bytes, and is deleted), and deletes the object unless
// p.KeepObject. A failure deletes what this call created (an object only with the generation
// it made, as a precondition), or its error says what is left. The result is a *Result.
func (p *Publisher) Publish(ctx context.Context, im *publish.Image) (publish.Result, error) {
	o := p.Options
	o.file, o.img = im.Path, im
	res, err := publishFile(ctx, o)
	if err != nil {
		return nil, err
	}
	return res, nil
}

// publishFile publishes o.file; see Publish.
func publishFile(ctx context.Context, o Options) (*Result, error) {
	res, err := publishGCE(ctx, o)
	if err != nil {
		return nil, fmt.Errorf("publish gce: %w", err)
	}
	return res, nil
}

func publishGCE(ctx context.Context, o Options) (*Result, error) {
	if err := o.check(); err != nil {
		return nil, err
	}
	img := o.img
	if img == nil {
		var err error
		if img, err = Load(o.file); err != nil {
			return nil, err
		}
	}
	sums, err := sumFile(o.file)
	if err != nil {
		return nil, err
	}
	if sums.sha256 != img.SHA256 {
		return nil, fmt.Errorf("%s: sha256 %s, its metadata says %s: the file changed since the bake", o.file, sums.sha256, img.SHA256)
	}
	p, err := newGCEPublisher(ctx, o, img)
	if err != nil {
		return nil, err
	}
	defer p.storage.Close()
	if res, err := p.existing(ctx); res != nil || err != nil {
		return res, err
	}
	obj, err := p.upload(ctx, sums)
	if err != nil {
		return nil, err
	}
	res, err := p.createImage(ctx)
	if err != nil {
		return nil, p.dropObject(obj, err)
	}
	if err := p.checkSource(obj); err != nil {
		return nil, p.dropObject(obj, p.dropImage(err))
	}
	if obj.created && !o.KeepObject {
		if err := p.deleteObject(obj.generation); err != nil {
			p.log.Warn("image created; the uploaded object is left", "object", p.objectURL(), "err", err)
		}
	}
	return res, nil
}

// check checks the options and fills in the defaults.
func (o *Options) check() error {
	switch {
	case o.Project == "":
		return errors.New("no project")
	case o.Bucket == "":
		return errors.New("no bucket")
	}
	if err := CheckImageName(o.Name); err != nil {
		return fmt.Errorf("image name: %w", err)
	}
	if o.Family != "" {
		if err := CheckImageName(o.Family); err != nil {
			return fmt.Errorf("family: %w", err)
		}
	}
	for _, l := range []string{DigestLabel, ProvenanceLabel} {
		if _, ok := o.Labels[l]; ok {
			return fmt.Errorf("label %s is set by kiln", l)
		}
	}
	if o.Object == "" {
		o.Object = o.Name + ".tar.gz"
	}
	if o.ChunkSize <= 0 {
		o.ChunkSize = 16 << 20
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	return nil
}

func newGCEPublisher(ctx context.Context, o Options, img *publish.Image) (*gcePublisher, error) {
	sopts, copts := o.ClientOptions, o.ClientOptions
	if o.StorageEndpoint != "" {
		ep, err := apiEndpoint(o.StorageEndpoint, "storage/v1/")
		if err != nil {
			return nil, fmt.Errorf("storage endpoint: %w", err)
		}
		sopts = append(sopts[:len(sopts):len(sopts)], option.WithEndpoint(ep))
	}
	if o.ComputeEndpoint != "" {
		ep, err := apiEndpoint(o.ComputeEndpoint, "compute/v1/")
		if err != nil {
			return nil, fmt.Errorf("compute endpoint: %w", err)
		}
		copts = append(copts[:len(copts):len(copts)], option.WithEndpoint(ep))
	}
	sc, err := storage.NewClient(ctx, sopts...)
	if err != nil {
		return nil, fmt.Errorf("storage client: %w", err)
	}
	cs, err := compute.NewService(ctx, copts...)
	if err != nil {
		sc.Close()
		return nil, fmt.Errorf("compute client: %w", err)
	}
	return &gcePublisher{o: o, log: o.Log, storage: sc, compute: cs, img: img}, nil
}

// apiEndpoint is the endpoint URL ep, with path added when ep has no path.
func apiEndpoint(ep, path string) (string, error) {
	u, err := url.Parse(ep)
	if err != nil {
		return "", err
	}
	if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		return "", fmt.Errorf("%q: want an http(s) URL", ep)
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = "/" + path
	} else if !strings.HasSuffix(u.Path, "/") {
		u.Path += "/"
	}
	return u.String(), nil
}

// objectURL is the gs:// URL of the uploaded tarball.
func (p *gcePublisher) objectURL() string { return "gs://" + p.o.Bucket + "/" + p.o.Object }

// permissionIn finds the permission an API error message names: compute says "Required
// 'compute.images.create' permission", storage "Permission 'storage.objects.create' denied".
var permissionIn = regexp.MustCompile(`'((?:compute|storage|iam)\.[a-zA-Z]+\.[a-zA-Z]+)'`)

// apiError wraps err from the API call named call, naming the permission a 403 lacks when
// the API says which.
func apiError(call string, err error) error {
	var ge *googleapi.Error
	if errors.As(err, &ge) && ge.Code == 403 {
		if m := permissionIn.FindStringSubmatch(ge.Message + " " + ge.Body); m != nil {
			return fmt.Errorf("%s: permission %s denied: %w", call, m[1], err)
		}
		return fmt.Errorf("%s: permission denied (docs/publish.md lists the roles needed): %w", call, err)
	}
	return fmt.Errorf("%s: %w", call, err)
}

// isNotFound reports whether err is an API's 404.
func isNotFound(err error) bool {
	var ge *googleapi.Error
	return errors.As(err, &ge) && ge.Code == 404
}
