package source

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/kilnproject/kiln/internal/poll"
)

// Fetcher gets http, https and tftp URLs: kiln.config.url (CmdlineURL) and the configs a
// config references (ignition.config.merge and replace, through config.URLGetter). http(s)
// redirects follow CheckRedirect; every answer is capped at MaxConfigSize. The zero value
// works.
type Fetcher struct {
	// HTTPClient fetches http and https URLs; nil means http.DefaultClient.
	HTTPClient *http.Client
	// TFTP tunes the tftp client (block size, retransmission).
	TFTP TFTPClient
	// Backoff is the first pause between attempts of Get; it doubles up to 8×. 0 means 1s.
	Backoff time.Duration
	// AttemptTimeout bounds one attempt of Get; 0 means 30s.
	AttemptTimeout time.Duration
	// Logger reports retries; nil means slog.Default().
	Logger *slog.Logger
}

// Get fetches u, trying again with exponential backoff until ctx ends: network errors, HTTP
// 5xx and TFTP timeouts are retried, an answer retrying cannot change (HTTP 4xx, a TFTP error
// packet, a refused redirect, an answer over the cap) fails at once.
func (f Fetcher) Get(ctx context.Context, u *url.URL) ([]byte, error) {
	pause := cmp.Or(f.Backoff, time.Second)
	attemptTimeout := cmp.Or(f.AttemptTimeout, 30*time.Second)
	logger := cmp.Or(f.Logger, slog.Default())
	var data []byte
	err := poll.Retry(ctx, poll.Options{
		What:      u.Redacted(),
		Backoff:   poll.Backoff{Initial: pause, Factor: 2, Max: 8 * pause},
		Retryable: func(err error) bool { return !Permanent(err) },
		OnRetry: func(a poll.Attempt) {
			logger.Warn("fetch: retrying", "url", u.Redacted(), "attempt", a.N, "in", a.Pause, "err", a.Err)
		},
	}, func(ctx context.Context) error {
		actx, cancel := context.WithTimeout(ctx, attemptTimeout)
		defer cancel()
		var err error
		data, err = f.Once(actx, u)
		return err
	})
	var pe *poll.Error
	if errors.As(err, &pe) {
		// When the deadline cut the last attempt short, Last is what the attempts before it
		// found (a refused connection, a 502): it says more than "context deadline exceeded".
		return nil, fmt.Errorf("gave up after %d attempts: %w", pe.Attempts, cmp.Or(pe.Last, pe.Cause))
	}
	return data, err
}

// Once fetches u once. An error retrying cannot change is Permanent.
func (f Fetcher) Once(ctx context.Context, u *url.URL) ([]byte, error) {
	switch u.Scheme {
	case "tftp":
		return f.TFTP.Get(ctx, u.Host, strings.TrimPrefix(u.Path, "/"))
	case "http", "https":
	default:
		return nil, &permanentError{fmt.Errorf("scheme %q not supported (http, https, tftp)", u.Scheme)}
	}
	hc := cmp.Or(f.HTTPClient, http.DefaultClient)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, &permanentError{err}
	}
	resp, err := SafeRedirects(hc).Do(req)
	if err != nil {
		var re *RedirectError
		if errors.As(err, &re) {
			return nil, &permanentError{err}
		}
		return nil, err
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusOK:
	case resp.StatusCode >= 500:
		return nil, fmt.Errorf("server answered %s", resp.Status)
	default:
		return nil, &permanentError{fmt.Errorf("server answered %s", resp.Status)}
	}
	data, err := readLimited(resp.Body, MaxConfigSize, "the answer")
	var tooLarge *TooLargeError
	if errors.As(err, &tooLarge) {
		return nil, &permanentError{err}
	}
	return data, err
}

// Permanent reports whether err is an answer that fetching again will not change: an HTTP 4xx,
// a TFTP error packet, a refused redirect, an answer over the cap.
func Permanent(err error) bool {
	var perm *permanentError
	return errors.As(err, &perm)
}
