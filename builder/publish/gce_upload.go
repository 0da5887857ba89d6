package publish

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"cloud.google.com/go/storage"
)

// upload uploads the tarball as a resumable upload, unless the object already holds the same
// bytes. It reports whether it created the object. The service checks the CRC32C and MD5
// declared up front (sums); the SHA-256 is checked again as the file is read, so a file that
// changes during the upload never becomes an object.
func (p *gcePublisher) upload(ctx context.Context, sums gceSums) (created bool, err error) {
	obj := p.storage.Bucket(p.o.Bucket).Object(p.o.Object)
	attrs, err := obj.Attrs(ctx)
	switch {
	case err == nil && attrs.Size == p.img.Output.Size && attrs.CRC32C == sums.crc32c && bytes.Equal(attrs.MD5, sums.md5):
		p.log.Info("object already holds this file; not uploading it again", "object", p.objectURL())
		return false, nil
	case err == nil:
		return false, fmt.Errorf("%s exists and holds other bytes: delete it or choose another --object", p.objectURL())
	case !errors.Is(err, storage.ErrObjectNotExist):
		return false, apiError("objects.get "+p.objectURL(), err)
	}
	p.log.Info("uploading", "file", p.o.File, "object", p.objectURL(), "bytes", p.img.Output.Size)
	start := time.Now()
	if err := p.write(ctx, obj, sums); err != nil {
		// The object only exists once the last chunk is accepted; delete it in case it was.
		return false, p.dropObject(true, err)
	}
	secs := time.Since(start).Seconds()
	p.log.Info("uploaded", "object", p.objectURL(), "bytes", p.img.Output.Size, "seconds", round2(secs), "MiB/s", round2(float64(p.img.Output.Size)/(1<<20)/secs))
	return true, nil
}

// write streams the file into a new object obj. A failure before the last chunk cancels the
// upload, which leaves no object.
func (p *gcePublisher) write(ctx context.Context, obj *storage.ObjectHandle, sums gceSums) error {
	f, err := os.Open(p.o.File)
	if err != nil {
		return err
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
		return apiError("objects.insert (upload) "+p.objectURL(), err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != p.img.SHA256 {
		cancel()
		w.Close()
		return fmt.Errorf("%s changed while it was uploaded: sha256 %s, want %s", p.o.File, got, p.img.SHA256)
	}
	if err := w.Close(); err != nil {
		return apiError("objects.insert (upload) "+p.objectURL(), err)
	}
	if p.o.Progress != nil {
		p.o.Progress(p.img.Output.Size, p.img.Output.Size)
	}
	return nil
}

// deleteObject deletes the uploaded object; one already gone is not an error.
func (p *gcePublisher) deleteObject() error {
	// Not the publish's context: a cancelled publish still cleans up.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := p.storage.Bucket(p.o.Bucket).Object(p.o.Object).Delete(ctx)
	if err != nil && !errors.Is(err, storage.ErrObjectNotExist) {
		return apiError("objects.delete "+p.objectURL(), err)
	}
	return nil
}

// dropObject deletes the object if this publish created it (created) and returns cause,
// saying the object is left when it could not be deleted.
func (p *gcePublisher) dropObject(created bool, cause error) error {
	if !created {
		return cause
	}
	if err := p.deleteObject(); err != nil {
		return fmt.Errorf("%w (and %s is left: %v)", cause, p.objectURL(), err)
	}
	return cause
}

// round2 is x rounded to two decimals, for logs.
func round2(x float64) float64 { return float64(int64(x*100+0.5)) / 100 }
