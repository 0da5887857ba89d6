package artifact

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kilnproject/kiln/internal/poll"
)

// DownloadRetry says how an http(s) artifact download, or the body of a registry blob, is
// retried. The zero value makes up to 5 attempts, pausing about 1, 2, 4 and 8 seconds
// between them (each drawn at random between half and all of that), on the wall clock. A
// 429 or 503 answer's Retry-After (seconds or an HTTP date) sets the pause that follows it
// instead, up to the backoff's Max (30 seconds when it has none).
type DownloadRetry struct {
	// Attempts bounds the requests of one download; 0 means 5, 1 never retries.
	Attempts int
	// Backoff sets the pauses; the zero value means 1s doubling up to 30s, jitter 0.5.
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

func (r DownloadRetry) backoff() poll.Backoff {
	if r.Backoff == (poll.Backoff{}) {
		return poll.Backoff{Initial: time.Second, Factor: 2, Max: 30 * time.Second, Jitter: 0.5}
	}
	return r.Backoff
}

// defaultMaxPause bounds a server's Retry-After when the backoff has no Max.
const defaultMaxPause = 30 * time.Second

// maxPause is the longest pause a server's Retry-After may ask for: the backoff's Max, or
// defaultMaxPause when it has none.
func (r DownloadRetry) maxPause() time.Duration {
	if m := r.backoff().Max; m > 0 {
		return m
	}
	return defaultMaxPause
}

func (r DownloadRetry) now() time.Time {
	if r.Clock != nil {
		return r.Clock.Now()
	}
	return time.Now()
}

// delay is the pause a transient error asks for (a server's Retry-After), at most
// maxPause; 0 leaves the pause to the backoff.
func (r DownloadRetry) delay(err error) time.Duration {
	var t *transientError
	if !errors.As(err, &t) {
		return 0
	}
	return min(t.after, r.maxPause())
}

// transientError is a failed attempt worth another: the connection failed or was cut, the
// download stalled, or the server answered 408, 429 or 5xx. after is the pause the server
// asked for with Retry-After, if any.
type transientError struct {
	err   error
	after time.Duration
}

func (e *transientError) Error() string { return e.err.Error() }
func (e *transientError) Unwrap() error { return e.err }

func transient(err error) error { return &transientError{err: err} }

// exhaustedError is the last attempt's transient error: it is not retried.
type exhaustedError struct {
	err      error
	attempts int
}

func (e *exhaustedError) Error() string {
	if e.attempts <= 1 {
		return e.err.Error()
	}
	return fmt.Sprintf("%v (gave up after %d attempts)", e.err, e.attempts)
}
func (e *exhaustedError) Unwrap() error { return e.err }

func retryable(err error) bool {
	var t *transientError
	var x *exhaustedError
	return errors.As(err, &t) && !errors.As(err, &x)
}

// cutShort reports whether err, from reading a response body, is the connection failing or
// the download stalling (ctx, the attempt's context, ended): worth another attempt, unlike a
// body that arrived whole and failed a check.
func cutShort(ctx context.Context, err error) bool {
	var ne net.Error
	return context.Cause(ctx) != nil || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.As(err, &ne)
}

// retryStatus reports whether an HTTP answer is worth another attempt.
func retryStatus(code int) bool {
	return code == http.StatusRequestTimeout || code == http.StatusTooManyRequests || code >= 500
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

// retry runs op, a request to url, until it succeeds or fails with an error that is not
// transient, at most c.Retry.attempts() times, pausing as c.Retry says. Each retry is logged
// with the URL, the attempt, its error, the pause before the next one and, when have is
// set, the bytes kept for a resume.
func (c *Cache) retry(ctx context.Context, url string, have func() int64, op func(context.Context) error) error {
	attempts := c.Retry.attempts()
	n := 0
	err := poll.Retry(ctx, poll.Options{
		What:      "download of " + url,
		Backoff:   c.Retry.backoff(),
		Clock:     c.Retry.Clock,
		Retryable: retryable,
		Delay:     c.Retry.delay,
		OnRetry: func(a poll.Attempt) {
			attrs := []any{"url", url, "attempt", a.N, "of", attempts, "error", a.Err, "next", a.Pause.Round(time.Millisecond)}
			if have != nil {
				attrs = append(attrs, "have", have())
			}
			c.logger().Warn("download failed, retrying", attrs...)
		},
	}, func(ctx context.Context) error {
		n++
		err := op(ctx)
		if err != nil && n >= attempts && retryable(err) {
			return &exhaustedError{err, n}
		}
		return err
	})
	var pe *poll.Error
	if errors.As(err, &pe) { // ctx ended: what the last attempt found, and why it stopped
		if pe.Last == nil || errors.Is(pe.Last, pe.Cause) {
			return errors.Join(pe.Last, pe.Cause)
		}
		return fmt.Errorf("%w (stopped: %w)", pe.Last, pe.Cause)
	}
	return err
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
	defer watch.stop()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, d.url, nil)
	if err != nil {
		return err
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
		return transient(fmt.Errorf("GET %s: %w", d.url, causeOr(ctx, err)))
	}
	defer resp.Body.Close()
	if err := d.accept(resp); err != nil {
		return err
	}
	start := d.w.n
	_, err = io.Copy(d.w, watch.reader(resp.Body))
	var we *writeError
	switch got := d.w.n - start; {
	case errors.As(err, &we):
		return err
	case err != nil:
		return transient(fmt.Errorf("GET %s: after %d bytes: %w", d.url, d.w.n, causeOr(ctx, err)))
	case resp.ContentLength >= 0 && got != resp.ContentLength:
		return transient(fmt.Errorf("GET %s: got %d bytes, want %d", d.url, got, resp.ContentLength))
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
				return err
			}
		}
		d.validator = validatorOf(resp)
		return nil
	case http.StatusPartialContent:
		first, err := contentRangeStart(resp.Header.Get("Content-Range"))
		v := validatorOf(resp)
		if d.w.n > 0 && err == nil && first == d.w.n && (v == "" || d.validator == "" || v == d.validator) {
			return nil
		}
		if err == nil {
			err = fmt.Errorf("206 for %q (validator %q) when bytes %d- of %q were asked for", resp.Header.Get("Content-Range"), v, d.w.n, d.validator)
		}
		if rerr := d.w.restart(); rerr != nil {
			return rerr
		}
		return transient(fmt.Errorf("GET %s: %w; starting over", d.url, err))
	case http.StatusRequestedRangeNotSatisfiable:
		if err := d.w.restart(); err != nil {
			return err
		}
		return transient(fmt.Errorf("GET %s: %s for bytes %d-; starting over", d.url, resp.Status, d.w.n))
	}
	err := fmt.Errorf("GET %s: %s", d.url, resp.Status)
	if !retryStatus(resp.StatusCode) {
		return err
	}
	t := &transientError{err: err}
	if resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable {
		t.after = retryAfter(resp.Header.Get("Retry-After"), d.c.Retry.now())
	}
	return t
}

