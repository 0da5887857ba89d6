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

	"github.com/kilnproject/kiln/internal/fetch"
	"github.com/kilnproject/kiln/internal/poll"
)

// Fetcher gets http, https and tftp URLs: kiln.config.url (CmdlineURL) and the configs a
// config references (ignition.config.merge and replace, through config.URLGetter). http(s)
// redirects follow fetch.CheckRedirect; every answer is capped at MaxConfigSize. The zero value
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
// 408, 429 and 5xx and TFTP timeouts are retried, an answer retrying cannot change (another
// HTTP 4xx, a TFTP error packet, a refused redirect, an answer over the cap) fails at once.
func (f Fetcher) Get(ctx context.Context, u *url.URL) ([]byte, error) {
	pause := cmp.Or(f.Backoff, time.Second)
	attemptTimeout := cmp.Or(f.AttemptTimeout, 30*time.Second)
	logger := cmp.Or(f.Logger, slog.Default())
	var data []byte
	retry := fetch.Retry{
		Backoff: poll.Backoff{Initial: pause, Factor: 2, Max: 8 * pause},
		OnRetry: func(a poll.Attempt) {
			logger.Warn("fetch: retrying", "url", u.Redacted(), "attempt", a.N, "in", a.Pause, "err", a.Err)
		},
	}
	err := retry.Do(ctx, u.Redacted(), func(ctx context.Context) error {
		actx, cancel := context.WithTimeout(ctx, attemptTimeout)
		defer cancel()
		var err error
		data, err = f.Once(actx, u)
		return err
	})
	return data, err
}

// Once fetches u once. An error retrying cannot change is marked fetch.Permanent.
func (f Fetcher) Once(ctx context.Context, u *url.URL) ([]byte, error) {
	switch u.Scheme {
	case "tftp":
		return f.TFTP.Get(ctx, u.Host, strings.TrimPrefix(u.Path, "/"))
	case "http", "https":
	default:
		return nil, fetch.Permanent(fmt.Errorf("scheme %q not supported (http, https, tftp)", u.Scheme))
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, fetch.Permanent(err)
	}
	resp, err := fetch.Do(f.HTTPClient, req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if err := fetch.CheckStatus(resp, time.Now()); err != nil {
		return nil, err
	}
	data, err := ReadLimited(resp.Body, MaxConfigSize, "the answer")
	var tooLarge *TooLargeError
	if errors.As(err, &tooLarge) {
		return nil, fetch.Permanent(err)
	}
	return data, err
}
