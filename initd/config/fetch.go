package config

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"time"

	"github.com/kilnproject/kiln/initd/source"
)

// FetchOptions tune URLGetter.
type FetchOptions struct {
	// HTTPClient fetches http and https URLs; nil means http.DefaultClient.
	HTTPClient *http.Client
	// Retry is how long a fetch that may succeed later (a network error, HTTP 5xx, a TFTP
	// timeout) is tried again, with backoff; 0 tries once.
	Retry time.Duration
	// AttemptTimeout bounds one attempt; 0 means 30s.
	AttemptTimeout time.Duration
	// Log reports retries; nil discards them.
	Log *slog.Logger
}

// URLGetter fetches http, https and tftp URLs the way first boot fetches kiln.config.url
// (source.Fetcher): at most 10 redirects and never from https to anything else, answers
// capped at MaxSize, an HTTP 4xx or TFTP error final. It serves Render on the node and in
// `kiln check-config`, so both fetch a referenced config the same way.
func URLGetter(o FetchOptions) Getter {
	log := o.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	attempt := cmp.Or(o.AttemptTimeout, 30*time.Second)
	f := source.Fetcher{HTTPClient: o.HTTPClient, Logger: log, AttemptTimeout: attempt}
	return func(ctx context.Context, raw string) ([]byte, error) {
		u, err := url.Parse(raw)
		if err != nil {
			return nil, err
		}
		if o.Retry <= 0 {
			ctx, cancel := context.WithTimeout(ctx, attempt)
			defer cancel()
			return f.Once(ctx, u)
		}
		ctx, cancel := context.WithTimeout(ctx, o.Retry)
		defer cancel()
		data, err := f.Get(ctx, u)
		if err != nil {
			return nil, fmt.Errorf("within %s: %w", o.Retry, err)
		}
		return data, nil
	}
}