// retryAfter returns the pause a Retry-After header value asks for, seconds or an HTTP date
// (from now); 0 when v is empty, malformed or in the past.
func retryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if s, err := strconv.ParseInt(v, 10, 64); err == nil {
		switch {
		case s <= 0:
			return 0
		case s > int64(math.MaxInt64/time.Second):
			return math.MaxInt64 // capped by the caller
		}
		return time.Duration(s) * time.Second
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0
	}
	return max(t.Sub(now), 0)
}

// validatorOf returns what identifies the version of the file resp carries, for If-Range:
// its ETag when strong (If-Range takes no weak one), else its Last-Modified, else "".
func validatorOf(resp *http.Response) string {
	if et := resp.Header.Get("ETag"); et != "" && !strings.HasPrefix(et, "W/") {
		return et
	}
	return resp.Header.Get("Last-Modified")
}

// contentRangeStart returns the first byte position of a Content-Range "bytes F-L/S".
func contentRangeStart(cr string) (int64, error) {
	spec, ok := strings.CutPrefix(cr, "bytes ")
	first, _, ok2 := strings.Cut(spec, "-")
	if !ok || !ok2 {
		return 0, fmt.Errorf("Content-Range %q is not bytes F-L/S", cr)
	}
	n, err := strconv.ParseInt(first, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("Content-Range %q is not bytes F-L/S", cr)
	}
	return n, nil
}
