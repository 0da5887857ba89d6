package aws

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kilnproject/kiln/initd/source"
)

// The IMDSv2 client the node's IMDS reads share: the config source, the identity, the
// region and the instance role's credentials.

const (
	// defaultIMDSEndpoint is EC2's instance metadata service, on the instance's own link.
	defaultIMDSEndpoint = "http://169.254.169.254"
	imdsTokenPath       = "/latest/api/token"
	imdsTokenHeader     = "X-aws-ec2-metadata-token"
	imdsTTLHeader       = "X-aws-ec2-metadata-token-ttl-seconds"
	// defaultIMDSTokenTTL is the session token's lifetime asked for, the AWS SDK's.
	defaultIMDSTokenTTL = 5 * time.Minute
	// imdsCallTimeout bounds an IMDS read whose context has no deadline, as the AWS SDK's
	// IMDS client did.
	imdsCallTimeout = 5 * time.Second
	// imdsAttempts is how often a read is tried: a request that got no answer, or a 5xx
	// or 429 one, is tried again after a pause of up to 50 ms, then 100 ms (the AWS SDK's
	// IMDS client made 3 attempts too). A 401 fetches a new token first.
	imdsAttempts = 3
)

// imdsClient reads the instance metadata service, IMDSv2 only: it PUTs for a session
// token with a TTL and sends it with every GET, fetching a new one shortly before the
// token expires or when IMDS answers 401. It never falls back to the unauthenticated
// IMDSv1 flow. Every answer, the token included, is cut off at source.MaxConfigSize with
// a *source.TooLargeError.
type imdsClient struct {
	endpoint string
	http     *http.Client
	ttl      time.Duration

	mu      sync.Mutex
	token   string
	renewAt time.Time // when to fetch a new token
}

// newIMDSClient returns a client of the IMDS at endpoint ("" for the default) that sends
// its requests with c (nil for one with IMDS's short timeouts).
func newIMDSClient(endpoint string, c *http.Client) *imdsClient {
	if endpoint == "" {
		endpoint = defaultIMDSEndpoint
	}
	if c == nil {
		c = newIMDSHTTPClient()
	}
	return &imdsClient{endpoint: strings.TrimSuffix(endpoint, "/"), http: c, ttl: defaultIMDSTokenTTL}
}

