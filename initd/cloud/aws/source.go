package aws

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	sdkaws "github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials/ec2rolecreds"
	"github.com/aws/aws-sdk-go-v2/feature/ec2/imds"

	"github.com/kilnproject/kiln/initd/source"
)

// IMDS reads EC2 user data from the instance metadata service, IMDSv2 only: the client
// PUTs for a session token (with a TTL) and sends it with every GET; it never falls back
// to the unauthenticated IMDSv1 flow. An instance without user data (404) has no config.
//
// An IMDS must not be copied after first use.
type IMDS struct {
	// Endpoint is the IMDS base URL; "" means the SDK's default (http://169.254.169.254).
	Endpoint string
	// HTTPClient sends the requests; nil means one with the SDK's default timeouts. Every
	// answer (session token, metadata, user data) is cut off at source.MaxConfigSize.
	HTTPClient imds.HTTPClient
	// ProbeTimeout bounds Probe; 0 means 2s.
	ProbeTimeout time.Duration

	once   sync.Once
	client *imds.Client
}

// Name implements source.Provider.
func (*IMDS) Name() string { return "aws-imds" }

func (a *IMDS) imds() *imds.Client {
	a.once.Do(func() {
		a.client = imds.New(imds.Options{
			Endpoint:       a.Endpoint,
			HTTPClient:     CapIMDS(a.HTTPClient),
			EnableFallback: sdkaws.FalseTernary,
		})
	})
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
	out, err := a.imds().GetMetadata(ctx, &imds.GetMetadataInput{Path: "instance-id"})
	if err != nil {
		return false
	}
	out.Content.Close()
	return true
}

// Fetch implements source.Provider: the instance's user data, or nothing when it has none.
func (a *IMDS) Fetch(ctx context.Context) ([]byte, error) {
	out, err := a.imds().GetUserData(ctx, &imds.GetUserDataInput{})
	if err != nil {
		if httpStatus(err) == http.StatusNotFound {
			return nil, nil
		}
		return nil, fmt.Errorf("imds user-data: %w", err)
	}
	defer out.Content.Close()
	return source.ReadLimited(out.Content, source.MaxConfigSize, "imds user-data")
}

// CapIMDS returns an HTTP client for an IMDS client (imds.Options.HTTPClient) that cuts
// every answer off at source.MaxConfigSize with a *source.TooLargeError: the SDK reads each answer
// whole into memory before it hands it over. c nil, or the SDK's buildable client, gets
// the SDK's short IMDS timeouts, which make a probe fail fast off EC2.
func CapIMDS(c imds.HTTPClient) imds.HTTPClient {
	if c == nil {
		c = awshttp.NewBuildableClient()
	}
	if b, ok := c.(*awshttp.BuildableClient); ok {
		c = b.WithDialerOptions(func(d *net.Dialer) { d.Timeout = 250 * time.Millisecond }).
			WithTransportOptions(func(tr *http.Transport) { tr.ResponseHeaderTimeout = 500 * time.Millisecond })
	}
	return cappedClient{c}
}

// Config loads the SDK's default configuration for a node's own AWS calls (Route 53, EC2),
// with the region from IMDS when the environment names none. Every IMDS answer it reads —
// the region, and later the instance role's credentials — goes through CapIMDS: the SDK's
// default clients would read an answer of any size into memory. imdsEndpoint is the IMDS
// base URL; "" takes it from the environment and shared config as the SDK's own would
// (AWS_EC2_METADATA_SERVICE_ENDPOINT), else http://169.254.169.254.
func Config(ctx context.Context, imdsEndpoint string) (sdkaws.Config, error) {
	var opts []func(*awsconfig.LoadOptions) error
	if imdsEndpoint != "" {
		opts = append(opts, awsconfig.WithEC2IMDSEndpoint(imdsEndpoint))
	}
	base, err := awsconfig.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return sdkaws.Config{}, err
	}
	md := NewIMDS(base)
	return awsconfig.LoadDefaultConfig(ctx, append(opts,
		awsconfig.WithEC2IMDSRegion(func(o *awsconfig.UseEC2IMDSRegion) { o.Client = md }),
		awsconfig.WithEC2RoleCredentialOptions(func(o *ec2rolecreds.Options) { o.Client = md }))...)
}

// NewIMDS returns an IMDSv2 client for cfg (its IMDS endpoint) whose answers are capped
// by CapIMDS.
func NewIMDS(cfg sdkaws.Config) *imds.Client {
	return imds.NewFromConfig(cfg, func(o *imds.Options) { o.HTTPClient = CapIMDS(o.HTTPClient) })
}

type cappedClient struct{ imds.HTTPClient }

func (c cappedClient) Do(req *http.Request) (*http.Response, error) {
	resp, err := c.HTTPClient.Do(req)
	if err != nil {
		return nil, err
	}
	resp.Body = source.LimitBody(resp.Body, source.MaxConfigSize, "imds "+req.Method+" "+req.URL.Path)
	return resp, nil
}

// httpStatus returns the HTTP status code carried by an SDK error, or 0.
func httpStatus(err error) int {
	var se interface{ HTTPStatusCode() int }
	if errors.As(err, &se) {
		return se.HTTPStatusCode()
	}
	return 0
}
