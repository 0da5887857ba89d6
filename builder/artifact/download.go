package artifact

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"syscall"
	"time"

	"github.com/kilnproject/kiln/internal/fetch"
	"github.com/kilnproject/kiln/internal/poll"
)

// DownloadRetry says how an http(s) artifact download, or the body of a registry blob, is
// retried, as fetch.Retry does. The zero value makes up to 5 attempts, pausing about 1, 2, 4
// and 8 seconds between them (fetch.DefaultBackoff), on the wall clock. A 429 or 503
// answer's Retry-After (seconds or an HTTP date) sets the pause that follows it instead, up
// to the backoff's Max (30 seconds when it has none).
type DownloadRetry struct {
	// Attempts bounds the requests of one download; 0 means 5, 1 never retries.
	Attempts int
	// Backoff sets the pauses; the zero value means fetch.DefaultBackoff.
	Backoff poll.Backoff
	// Clock times the pauses; nil means the wall clock.
	Clock poll.Clock
}

func (r DownloadRetry) attempts() int {
	if r.Attempts > 0 {
		return r.Attempts
	}
	return 5
}

func (r DownloadRetry) now() time.Time {
	if r.Clock != nil {
		return r.Clock.Now()
	}
	return time.Now()
}

// cutShort reports whether err, from reading a response body, is the connection failing or
// the download stalling (ctx, the attempt's context, ended): worth another attempt, unlike a
// body that arrived whole and failed a check.
func cutShort(ctx context.Context, err error) bool {
	var ne net.Error
	return context.Cause(ctx) != nil || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.As(err, &ne)
}

// download fetches url into w, retrying transient failures as c.Retry says. A retry after
// some bytes arrived asks for the rest (Range: bytes=N-, with If-Range naming the version
// those bytes came from); a server that answers with the whole file instead (200: it ignores
// Range, or the file changed) is read from the start again. w's hash covers what w holds,
// so the caller's check is over the whole file however many attempts made it. A 4xx other
// than 408 and 429, or a failure to write the cache, ends the download at once.
func (c *Cache) download(ctx context.Context, url string, w *blobFile) error {
	d := &download{c: c, url: url, w: w}
	return c.retry(ctx, url, func() int64 { return w.n }, d.attempt)
}

// retry runs op, a request to url, as fetch.Retry does with c.Retry's attempts, backoff and
// clock: until it succeeds or fails with an error marked fetch.Permanent. Each retry is
// logged with the URL, the attempt, its error, the pause before the next one and, when have
// is set, the bytes kept for a resume.
func (c *Cache) retry(ctx context.Context, url string, have func() int64, op func(context.Context) error) error {
	attempts := c.Retry.attempts()
	retry := fetch.Retry{
		Attempts: attempts,
		Backoff:  c.Retry.Backoff,
		Clock:    c.Retry.Clock,
		OnRetry: func(a poll.Attempt) {
			attrs := []any{"url", url, "attempt", a.N, "of", attempts, "error", a.Err, "next", a.Pause.Round(time.Millisecond)}
			if have != nil {
				attrs = append(attrs, "have", have())
			}
			c.logger().Warn("download failed, retrying", attrs...)
		},
	}
	return retry.Do(ctx, "download of "+url, op)
}

// download is one artifact download across its attempts.
type download struct {
	c   *Cache
	url string
	w   *blobFile
	// validator is the strong ETag or else the Last-Modified of the version w holds the
	// start of, sent as If-Range on a resume.
	validator string
}

// attempt makes one request, asking for the bytes w lacks, and appends what comes to w.
func (d *download) attempt(ctx context.Context) error {
	ctx, watch := d.c.watchStalls(ctx)
	defer watch.Stop()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, d.url, nil)
	if err != nil {
		return fetch.Permanent(err)
	}
	req.Header.Set("User-Agent", "kiln")
	// Ask for the bytes as stored: with transparent gzip decoding, a .tar.gz served with
	// Content-Encoding: gzip would hash differently.
	req.Header.Set("Accept-Encoding", "identity")
	if d.w.n > 0 {
		req.Header.Set("Range", fmt.Sprintf("bytes=%d-", d.w.n))
		if d.validator != "" {
			req.Header.Set("If-Range", d.validator)
		}
	}
	client := d.c.Client
	if client == nil {
		client = http.DefaultClient
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("GET %s: %w", d.url, fetch.Cause(ctx, err))
	}
	defer resp.Body.Close()
	if err := d.accept(resp); err != nil {
		return err
	}
	start := d.w.n
	_, err = io.Copy(d.w, watch.Reader(resp.Body))
	var we *writeError
	switch got := d.w.n - start; {
	case errors.As(err, &we):
		return fetch.Permanent(err)
	case err != nil:
		return fmt.Errorf("GET %s: after %d bytes: %w", d.url, d.w.n, fetch.Cause(ctx, err))
	case resp.ContentLength >= 0 && got != resp.ContentLength:
		return fmt.Errorf("GET %s: got %d bytes, want %d", d.url, got, resp.ContentLength)
	}
	return nil
}

// accept checks the answer's status before its body is read: a 200 starts w over, a 206
// must continue w exactly where it ends and come from the same version of the file.
func (d *download) accept(resp *http.Response) error {
	switch resp.StatusCode {
	case http.StatusOK:
		if d.w.n > 0 {
			d.c.logger().Info("download restarts from zero: the server sent the whole file", "url", d.url, "had", d.w.n)
			if err := d.w.restart(); err != nil {
				return fetch.Permanent(err)
			}
		}
		d.validator = fetch.Validator(resp.Header)
		return nil
	case http.StatusPartialContent:
		first, err := fetch.ContentRangeStart(resp.Header.Get("Content-Range"))
		v := fetch.Validator(resp.Header)
		if d.w.n > 0 && err == nil && first == d.w.n && (v == "" || d.validator == "" || v == d.validator) {
			return nil
		}
		if err == nil {
			err = fmt.Errorf("206 for %q (validator %q) when bytes %d- of %q were asked for", resp.Header.Get("Content-Range"), v, d.w.n, d.validator)
		}
		if rerr := d.w.restart(); rerr != nil {
			return fetch.Permanent(rerr)
		}
		return fmt.Errorf("GET %s: %w; starting over", d.url, err)
	case http.StatusRequestedRangeNotSatisfiable:
		if err := d.w.restart(); err != nil {
			return fetch.Permanent(err)
		}
		return fmt.Errorf("GET %s: %s for bytes %d-; starting over", d.url, resp.Status, d.w.n)
	}
	return fmt.Errorf("GET %s: %w", d.url, fetch.CheckStatus(resp, d.c.Retry.now()))
}