// newIMDSHTTPClient is an HTTP client for IMDS with the AWS SDK's short timeouts (250 ms
// to connect, 500 ms for the answer's headers), which make a probe fail fast off EC2. It
// never goes through a proxy and follows no redirect.
func newIMDSHTTPClient() *http.Client {
	return &http.Client{
		Transport: &http.Transport{
			DialContext:           (&net.Dialer{Timeout: 250 * time.Millisecond, KeepAlive: 30 * time.Second}).DialContext,
			ResponseHeaderTimeout: 500 * time.Millisecond,
			MaxIdleConnsPerHost:   2,
			IdleConnTimeout:       30 * time.Second,
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// imdsStatusError is an IMDS answer other than 200 OK.
type imdsStatusError struct {
	Method, Path string
	StatusCode   int
}

func (e *imdsStatusError) Error() string {
	return fmt.Sprintf("IMDS %s %s: HTTP %d %s", e.Method, e.Path, e.StatusCode, http.StatusText(e.StatusCode))
}

// imdsNotFound reports whether err is IMDS's 404 to a GET of path: it has no such data
// (a 404 to the token request is a service without IMDSv2, not missing data).
func imdsNotFound(err error, path string) bool {
	var se *imdsStatusError
	return errors.As(err, &se) && se.Method == http.MethodGet && se.Path == path && se.StatusCode == http.StatusNotFound
}

// metadataPath is the path of meta-data/path.
func metadataPath(path string) string { return "/latest/meta-data/" + path }

// metadata reads meta-data/path, e.g. "instance-id".
func (c *imdsClient) metadata(ctx context.Context, path string) ([]byte, error) {
	return c.get(ctx, metadataPath(path))
}

// get GETs path (e.g. /latest/user-data) and returns the answer's body.
func (c *imdsClient) get(ctx context.Context, path string) ([]byte, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, imdsCallTimeout)
		defer cancel()
	}
	for attempt := 1; ; attempt++ {
		body, retry, err := c.getOnce(ctx, path)
		if err == nil {
			return body, nil
		}
		if !retry || attempt == imdsAttempts || ctx.Err() != nil {
			return nil, err
		}
		if err := sleepCtx(ctx, backoff(attempt, 50*time.Millisecond, time.Second)); err != nil {
			return nil, err
		}
	}
}

// getOnce makes one attempt at get; retry says whether another is worth making.
func (c *imdsClient) getOnce(ctx context.Context, path string) (body []byte, retry bool, err error) {
	token, retry, err := c.sessionToken(ctx)
	if err != nil {
		return nil, retry, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.endpoint+path, nil)
	if err != nil {
		return nil, false, err
	}
	req.Header.Set(imdsTokenHeader, token)
	ans, err := c.send(req)
	switch {
	case err != nil:
		return nil, retryableRead(err), err
	case ans.status == http.StatusOK:
		return ans.body, false, nil
	case ans.status == http.StatusUnauthorized:
		c.dropToken(token) // expired or unknown: the next attempt fetches another
		return nil, true, &imdsStatusError{http.MethodGet, path, ans.status}
	}
	return nil, retryableStatus(ans.status), &imdsStatusError{http.MethodGet, path, ans.status}
}

// sessionToken returns the session token, fetching a new one when there is none or it
// is about to expire.
func (c *imdsClient) sessionToken(ctx context.Context) (token string, retry bool, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.token != "" && time.Now().Before(c.renewAt) {
		return c.token, false, nil
	}
	c.token = ""
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, c.endpoint+imdsTokenPath, nil)
	if err != nil {
		return "", false, err
	}
	req.Header.Set(imdsTTLHeader, strconv.Itoa(int(c.ttl/time.Second)))
	asked := time.Now()
	ans, err := c.send(req)
	switch {
	case err != nil:
		return "", retryableRead(err), fmt.Errorf("IMDS session token: %w", err)
	case ans.status != http.StatusOK:
		// 403, 404 and 405 mean a service without IMDSv2 (or a proxy in the way); 400 a
		// refused TTL. None of them changes by asking again.
		return "", retryableStatus(ans.status), &imdsStatusError{http.MethodPut, imdsTokenPath, ans.status}
	case len(ans.body) == 0:
		return "", false, errors.New("IMDS session token: empty answer")
	}
	// The service says how long the token lives; it is not trusted to say longer than
	// asked.
	ttl := c.ttl
	if s, err := strconv.Atoi(ans.header.Get(imdsTTLHeader)); err == nil && s > 0 {
		ttl = min(ttl, time.Duration(s)*time.Second)
	}
	c.token = string(ans.body)
	// Renew a tenth of the lifetime early (at most 30 s): a request sent just before the
	// token expires must not arrive after.
	c.renewAt = asked.Add(ttl - min(ttl/10, 30*time.Second))
	return c.token, false, nil
}

// dropToken forgets token, unless another request has already replaced it.
func (c *imdsClient) dropToken(token string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.token == token {
		c.token = ""
	}
}

// imdsAnswer is an answer of IMDS.
type imdsAnswer struct {
	status int
	header http.Header
	body   []byte
}

// send sends req and reads the answer, cut off at source.MaxConfigSize.
func (c *imdsClient) send(req *http.Request) (imdsAnswer, error) {
	resp, err := c.http.Do(req)
	if err != nil {
		return imdsAnswer{}, err
	}
	defer resp.Body.Close()
	body, err := source.ReadLimited(resp.Body, source.MaxConfigSize, "imds "+req.Method+" "+req.URL.Path)
	if err != nil {
		return imdsAnswer{}, err
	}
	return imdsAnswer{resp.StatusCode, resp.Header, body}, nil
}

// retryableRead reports whether a request that failed with err (no answer, or one cut
// short) is worth sending again: not when the answer was too large.
func retryableRead(err error) bool {
	var tooLarge *source.TooLargeError
	return !errors.As(err, &tooLarge)
}

// retryableStatus reports whether an answer with status is worth asking again for: the
// server's trouble (5xx) or its throttling (429).
func retryableStatus(status int) bool {
	return status >= 500 || status == http.StatusTooManyRequests
}

// region reads the instance's region.
func (c *imdsClient) region(ctx context.Context) (string, error) {
	b, err := c.metadata(ctx, "placement/region")
	if err != nil {
		return "", fmt.Errorf("region from IMDS: %w", err)
	}
	region := strings.TrimSpace(string(b))
	if !validRegion(region) {
		return "", fmt.Errorf("region from IMDS: %q is not an AWS region name", region)
	}
	return region, nil
}

// validRegion reports whether s looks like an AWS region name (eu-west-1): it goes into
// endpoint host names.
func validRegion(s string) bool {
	if s == "" || len(s) > 64 || s[0] == '-' || s[len(s)-1] == '-' {
		return false
	}
	for _, c := range s {
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}
