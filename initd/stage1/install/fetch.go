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

	"github.com/kilnproject/kiln/initd/source"
	"github.com/kilnproject/kiln/internal/decompress"
	"github.com/kilnproject/kiln/internal/poll"
)

// errStalled ends a download during which no byte arrived for Options.StallTimeout.
var errStalled = errors.New("no data arrived")

// download is the image's HTTP response, open for reading.
type download struct {
	resp   *http.Response
	body   *bufio.Reader // the body, each byte hashed as it is read (see hashed)
	kind   decompress.Kind
	ctx    context.Context // the download's; its cause says why it ended early
	cancel context.CancelCauseFunc
	stall  *time.Timer
	// minSize is the least the decompressed image can be: its size for a raw image served
	// with a length, the size a zstd frame header declares, else the compressed length.
	minSize int64
}

// openImage GETs u, retrying the request (not the body) on network errors, 5xx and 429
// until attempts have been made. The body is read through h (see hashingReader).
func openImage(ctx context.Context, log *slog.Logger, o Options, u *url.URL, h io.Writer) (*download, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	var resp *http.Response
	attempt := 0
	err := poll.Retry(ctx, poll.Options{
		What:    u.Redacted(),
		Backoff: poll.Backoff{Initial: o.RetryPause, Factor: 2, Max: 8 * o.RetryPause},
		Retryable: func(err error) bool {
			var perm *permanentError
			return !errors.As(err, &perm) && attempt < o.Attempts
		},
		OnRetry: func(a poll.Attempt) {
			log.Warn("install: image download failed, retrying", "url", u.Redacted(), "attempt", a.N, "of", o.Attempts, "in", a.Pause, "err", a.Err)
		},
		Clock: o.Clock,
	}, func(ctx context.Context) error {
		attempt++
		var err error
		resp, err = get(ctx, o.HTTPClient, u)
		return err
	})
	if err != nil {
		cancel(nil)
		return nil, fmt.Errorf("download %s (%d attempts): %w", u.Redacted(), attempt, err)
	}
	d := &download{resp: resp, ctx: ctx, cancel: cancel}
	d.stall = time.AfterFunc(o.StallTimeout, func() { cancel(fmt.Errorf("%w for %s", errStalled, o.StallTimeout)) })
	d.stall.Stop()
	d.body = bufio.NewReaderSize(io.TeeReader(&stallReader{r: resp.Body, t: d.stall, after: o.StallTimeout}, h), 1<<20)
	d.kind, _ = decompress.ByExtension(u.Path)
	d.minSize = max(resp.ContentLength, 0)
	if d.kind == decompress.Zstd {
		var zh zstd.Header
		if head, _ := d.body.Peek(zstd.HeaderMaxSize); zh.Decode(head) == nil && zh.HasFCS {
			d.minSize = max(d.minSize, int64(zh.FrameContentSize))
		}
	}
	return d, nil
}

// permanentError is an answer another attempt will not change.
type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

func get(ctx context.Context, client *http.Client, u *url.URL) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, &permanentError{err}
	}
	resp, err := source.SafeRedirects(client).Do(req)
	if err != nil {
		var re *source.RedirectError
		if errors.As(err, &re) {
			return nil, &permanentError{err}
		}
		return nil, err
	}
	if resp.StatusCode == http.StatusOK {
		return resp, nil
	}
	resp.Body.Close()
	err = fmt.Errorf("server answered %s", resp.Status)
	if resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests {
		return nil, err
	}
	return nil, &permanentError{err}
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
	d.stall.Stop()
	err := d.resp.Body.Close()
	d.cancel(nil)
	return err
}

// served describes the length the server announced, for messages.
func (d *download) served() string {
	if d.resp.ContentLength < 0 {
		return "no length given"
	}
	return strconv.FormatInt(d.resp.ContentLength, 10) + " bytes"
}

// stallReader runs t only while a Read waits for the network, so that a slow disk is not
// taken for a stalled server.
type stallReader struct {
	r     io.Reader
	t     *time.Timer
	after time.Duration
}

func (s *stallReader) Read(p []byte) (int, error) {
	s.t.Reset(s.after)
	n, err := s.r.Read(p)
	s.t.Stop()
	return n, err
}
