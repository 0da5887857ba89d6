package install

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/kilnproject/kiln/initd/stage1/liveroot"
	"github.com/kilnproject/kiln/internal/decompress"
	"github.com/kilnproject/kiln/internal/fetch"
	"github.com/kilnproject/kiln/internal/nodeimage"
	"github.com/kilnproject/kiln/internal/poll"
)

// download is the image open for reading: an HTTP response, or a file on the boot medium.
type download struct {
	src io.ReadCloser // the response body or the file
	// length is the size the server announced or the file's, -1 when unknown.
	length int64
	// unmount, when set, unmounts the boot medium the image is read from.
	unmount func() error
	// mediumDev is the device node holding the boot medium, "" for a download.
	mediumDev string
	body      *bufio.Reader // src, each byte hashed as it is read
	kind      decompress.Kind
	ctx       context.Context // the download's; its cause says why it ended early
	watch     *fetch.Watchdog
	// minSize is the least the decompressed image can be: its size for a raw image served
	// with a length, the size a zstd frame header declares, else the compressed length.
	minSize int64
}

// openImage GETs u, retrying the request (not the body) as fetch.Retry does, at most
// o.attempts times. The body is read through h (see hashingReader) and a watchdog that ends
// the download when nothing arrives for o.stallTimeout.
func openImage(ctx context.Context, log *slog.Logger, o Options, u *url.URL, h io.Writer) (*download, error) {
	var d *download
	retry := fetch.Retry{
		Attempts: o.attempts,
		Backoff:  poll.Backoff{Initial: o.retryPause, Factor: 2, Max: 8 * o.retryPause},
		Clock:    o.clock,
		OnRetry: func(a poll.Attempt) {
			log.Warn("install: image download failed, retrying", "url", u.Redacted(), "attempt", a.N, "of", o.attempts, "in", a.Pause, "err", a.Err)
		},
	}
	err := retry.Do(ctx, u.Redacted(), func(ctx context.Context) error {
		wctx, watch := fetch.Watch(ctx, o.stallTimeout)
		resp, err := get(wctx, o.httpClient, u)
		if err != nil {
			err = fetch.Cause(wctx, err)
			watch.Stop()
			return err
		}
		d = &download{src: resp.Body, length: resp.ContentLength, ctx: wctx, watch: watch}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("download %s: %w", u.Redacted(), err)
	}
	d.setup(u.Path, h)
	return d, nil
}

// openMedium waits for the boot medium o.Medium, mounts it and opens the image file on it; the
// medium stays mounted until the download is closed. The file is read through h and a watchdog
// as a download is: a medium that stops answering ends the install after o.stallTimeout.
func openMedium(ctx context.Context, log *slog.Logger, o Options, file string, h io.Writer) (*download, error) {
	what := nodeimage.MediumScheme + file
	dev, unmount, err := liveroot.MountMedium(ctx, log, o.Medium)
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", what, err)
	}
	f, err := os.Open(filepath.Join(o.Medium.MountDir, filepath.FromSlash(file)))
	var fi os.FileInfo
	if err == nil {
		if fi, err = f.Stat(); err == nil && !fi.Mode().IsRegular() {
			err = fmt.Errorf("%s is not a regular file", f.Name())
		}
		if err != nil {
			f.Close()
		}
	}
	if err != nil {
		return nil, errors.Join(fmt.Errorf("image %s on %s: %w", what, dev, err), unmount())
	}
	wctx, watch := fetch.Watch(ctx, o.stallTimeout)
	d := &download{src: f, length: fi.Size(), unmount: unmount, mediumDev: dev, ctx: wctx, watch: watch}
	d.setup(file, h)
	return d, nil
}

// setup reads d.src through h and the watchdog, and works out the compression from the name
// and the least size of the image.
func (d *download) setup(name string, h io.Writer) {
	d.body = bufio.NewReaderSize(io.TeeReader(d.watch.Reader(d.src), h), 1<<20)
	d.kind, _ = decompress.ByExtension(name)
	d.minSize = max(d.length, 0)
	if d.kind == decompress.Zstd {
		var zh zstd.Header
		if head, _ := d.body.Peek(zstd.HeaderMaxSize); zh.Decode(head) == nil && zh.HasFCS {
			d.minSize = max(d.minSize, int64(zh.FrameContentSize))
		}
	}
	d.watch.Idle()
}

func get(ctx context.Context, client *http.Client, u *url.URL) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, fetch.Permanent(err)
	}
	resp, err := fetch.Do(client, req)
	if err != nil {
		return nil, err
	}
	if err := fetch.CheckStatus(resp, time.Now()); err != nil {
		resp.Body.Close()
		return nil, err
	}
	return resp, nil
}

// maxDecoderMemory bounds what decompressing the image may take: a zstd window or an xz
// dictionary over it is refused before it is allocated (decompress.ErrMemoryLimit). Stage 1
// runs from RAM, and the image is only checked against its sha256 once it has been read.
const maxDecoderMemory = 256 << 20

// image returns the decompressed image stream.
func (d *download) image() (io.ReadCloser, error) {
	r, err := decompress.Options{MaxMemory: maxDecoderMemory}.Open(d.body, d.kind)
	if err != nil {
		return nil, fmt.Errorf("open %s stream: %w", d.kind, err)
	}
	return r, nil
}

// finish reads what is left of the body (so every byte served is hashed) and closes it.
func (d *download) finish() error {
	_, err := io.Copy(io.Discard, d.body)
	return errors.Join(err, d.close())
}

// close closes the body or file, once, and unmounts the medium it was on.
func (d *download) close() error {
	if d.src == nil {
		return nil
	}
	err := d.src.Close()
	d.src = nil
	d.watch.Stop()
	if d.unmount != nil {
		err = errors.Join(err, d.unmount())
	}
	return err
}

// served describes the length the server announced or the file's, for messages.
func (d *download) served() string {
	if d.length < 0 {
		return "no length given"
	}
	return strconv.FormatInt(d.length, 10) + " bytes"
}
