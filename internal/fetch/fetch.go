// Package fetch is the one way kiln's programs get things over HTTP(S): the node config and
// the files it references (first boot), a live root and an install image (stage 1), and
// artifacts (the builder). Each caller keeps its own limits and checks; what they share is
// here, so it is written once:
//
//   - redirects that never leave https once a chain is on it, at most MaxRedirects
//     (SafeRedirects);
//   - which answers are worth another attempt (CheckStatus: 408, 429 and 5xx, with the
//     server's Retry-After) and one type for the failures that are not (Permanent);
//   - one retry policy (Retry: backoff with jitter, a bounded number of attempts, the
//     server's Retry-After honoured up to the backoff's longest pause);
//   - a stall watchdog that ends an attempt whose server sends nothing for a while, and does
//     not count the time the caller spends writing what arrived (Watch);
//   - what a resumed download needs (Validator, ContentRangeStart).
package fetch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/kilnproject/kiln/internal/poll"
)

// MaxRedirects is how many redirects a fetch follows.
const MaxRedirects = 10

// RedirectError is a redirect that SafeRedirects refused.
type RedirectError struct {
	From, To string
	Reason   string
}

func (e *RedirectError) Error() string {
	return fmt.Sprintf("refused redirect from %s to %s: %s", e.From, e.To, e.Reason)
}

// CheckRedirect is the redirect policy of kiln's fetches, for http.Client.CheckRedirect: at
// most MaxRedirects redirects, and once a chain has been on https, every later hop must be
// https too, so a redirect cannot strip TLS off a fetch the user asked to be secure. http to
// https is followed.
func CheckRedirect(req *http.Request, via []*http.Request) error {
	prev := via[len(via)-1].URL
	if len(via) > MaxRedirects {
		return &RedirectError{From: prev.Redacted(), To: req.URL.Redacted(), Reason: fmt.Sprintf("more than %d redirects", MaxRedirects)}
	}
	if req.URL.Scheme != "https" {
		for _, v := range via {
			if v.URL.Scheme == "https" {
				return &RedirectError{From: prev.Redacted(), To: req.URL.Redacted(), Reason: "a fetch that began on https must stay on https"}
			}
		}
	}
	return nil
}

// SafeRedirects returns a copy of hc (http.DefaultClient when nil) that applies
// CheckRedirect before hc's own policy.
func SafeRedirects(hc *http.Client) *http.Client {
	if hc == nil {
		hc = http.DefaultClient
	}
	c := *hc
	own := hc.CheckRedirect
	c.CheckRedirect = func(req *http.Request, via []*http.Request) error {
		if err := CheckRedirect(req, via); err != nil {
			return err
		}
		if own != nil {
			return own(req, via)
		}
		return nil
	}
	return &c
}

// Do sends req with SafeRedirects(hc). A refused redirect and a request that cannot be sent
// as written are Permanent; a network failure is not.
func Do(hc *http.Client, req *http.Request) (*http.Response, error) {
	resp, err := SafeRedirects(hc).Do(req)
	if err != nil && errors.As(err, new(*RedirectError)) {
		return nil, Permanent(err)
	}
	return resp, err
}

// PermanentError is a failure another attempt would not change: a 4xx answer, a refused
// redirect, an answer over a limit, a local disk that is full.
type PermanentError struct{ Err error }

func (e *PermanentError) Error() string { return e.Err.Error() }
func (e *PermanentError) Unwrap() error { return e.Err }

// Permanent marks err as a failure Retry must not try again; nil stays nil.
func Permanent(err error) error {
	if err == nil || IsPermanent(err) {
		return err
	}
	return &PermanentError{Err: err}
}

// IsPermanent reports whether err, or an error it wraps, is marked Permanent.
func IsPermanent(err error) bool {
	var p *PermanentError
	return errors.As(err, &p)
}

// StatusError is an answer with a status the caller did not want.
type StatusError struct {
	Code   int
	Status string // "503 Service Unavailable"
	// RetryAfter is the pause a 429 or 503 asked for with Retry-After; 0 when none.
	RetryAfter time.Duration
}

func (e *StatusError) Error() string { return "server answered " + e.Status }

// Retryable reports whether a status is worth another attempt: 408, 429 and 5xx.
func Retryable(code int) bool {
	return code == http.StatusRequestTimeout || code == http.StatusTooManyRequests || code >= 500
}

// CheckStatus returns nil for a 200 and a *StatusError for any other answer: marked
// Permanent unless the status is Retryable, and carrying a 429's or 503's Retry-After
// (seconds or an HTTP date, from now).
func CheckStatus(resp *http.Response, now time.Time) error {
	if resp.StatusCode == http.StatusOK {
		return nil
	}
	e := &StatusError{Code: resp.StatusCode, Status: resp.Status}
	if !Retryable(resp.StatusCode) {
		return Permanent(e)
	}
	if resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable {
		e.RetryAfter = RetryAfter(resp.Header.Get("Retry-After"), now)
	}
	return e
}

// RetryAfter returns the pause a Retry-After header value asks for, seconds or an HTTP date
// (from now); 0 when v is empty, malformed or in the past.
func RetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if s, err := strconv.ParseInt(v, 10, 64); err == nil {
		switch {
		case s <= 0:
			return 0
		case s > int64(math.MaxInt64/time.Second):
			return math.MaxInt64 // capped by Retry
		}
		return time.Duration(s) * time.Second
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0
	}
	return max(t.Sub(now), 0)
}

