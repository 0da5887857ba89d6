package aws

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/kilnproject/kiln/internal/bounded"
)

// What the EC2 and Route 53 clients share: sending a signed request to an API endpoint,
// trying again on throttling and server errors, and AWS's error answers as *APIError.

const (
	// apiAttempts is how often a call is tried: an answer AWS marks as throttling, a
	// 5xx, a 429 or no answer at all is tried again, after a random pause of up to 50 ms,
	// then 100 ms (1 s, then 2 s, after throttling). The AWS SDK's standard retryer made
	// 3 attempts with such pauses too. Every attempt is signed anew.
	apiAttempts = 3
	// apiAttemptTimeout bounds one attempt, and maxAPIAnswer the answer it reads.
	apiAttemptTimeout = time.Minute
	maxAPIAnswer      = 16 << 20
)

// APIError is an AWS API's error answer: the call, the HTTP status, and AWS's error code
// and message ("IncorrectState", "vol-0b is not 'available'").
type APIError struct {
	// Service is "EC2" or "Route 53", Op the call ("AttachVolume").
	Service, Op string
	StatusCode  int
	// Code is AWS's error code, "" when the answer carried none (a proxy's error page).
	Code      string
	Message   string
	RequestID string
}

func (e *APIError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s: ", e.Service, e.Op)
	if e.Code != "" {
		b.WriteString(e.Code)
	} else {
		fmt.Fprintf(&b, "HTTP %d %s", e.StatusCode, http.StatusText(e.StatusCode))
	}
	if e.Message != "" {
		b.WriteString(": " + e.Message)
	}
	if e.Code != "" || e.RequestID != "" {
		fmt.Fprintf(&b, " (HTTP %d", e.StatusCode)
		if e.RequestID != "" {
			b.WriteString(", request " + e.RequestID)
		}
		b.WriteString(")")
	}
	return b.String()
}

// throttled reports whether e is AWS asking the caller to slow down.
func (e *APIError) throttled() bool {
	switch e.Code {
	case "Throttling", "ThrottlingException", "ThrottledException", "RequestThrottledException",
		"TooManyRequestsException", "RequestLimitExceeded", "RequestThrottled", "SlowDown",
		"PriorRequestNotComplete", "EC2ThrottledException", "BandwidthLimitExceeded":
		return true
	}
	return e.StatusCode == http.StatusTooManyRequests
}

