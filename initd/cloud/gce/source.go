package gce

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"cloud.google.com/go/compute/metadata"

	"github.com/kilnproject/kiln/initd/source"
)

// UserDataAttribute is the instance attribute that holds the config
// (gcloud compute instances create --metadata-from-file user-data=config.ign).
const UserDataAttribute = "user-data"

// Metadata reads the config from the Google Compute Engine metadata server's instance
// attribute user-data. Requests carry Metadata-Flavor: Google, and an answer without that
// response header is rejected, so another cloud's metadata service at the same address
// is never taken for Google's. An instance without the attribute has no config.
//
// A Metadata must not be copied after first use.
type Metadata struct {
	// Host is the metadata server as host[:port]; "" means the library's default
	// (169.254.169.254, or $GCE_METADATA_HOST).
	Host string
	// Transport sends the requests; nil means http.DefaultTransport.
	Transport http.RoundTripper
	// ProbeTimeout bounds Probe; 0 means 2s.
	ProbeTimeout time.Duration

	once   sync.Once
	client *metadata.Client
	last   *lastError
}

// Name implements source.Provider.
func (*Metadata) Name() string { return "gce-metadata" }

func (g *Metadata) metadata() *metadata.Client {
	g.once.Do(func() {
		g.last = &lastError{}
		g.client = gceClient(g.Host, g.Transport, g.last)
	})
	return g.client
}

// MetadataClient returns a client of the GCE metadata server for first-boot lookups
// (project, zone, instance name): it cuts every answer off at source.MaxConfigSize with a
// *source.TooLargeError, follows no redirect and accepts answers only from a Google metadata
// server. Use it instead of the metadata package's functions, whose client reads
// answers of any size into memory.
func MetadataClient() *metadata.Client {
	return gceClient("", nil, &lastError{})
}

func gceClient(host string, base http.RoundTripper, last *lastError) *metadata.Client {
	if base == nil {
		base = http.DefaultTransport
	}
	return metadata.NewClient(&http.Client{
		Transport: gceTransport{host: host, base: base, last: last},
		Timeout:   30 * time.Second,
		// The metadata server never redirects; following one would leave it.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	})
}

// Probe implements source.Provider: true when a Google metadata server answers instance/id
// within ProbeTimeout.
func (g *Metadata) Probe(ctx context.Context) bool {
	timeout := g.ProbeTimeout
	if timeout <= 0 {
		timeout = 2 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	// Not InstanceIDWithContext: the library caches that value process-wide.
	_, err := g.metadata().GetWithContext(ctx, "instance/id")
	return err == nil
}

// Fetch implements source.Provider: the user-data attribute, or nothing when it is not defined.
func (g *Metadata) Fetch(ctx context.Context) ([]byte, error) {
	v, err := g.metadata().InstanceAttributeValueWithContext(ctx, UserDataAttribute)
	if err != nil {
		var nd metadata.NotDefinedError
		if errors.As(err, &nd) {
			return nil, nil
		}
		// The client retries until the context ends: say what the last attempt met.
		if last := g.last.get(); last != nil && ctx.Err() != nil {
			err = fmt.Errorf("%w (last attempt: %v)", err, last)
		}
		return nil, fmt.Errorf("gce metadata instance/attributes/%s: %w", UserDataAttribute, err)
	}
	return []byte(v), nil
}

// gceTransport sends metadata requests to host (when set), rejects answers that do not
// come from a Google metadata server and cuts every answer off at source.MaxConfigSize (the
// metadata client reads each answer whole into memory).
type gceTransport struct {
	host string
	base http.RoundTripper
	last *lastError
}

// lastError keeps the error of the latest request that failed.
type lastError struct {
	mu  sync.Mutex
	err error
}

func (l *lastError) set(err error) {
	l.mu.Lock()
	l.err = err
	l.mu.Unlock()
}

func (l *lastError) get() error {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

func (t gceTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if t.host != "" {
		req = req.Clone(req.Context())
		req.URL.Host = t.host
		req.Host = t.host
	}
	resp, err := t.base.RoundTrip(req)
	if err != nil {
		if req.Context().Err() == nil {
			t.last.set(err)
		}
		return nil, err
	}
	if resp.Header.Get("Metadata-Flavor") != "Google" {
		resp.Body.Close()
		return nil, fmt.Errorf("%s is not a Google metadata server (no Metadata-Flavor: Google in the answer, status %s)", req.URL.Host, resp.Status)
	}
	resp.Body = source.LimitBody(resp.Body, source.MaxConfigSize, "the answer")
	return resp, nil
}