// Validator returns what identifies the version of the file an answer carries, for
// If-Range: its ETag when strong (If-Range takes no weak one), else its Last-Modified, else "".
func Validator(h http.Header) string {
	if et := h.Get("ETag"); et != "" && !strings.HasPrefix(et, "W/") {
		return et
	}
	return h.Get("Last-Modified")
}

// ContentRangeStart returns the first byte position of a Content-Range "bytes F-L/S".
func ContentRangeStart(cr string) (int64, error) {
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

// DefaultBackoff paces attempts when Retry.Backoff is zero: about 1, 2, 4, 8, 16 s, then
// 30 s, each drawn between 80% and 100% of that.
var DefaultBackoff = poll.Backoff{Initial: time.Second, Factor: 2, Max: 30 * time.Second, Jitter: 0.2}

// defaultMaxPause bounds a server's Retry-After when the backoff has no Max.
const defaultMaxPause = 30 * time.Second

// Retry is kiln's one policy for trying a fetch again.
type Retry struct {
	// Attempts bounds the attempts; 0 means until ctx ends, 1 never retries.
	Attempts int
	// Backoff paces the attempts; the zero value means DefaultBackoff.
	Backoff poll.Backoff
	// Clock times the pauses; nil means the wall clock.
	Clock poll.Clock
	// OnRetry, when set, is told of each failed attempt that another will follow, e.g. to
	// log it.
	OnRetry func(poll.Attempt)
}

// Do runs op until it succeeds, fails with an error marked Permanent, has made Attempts
// attempts or ctx ends. A *StatusError's RetryAfter sets the pause after it, up to the
// backoff's Max (30 s when it has none). The error returned is the last attempt's, Permanent
// marks included; after more than one attempt it says so ("(gave up after 5 attempts)"), and
// when ctx ended it also says why ("(gave up after 3 attempts: context deadline exceeded)").
func (r Retry) Do(ctx context.Context, what string, op func(context.Context) error) error {
	backoff := r.Backoff
	if backoff == (poll.Backoff{}) {
		backoff = DefaultBackoff
	}
	maxPause := backoff.Max
	if maxPause <= 0 {
		maxPause = defaultMaxPause
	}
	n := 0
	err := poll.Retry(ctx, poll.Options{
		What:      what,
		Backoff:   backoff,
		Clock:     r.Clock,
		Retryable: func(err error) bool { return !IsPermanent(err) },
		Delay: func(err error) time.Duration {
			var s *StatusError
			if errors.As(err, &s) {
				return min(s.RetryAfter, maxPause)
			}
			return 0
		},
		OnRetry: r.OnRetry,
	}, func(ctx context.Context) error {
		n++
		err := op(ctx)
		if err != nil && r.Attempts > 0 && n >= r.Attempts && !IsPermanent(err) {
			return &PermanentError{Err: gaveUp{err, n}}
		}
		return err
	})
	var pe *poll.Error
	if errors.As(err, &pe) { // ctx ended: what the last attempt found, and why it stopped
		switch {
		case pe.Last == nil || errors.Is(pe.Last, pe.Cause):
			return errors.Join(pe.Last, pe.Cause)
		case n > 1:
			return fmt.Errorf("%w (gave up after %d attempts: %w)", pe.Last, n, pe.Cause)
		}
		return fmt.Errorf("%w (stopped: %w)", pe.Last, pe.Cause)
	}
	return err
}

// gaveUp is the last attempt's error once Retry.Attempts are used up.
type gaveUp struct {
	err      error
	attempts int
}

func (g gaveUp) Error() string {
	if g.attempts <= 1 {
		return g.err.Error()
	}
	return fmt.Sprintf("%v (gave up after %d attempts)", g.err, g.attempts)
}
func (g gaveUp) Unwrap() error { return g.err }

// ErrStalled is the cause of a context Watch ended because the server sent nothing.
var ErrStalled = errors.New("no data arrived")

// Watchdog ends an attempt whose server sends nothing for a while; see Watch.
type Watchdog struct {
	after  time.Duration
	timer  *time.Timer
	cancel context.CancelCauseFunc
}

// Watch returns a context that ends, with a cause wrapping ErrStalled ("no data arrived for
// 30s"), when after passes without the server sending anything: from now until the first
// read through w.Reader returns, and then during each later read. The time between reads (the
// caller writing to a slow disk) does not count. Stop releases it.
func Watch(ctx context.Context, after time.Duration) (context.Context, *Watchdog) {
	ctx, cancel := context.WithCancelCause(ctx)
	w := &Watchdog{after: after, cancel: cancel}
	w.timer = time.AfterFunc(after, func() { cancel(fmt.Errorf("%w for %s", ErrStalled, after)) })
	return ctx, w
}

// Idle stops the clock until the next read through Reader: for a caller that has its
// answer and does other work (waits for a disk, say) before it reads the body.
func (w *Watchdog) Idle() { w.timer.Stop() }

// Reader passes r through, timing each read.
func (w *Watchdog) Reader(r io.Reader) io.Reader { return &watchedReader{r: r, w: w} }

// Stop ends the watch and the context Watch returned.
func (w *Watchdog) Stop() {
	w.timer.Stop()
	w.cancel(nil)
}

type watchedReader struct {
	r io.Reader
	w *Watchdog
}

func (s *watchedReader) Read(p []byte) (int, error) {
	s.w.timer.Reset(s.w.after)
	n, err := s.r.Read(p)
	s.w.timer.Stop()
	return n, err
}

// Cause returns why ctx ended (a stall, the caller's cancellation) when it has, or else err.
func Cause(ctx context.Context, err error) error {
	if c := context.Cause(ctx); c != nil {
		return c
	}
	return err
}
