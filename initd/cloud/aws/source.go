package aws

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"
)

// IMDS reads EC2 user data from the instance metadata service, IMDSv2 only: the client
// PUTs for a session token (with a TTL) and sends it with every GET; it never falls back
// to the unauthenticated IMDSv1 flow. An instance without user data (404) has no config.
//
// An IMDS must not be copied after first use.
type IMDS struct {
	// Endpoint is the IMDS base URL; "" means http://169.254.169.254.
	Endpoint string
	// HTTPClient sends the requests; nil means one with IMDS's short timeouts (250 ms to
	// connect, 500 ms for an answer's headers). Every answer (session token, metadata,
	// user data) is cut off at source.MaxConfigSize.
	HTTPClient *http.Client
	// ProbeTimeout bounds Probe; 0 means 2s.
	ProbeTimeout time.Duration

	once   sync.Once
	client *imdsClient
}

// Name implements source.Provider.
func (*IMDS) Name() string { return "aws-imds" }

func (a *IMDS) imds() *imdsClient {
	a.once.Do(func() { a.client = newIMDSClient(a.Endpoint, a.HTTPClient) })
	return a.client
}

// Probe implements source.Provider: true when the metadata service grants a session token and
// answers with it (it reads meta-data/instance-id) within ProbeTimeout.
func (a *IMDS) Probe(ctx context.Context) bool {
	timeout := a.ProbeTimeout
	if timeout <= 0 {
		timeout = 2 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	_, err := a.imds().metadata(ctx, "instance-id")
	return err == nil
}

// Fetch implements source.Provider: the instance's user data, or nothing when it has none.
func (a *IMDS) Fetch(ctx context.Context) ([]byte, error) {
	const userData = "/latest/user-data"
	data, err := a.imds().get(ctx, userData)
	if err != nil {
		if imdsNotFound(err, userData) {
			return nil, nil
		}
		return nil, fmt.Errorf("imds user-data: %w", err)
	}
	return data, nil
}
