package gce

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/kilnproject/kiln/initd/source"
)

// UserDataAttribute is the instance attribute that holds the config
// (gcloud compute instances create --metadata-from-file user-data=config.ign).
const UserDataAttribute = "user-data"

// Metadata reads the config from the Google Compute Engine metadata server's instance
// attribute user-data. Requests carry Metadata-Flavor: Google, and an answer without that
// response header is rejected, so another cloud's metadata service at the same address
// is never taken for Google's. An answer is cut off at source.MaxConfigSize. An instance
// without the attribute has no config.
//
// A Metadata must not be copied after first use.
type Metadata struct {
	// Host is the metadata server as host[:port]; "" means $GCE_METADATA_HOST, else
	// 169.254.169.254.
	Host string
	// Transport sends the requests; nil means http.DefaultTransport's settings without a
	// proxy.
	Transport http.RoundTripper
	// ProbeTimeout bounds Probe; 0 means 2s.
	ProbeTimeout time.Duration

	once   sync.Once
	client *metadataClient
}

var _ source.Provider = (*Metadata)(nil)

// Name implements source.Provider.
func (*Metadata) Name() string { return "gce-metadata" }

func (g *Metadata) metadata() *metadataClient {
	g.once.Do(func() { g.client = newMetadataClient(g.Host, g.Transport) })
	return g.client
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
	_, err := g.metadata().get(ctx, "instance/id")
	return err == nil
}

// Fetch implements source.Provider: the user-data attribute, or nothing when it is not defined.
// When ctx ends while the client tries again, the error says what the last attempt met.
func (g *Metadata) Fetch(ctx context.Context) ([]byte, error) {
	v, err := g.metadata().get(ctx, "instance/attributes/"+UserDataAttribute)
	if errors.Is(err, errNotDefined) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("gce metadata instance/attributes/%s: %w", UserDataAttribute, err)
	}
	return v, nil
}
