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
	"strconv"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/kilnproject/kiln/internal/decompress"
	"github.com/kilnproject/kiln/internal/fetch"
	"github.com/kilnproject/kiln/internal/poll"
)

// download is the image's HTTP response, open for reading.
type download struct {
	resp  *http.Response
	body  *bufio.Reader // the body, each byte hashed as it is read (see hashed)
	kind  decompress.Kind
	ctx   context.Context // the download's; its cause says why it ended early
	watch *fetch.Watchdog
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
		d = &download{resp: resp, ctx: wctx, watch: watch}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("download %s: %w", u.Redacted(), err)
	}
	d.body = bufio.NewReaderSize(io.TeeReader(d.watch.Reader(d.resp.Body), h), 1<<20)
	d.kind, _ = decompress.ByExtension(u.Path)
	d.minSize = max(d.resp.ContentLength, 0)
	if d.kind == decompress.Zstd {
		var zh zstd.Header
		if head, _ := d.body.Peek(zstd.HeaderMaxSize); zh.Decode(head) == nil && zh.HasFCS {
			d.minSize = max(d.minSize, int64(zh.FrameContentSize))
		}
	}
	d.watch.Idle()
	return d, nil
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

func (d *download) close() error {
	err := d.resp.Body.Close()
	d.watch.Stop()
	return err
}

// served describes the length the server announced, for messages.
func (d *download) served() string {
	if d.resp.ContentLength < 0 {
		return "no length given"
	}
	return strconv.FormatInt(d.resp.ContentLength, 10) + " bytes"
}