// retryable reports whether the call that failed with e may succeed when sent again.
func (e *APIError) retryable() bool {
	switch {
	case e.throttled(), e.Code == "RequestTimeout", e.Code == "RequestTimeoutException":
		return true
	}
	switch e.StatusCode {
	case http.StatusInternalServerError, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	return false
}

// errorDecoder reads an API's error answer into e's Code, Message and RequestID.
type errorDecoder func(body []byte, e *APIError)

// apiClient sends the requests of one AWS API: to its endpoint, SigV4-signed with
// creds for signingName in region.
type apiClient struct {
	service     string // "EC2", for errors
	signingName string // "ec2"
	region      string // the region requests are signed for
	endpoint    *url.URL
	creds       credentialSource
	http        *http.Client
	decodeError errorDecoder
	// pause and throttledPause are the backoff's base after a failed attempt and after
	// throttling.
	pause, throttledPause time.Duration
}

// newAPIClient returns a client of the API at endpoint, an https URL or, for tests and
// services on the metadata network, an http one (node.yaml's aws.endpoints are checked so).
func newAPIClient(service, signingName, region, endpoint string, creds credentialSource, decode errorDecoder) (*apiClient, error) {
	u, err := url.Parse(endpoint)
	if err != nil || u.Host == "" || (u.Scheme != "https" && u.Scheme != "http") {
		return nil, fmt.Errorf("%s endpoint %q is not an http(s) URL", service, endpoint)
	}
	u.Path, u.RawPath = strings.TrimSuffix(u.Path, "/"), strings.TrimSuffix(u.RawPath, "/")
	return &apiClient{service: service, signingName: signingName, region: region, endpoint: u, creds: creds,
		http: newAPIHTTPClient(), decodeError: decode, pause: 50 * time.Millisecond, throttledPause: time.Second}, nil
}

// newAPIHTTPClient is the HTTP client of the API calls: each attempt bounded, no redirect
// followed (a signed request goes where it was signed for, or nowhere).
func newAPIHTTPClient() *http.Client {
	return &http.Client{
		Timeout: apiAttemptTimeout,
		Transport: &http.Transport{
			Proxy:                 http.ProxyFromEnvironment,
			DialContext:           (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			TLSHandshakeTimeout:   10 * time.Second,
			ResponseHeaderTimeout: 30 * time.Second,
			ForceAttemptHTTP2:     true,
			MaxIdleConnsPerHost:   4,
			IdleConnTimeout:       90 * time.Second,
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// apiRequest is one call of an API.
type apiRequest struct {
	op          string
	method      string
	path        string // escaped, below the endpoint's path: "/2013-04-01/change/C1"
	query       url.Values
	contentType string
	body        []byte
}

// do sends r, trying again as apiAttempts says, and returns the body of its 2xx answer.
// An error answer is an *APIError.
func (c *apiClient) do(ctx context.Context, r apiRequest) ([]byte, error) {
	for attempt := 1; ; attempt++ {
		body, err := c.send(ctx, r)
		if err == nil {
			return body, nil
		}
		var ae *APIError
		isAPI := errors.As(err, &ae)
		retry := isAPI && ae.retryable() || !isAPI && errors.Is(err, errNoAnswer)
		if !retry || attempt == apiAttempts || ctx.Err() != nil {
			return nil, err
		}
		base := c.pause
		if isAPI && ae.throttled() {
			base = c.throttledPause
		}
		if serr := sleepCtx(ctx, backoff(attempt, base, 20*time.Second)); serr != nil {
			return nil, fmt.Errorf("%w (not tried again: %w)", err, serr)
		}
	}
}

// errNoAnswer marks a request that got no (whole) answer: worth sending again.
var errNoAnswer = errors.New("no answer")

// send makes one attempt at r.
func (c *apiClient) send(ctx context.Context, r apiRequest) ([]byte, error) {
	creds, err := c.creds.retrieve(ctx)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", c.service, r.op, err)
	}
	u := *c.endpoint
	u.RawPath = u.EscapedPath() + r.path
	if u.Path, err = url.PathUnescape(u.RawPath); err != nil {
		return nil, fmt.Errorf("%s %s: path %q: %w", c.service, r.op, r.path, err)
	}
	u.RawQuery = r.query.Encode()
	var body io.Reader
	if len(r.body) > 0 {
		body = bytes.NewReader(r.body)
	}
	req, err := http.NewRequestWithContext(ctx, r.method, u.String(), body)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", c.service, r.op, err)
	}
	if r.contentType != "" {
		req.Header.Set("Content-Type", r.contentType)
	}
	signV4(req, hexSHA256(r.body), creds, c.signingName, c.region, time.Now())
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w: %w", c.service, r.op, errNoAnswer, err)
	}
	defer resp.Body.Close()
	tooLarge := fmt.Errorf("the answer is larger than %d MiB", maxAPIAnswer>>20)
	answer, err := bounded.ReadAll(resp.Body, maxAPIAnswer, tooLarge)
	switch {
	case errors.Is(err, tooLarge):
		return nil, fmt.Errorf("%s %s: %w", c.service, r.op, err)
	case err != nil:
		return nil, fmt.Errorf("%s %s: read answer: %w: %w", c.service, r.op, errNoAnswer, err)
	}
	if resp.StatusCode/100 == 2 {
		return answer, nil
	}
	e := &APIError{Service: c.service, Op: r.op, StatusCode: resp.StatusCode}
	c.decodeError(answer, e)
	if e.Code == "" && e.Message == "" {
		e.Message = snippet(answer)
	}
	return nil, e
}

// snippet is the start of an answer that is not AWS's XML, as one line.
func snippet(b []byte) string {
	s := strings.Join(strings.Fields(string(b)), " ")
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}

// backoff is the pause after failed attempt n (from 1): a random time up to
// base·2ⁿ⁻¹, at most limit (the AWS SDK's "full jitter").
func backoff(n int, base, limit time.Duration) time.Duration {
	return rand.N(min(base<<(n-1), limit)) + 1
}

// sleepCtx pauses for d, or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Endpoints of the partitions' regions: the commercial one, China and GovCloud. Other
// partitions need node.yaml's aws.endpoints.

// dnsSuffix is the domain of region's partition.
func dnsSuffix(region string) string {
	if strings.HasPrefix(region, "cn-") {
		return "amazonaws.com.cn"
	}
	return "amazonaws.com"
}

// ec2Endpoint is EC2's regional endpoint.
func ec2Endpoint(region string) string {
	return "https://ec2." + region + "." + dnsSuffix(region)
}

// route53Endpoint is the endpoint of Route 53 (a global service) in region's partition,
// and the region requests to it are signed for.
func route53Endpoint(region string) (endpoint, signingRegion string) {
	switch {
	case strings.HasPrefix(region, "cn-"):
		return "https://route53.amazonaws.com.cn", "cn-northwest-1"
	case strings.HasPrefix(region, "us-gov-"):
		return "https://route53.us-gov.amazonaws.com", "us-gov-west-1"
	}
	return "https://route53.amazonaws.com", "us-east-1"
}
