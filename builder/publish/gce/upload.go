package gce

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	"cloud.google.com/go/storage"
	"google.golang.org/api/googleapi"
)

// gceObject is the object an image is made from: its generation, and whether this publish
// created it.
type gceObject struct {
	generation int64
	created    bool
}

// upload uploads the tarball as a resumable upload, unless the object already holds the same
// bytes. It returns the object's generation, and whether it created it. The service checks
// the CRC32C and MD5 declared up front (sums); the SHA-256 is checked again as the file is
// read, so a file that changes during the upload never becomes an object.
func (p *gcePublisher) upload(ctx context.Context, sums gceSums) (gceObject, error) {
	obj := p.storage.Bucket(p.o.Bucket).Object(p.o.Object)
	attrs, err := obj.Attrs(ctx)
	switch {
	case err == nil && attrs.Size == p.img.Output.Size && attrs.CRC32C == sums.crc32c && bytes.Equal(attrs.MD5, sums.md5):
		p.log.Info("object already holds this file; not uploading it again", "object", p.objectURL(), "generation", attrs.Generation)
		return gceObject{generation: attrs.Generation}, nil
	case err == nil:
		return gceObject{}, fmt.Errorf("%s exists and holds other bytes: delete it or choose another --object", p.objectURL())
	case !errors.Is(err, storage.ErrObjectNotExist):
		return gceObject{}, apiError("objects.get "+p.objectURL(), err)
	}
	p.log.Info("uploading", "file", p.o.file, "object", p.objectURL(), "bytes", p.img.Output.Size)
	start := time.Now()
	gen, err := p.write(ctx, obj, sums)
	if err != nil {
		return gceObject{}, p.uploadFailed(err)
	}
	secs := time.Since(start).Seconds()
	p.log.Info("uploaded", "object", p.objectURL(), "generation", gen, "bytes", p.img.Output.Size, "seconds", round2(secs), "MiB/s", round2(float64(p.img.Output.Size)/(1<<20)/secs))
	return gceObject{generation: gen, created: true}, nil
}

// write streams the file into a new object obj and returns the object's generation. A failure
// before the last chunk cancels the upload, which leaves no object.
func (p *gcePublisher) write(ctx context.Context, obj *storage.ObjectHandle, sums gceSums) (int64, error) {
	f, err := os.Open(p.o.file)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// storage.ShouldRetry also retries a connection closed before the answer (EOF), which
	// the upload's default does not; the precondition makes every retry safe.
	obj = obj.If(storage.Conditions{DoesNotExist: true}).Retryer(storage.WithErrorFunc(storage.ShouldRetry))
	w := obj.NewWriter(wctx)
	w.ChunkSize = p.o.ChunkSize
	w.CRC32C, w.SendCRC32C, w.MD5 = sums.crc32c, true, sums.md5
	w.ContentType = "application/gzip"
	if p.o.Progress != nil {
		w.ProgressFunc = func(n int64) { p.o.Progress(n, p.img.Output.Size) }
	}
	h := sha256.New()
	if _, err := io.Copy(w, io.TeeReader(f, h)); err != nil {
		cancel()
		w.Close()
		return 0, apiError("objects.insert (upload) "+p.objectURL(), err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != p.img.SHA256 {
		cancel()
		w.Close()
		return 0, fmt.Errorf("%s changed while it was uploaded: sha256 %s, want %s", p.o.file, got, p.img.SHA256)
	}
	if err := w.Close(); err != nil {
		return 0, apiError("objects.insert (upload) "+p.objectURL(), err)
	}
	if p.o.Progress != nil {
		p.o.Progress(p.img.Output.Size, p.img.Output.Size)
	}
	return w.Attrs().Generation, nil
}

// isPreconditionFailed reports whether err is Cloud Storage's 412: a generation precondition
// did not hold.
func isPreconditionFailed(err error) bool {
	var ge *googleapi.Error
	return errors.As(err, &ge) && ge.Code == http.StatusPreconditionFailed
}

// uploadFailed returns cause, the error of an upload that did not finish, saying what is at
// the object's name now. Nothing is deleted: an object there is not one kiln knows it made
// (412: someone else's appeared during the upload; otherwise its generation is unknown).
func (p *gcePublisher) uploadFailed(cause error) error {
	if isPreconditionFailed(cause) {
		return fmt.Errorf("%w: %s was created by someone else during the upload, and is left as it is: choose another --object, or delete it", cause, p.objectURL())
	}
	// Not the publish's context: it may be why the upload stopped.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if attrs, err := p.storage.Bucket(p.o.Bucket).Object(p.o.Object).Attrs(ctx); err == nil {
		return fmt.Errorf("%w (%s exists, generation %d, and is left: kiln cannot tell whether this upload made it)", cause, p.objectURL(), attrs.Generation)
	}
	return cause
}

// checkSource checks that the object the image was made from is still obj's generation: one
// replaced while the image was created may be what the image holds.
func (p *gcePublisher) checkSource(obj gceObject) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	attrs, err := p.storage.Bucket(p.o.Bucket).Object(p.o.Object).Attrs(ctx)
	switch {
	case errors.Is(err, storage.ErrObjectNotExist):
		return fmt.Errorf("%s, generation %d, was deleted while image %s was created from it: kiln cannot tell what the image holds", p.objectURL(), obj.generation, p.o.Name)
	case err != nil:
		return apiError("objects.get "+p.objectURL(), err)
	case attrs.Generation != obj.generation:
		return fmt.Errorf("%s was replaced while image %s was created from it (generation %d, where kiln's is %d): the image may hold other bytes", p.objectURL(), p.o.Name, attrs.Generation, obj.generation)
	}
	return nil
}

// deleteObject deletes the object if it is still the generation this publish uploaded (a
// precondition Cloud Storage checks); one already gone is not an error, one replaced by
// another generation is left and said to be.
func (p *gcePublisher) deleteObject(generation int64) error {
	// Not the publish's context: a cancelled publish still cleans up.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := p.storage.Bucket(p.o.Bucket).Object(p.o.Object).Generation(generation).If(storage.Conditions{GenerationMatch: generation}).Delete(ctx)
	switch {
	case err == nil, errors.Is(err, storage.ErrObjectNotExist):
		return nil
	case isPreconditionFailed(err):
		return fmt.Errorf("objects.delete %s: it is no longer generation %d, the one kiln uploaded, and is left as it is", p.objectURL(), generation)
	}
	return apiError("objects.delete "+p.objectURL(), err)
}

// dropObject deletes obj if this publish created it and returns cause, saying the object is
// left when it could not be deleted.
func (p *gcePublisher) dropObject(obj gceObject, cause error) error {
	if !obj.created {
		return cause
	}
	if err := p.deleteObject(obj.generation); err != nil {
		return fmt.Errorf("%w (and %s is left: %v)", cause, p.objectURL(), err)
	}
	return cause
}

// round2 is x rounded to two decimals, for logs.
func round2(x float64) float64 { return float64(int64(x*100+0.5)) / 100 }
