package gce

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/kilnproject/kiln/initd/source"
	"github.com/kilnproject/kiln/internal/fetch"
)

const (
	// metadataIP is the GCE metadata server's documented address.
	metadataIP = "169.254.169.254"
	// metadataHostEnv names another metadata server, host[:port] (tests, emulators).
	metadataHostEnv = "GCE_METADATA_HOST"
	// metadataTimeout bounds one request to the metadata server, its answer included.
	metadataTimeout = 30 * time.Second
	// metadataAttempts bounds the attempts of one lookup: the first and five more, as the
	// Go metadata package tries.
	metadataAttempts = 6
)

// errNotDefined is the metadata server's 404: the instance has no such value.
var errNotDefined = errors.New("not defined")

// metadataClient reads the GCE metadata server: requests carry Metadata-Flavor: Google,
// an answer without that header is refused (another cloud's metadata service at the same
// address is never taken for Google's), every answer is cut off at source.MaxConfigSize
// with a *source.TooLargeError, and no redirect is followed. A 429, a 5xx or a failure to
// get an answer is tried again, up to metadataAttempts in all.
type metadataClient struct {
	host  string
	http  *http.Client
	retry fetch.Retry
}

// newMetadataClient is a client of the metadata server at host (host[:port]; ""
// means $GCE_METADATA_HOST, else 169.254.169.254) that sends its requests with base (nil
// means http.DefaultTransport's settings without a proxy: the metadata server refuses
// relayed requests).
func newMetadataClient(host string, base http.RoundTripper) *metadataClient {
	if host == "" {
		host = os.Getenv(metadataHostEnv)
	}
	if host == "" {
		host = metadataIP
	}
	if base == nil {
		base = http.DefaultTransport
		if t, ok := base.(*http.Transport); ok {
			t = t.Clone()
			t.Proxy = nil
			base = t
		}
	}
	return &metadataClient{
		host: host,
		http: &http.Client{
			Transport: base,
			Timeout:   metadataTimeout,
			// The metadata server never redirects; following one would leave it.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
		retry: fetch.Retry{Attempts: metadataAttempts, Backoff: apiBackoff()},
	}
}

// get returns the value at path below /computeMetadata/v1/; a value the instance does not
// have is errNotDefined.
func (c *metadataClient) get(ctx context.Context, path string) ([]byte, error) {
	u := "http://" + c.host + "/computeMetadata/v1/" + strings.TrimLeft(path, "/")
	var value []byte
	err := c.retry.Do(ctx, "GET "+u, func(ctx context.Context) error {
		var err error
		value, err = c.once(ctx, u)
		return err
	})
	return value, err
}

// getTrimmed is get's value without surrounding white space, as a string.
func (c *metadataClient) getTrimmed(ctx context.Context, path string) (string, error) {
	v, err := c.get(ctx, path)
	return strings.TrimSpace(string(v)), err
}

// once makes one attempt of a get; an error another attempt cannot change is marked
// fetch.Permanent.
func (c *metadataClient) once(ctx context.Context, u string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, fetch.Permanent(err)
	}
	req.Header.Set("Metadata-Flavor", "Google")
	req.Header.Set("User-Agent", userAgent)
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.Header.Get("Metadata-Flavor") != "Google" {
		return nil, fetch.Permanent(fmt.Errorf("%s is not a Google metadata server (no Metadata-Flavor: Google in the answer, status %s)", c.host, resp.Status))
	}
	body, err := source.ReadLimited(resp.Body, source.MaxConfigSize, "the answer")
	var tooLarge *source.TooLargeError
	switch {
	case errors.As(err, &tooLarge):
		return nil, fetch.Permanent(err)
	case err != nil:
		return nil, err
	case resp.StatusCode == http.StatusOK:
		return body, nil
	case resp.StatusCode == http.StatusNotFound:
		return nil, fetch.Permanent(errNotDefined)
	}
	err = fmt.Errorf("the metadata server answered %s: %s", resp.Status, excerpt(body))
	if retryableStatus(resp.StatusCode) {
		return nil, err
	}
	return nil, fetch.Permanent(err)
}
