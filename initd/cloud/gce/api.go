package gce

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/kilnproject/kiln/internal/bounded"
	"github.com/kilnproject/kiln/internal/fetch"
	"github.com/kilnproject/kiln/internal/percent"
	"github.com/kilnproject/kiln/internal/poll"
)

// The node's calls to Google's JSON REST APIs (Compute Engine v1, Cloud DNS v1): the
// request the generated Go clients build for each (the base URL, or node.yaml's endpoint in
// its place, with the method's path resolved against it; alt=json and prettyPrint=false),
// the instance's bearer token, Google's error answers read into an *APIError, and a few
// more attempts after an answer or a failure that says to try again.

const (
	// apiTimeout bounds one request to an API, its answer included: longer than the two
	// minutes zoneOperations.wait may hold its answer back.
	apiTimeout = 3 * time.Minute
	// maxAPIAnswer caps what is read of one answer (a page of a list is far less).
	maxAPIAnswer = 32 << 20
	// apiAttempts bounds the attempts of one call.
	apiAttempts = 5
	// userAgent names kiln-init to the APIs and the metadata server.
	userAgent = "kiln-init"
)

// apiBackoff paces the attempts of a call and of a metadata lookup: 100 ms, doubling, up to
// 30 s, each pause drawn at random below that. It is the backoff of the Go clients' retrying
// calls (google.golang.org/api's gensupport, which retries until the context ends, and the
// metadata package, which retries five times); their Compute and Cloud DNS calls sent each
// request once. Here an API call makes apiAttempts attempts at most.
func apiBackoff() poll.Backoff {
	return poll.Backoff{Initial: 100 * time.Millisecond, Factor: 2, Max: 30 * time.Second, Jitter: 1}
}

// APIError is an error answer of a Google API: its HTTP status and what the body
// {"error":{"code":…,"message":…,"status":…,"errors":[{"reason":…}]}} says.
type APIError struct {
	// Code is the answer's HTTP status code.
	Code int
	// Message is error.message; for an answer that is not Google's JSON error, the start
	// of the body.
	Message string
	// Status is error.status (NOT_FOUND), when the answer has one.
	Status string
	// Reasons are error.errors[].reason: notFound, conditionNotMet,
	// resourceInUseByAnotherResource…
	Reasons []string
}

func (e *APIError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "HTTP %d", e.Code)
	switch {
	case len(e.Reasons) > 0:
		b.WriteString(" " + strings.Join(e.Reasons, ", "))
	case e.Status != "":
		b.WriteString(" " + e.Status)
	}
	if e.Message != "" {
		b.WriteString(": " + e.Message)
	}
	return b.String()
}

// HasReason reports whether one of the answer's errors has reason.
func (e *APIError) HasReason(reason string) bool { return slices.Contains(e.Reasons, reason) }

// decodeAPIError reads an answer of HTTP status code with body.
func decodeAPIError(code int, body []byte) *APIError {
	e := &APIError{Code: code}
	var reply struct {
		Error *struct {
			Message string `json:"message"`
			Status  string `json:"status"`
			Errors  []struct {
				Reason  string `json:"reason"`
				Message string `json:"message"`
			} `json:"errors"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &reply) != nil || reply.Error == nil {
		e.Message = excerpt(body)
		return e
	}
	e.Message, e.Status = reply.Error.Message, reply.Error.Status
	for _, item := range reply.Error.Errors {
		if item.Reason != "" {
			e.Reasons = append(e.Reasons, item.Reason)
		}
		if e.Message == "" {
			e.Message = item.Message
		}
	}
	return e
}

// excerpt is the start of an answer that is not Google's JSON, quoted.
func excerpt(body []byte) string {
	const most = 200
	s := strings.TrimSpace(string(body))
	if s == "" {
		return ""
	}
	if len(s) > most {
		return fmt.Sprintf("%q…", s[:most])
	}
	return fmt.Sprintf("%q", s)
}

// retryableStatus reports whether an answer's status says to try again: 429 and 5xx.
func retryableStatus(code int) bool {
	return code == http.StatusTooManyRequests || code >= 500
}

// tokenSource gives the bearer token of a request.
type tokenSource interface {
	token(ctx context.Context) (string, error)
}

// apiClient calls one Google API.
type apiClient struct {
	// base is the URL the methods' paths resolve against.
	base *url.URL
	http *http.Client
	// tokens gives each request's bearer token; nil sends none.
	tokens tokenSource
	// header is sent with every request.
	header http.Header
	retry  fetch.Retry
}

// newAPIClient is a client of the API at endpoint, a base URL taken as the generated
// clients take option.WithEndpoint's: the methods' paths resolve against it as relative
// references, so it ends in / (https://compute.googleapis.com/compute/v1/).
func newAPIClient(endpoint string, tokens tokenSource) (*apiClient, error) {
	base, err := url.Parse(endpoint)
	if err != nil || (base.Scheme != "https" && base.Scheme != "http") || base.Host == "" {
		return nil, fmt.Errorf("endpoint %q is not an http(s) URL", endpoint)
	}
	return &apiClient{
		base:   base,
		http:   &http.Client{Timeout: apiTimeout},
		tokens: tokens,
		header: http.Header{},
		retry:  fetch.Retry{Attempts: apiAttempts, Backoff: apiBackoff()},
	}, nil
}

// url is the URL of the method at path (its segments, escaped here) with query.
func (c *apiClient) url(path []string, query url.Values) *url.URL {
	segs := make([]string, len(path))
	for i, s := range path {
		segs[i] = escapeSegment(s)
	}
	u := c.base.ResolveReference(&url.URL{Path: strings.Join(path, "/"), RawPath: strings.Join(segs, "/")})
	q := url.Values{"alt": {"json"}, "prettyPrint": {"false"}}
	for k, v := range query {
		q[k] = v
	}
	u.RawQuery = q.Encode()
	return u
}

// escapeSegment escapes a path segment as the generated clients expand a {name} of a
// path template (RFC 6570): every byte but an unreserved character (letters, digits,
// "-", ".", "_" and "~") percent-encoded.
func escapeSegment(s string) string { return percent.Encode(s, "") }

// call sends method to path (its segments unescaped) with query and in (when not nil) as
// the JSON body, and decodes the answer into out (when not nil). A 429, a 5xx or a failure
// to get an answer is tried again, up to apiAttempts in all; Google's error answers are
// *APIError.
func (c *apiClient) call(ctx context.Context, method string, path []string, query url.Values, in, out any) error {
	u := c.url(path, query)
	var body []byte
	if in != nil {
		var err error
		if body, err = json.Marshal(in); err != nil {
			return fmt.Errorf("%s %s: %w", method, redacted(u), err)
		}
	}
	err := c.retry.Do(ctx, method+" "+redacted(u), func(ctx context.Context) error {
		return c.once(ctx, method, u, body, out)
	})
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, redacted(u), err)
	}
	return nil
}

// once makes one attempt of a call; an error another attempt cannot change is marked
// fetch.Permanent.
func (c *apiClient) once(ctx context.Context, method string, u *url.URL, body []byte, out any) error {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), rd)
	if err != nil {
		return fetch.Permanent(err)
	}
	for k, v := range c.header {
		req.Header[k] = v
	}
	req.Header.Set("User-Agent", userAgent)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.tokens != nil {
		tok, err := c.tokens.token(ctx)
		if err != nil {
			return fetch.Permanent(fmt.Errorf("access token: %w", err))
		}
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := fetch.Do(c.http, req)
	switch {
	case fetch.IsPermanent(err):
		return err
	case err != nil:
		return unwrapURLError(err)
	}
	defer resp.Body.Close()
	tooLarge := fmt.Errorf("the answer is larger than %d MiB", maxAPIAnswer>>20)
	data, err := bounded.ReadAll(resp.Body, maxAPIAnswer, tooLarge)
	switch {
	case errors.Is(err, tooLarge):
		return fetch.Permanent(err)
	case err != nil:
		return fmt.Errorf("read the answer: %w", err)
	case (resp.StatusCode < 200 || resp.StatusCode > 299) && retryableStatus(resp.StatusCode):
		return decodeAPIError(resp.StatusCode, data)
	case resp.StatusCode < 200 || resp.StatusCode > 299:
		return fetch.Permanent(decodeAPIError(resp.StatusCode, data))
	case out == nil:
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fetch.Permanent(fmt.Errorf("decode the answer: %w", err))
	}
	return nil
}

// unwrapURLError drops the method and URL that http.Client puts in its errors: call
// names them once.
func unwrapURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// redacted is u without its query, for errors.
func redacted(u *url.URL) string {
	v := *u
	v.RawQuery = ""
	return v.Redacted()
}

// listPage is a page of a list method's answer.
type listPage interface {
	nextPage() string
}

// listAll calls the list method at path with query, and again with each answer's
// nextPageToken as pageToken until an answer has none, handing each page to each.
func listAll[T any, P interface {
	*T
	listPage
}](ctx context.Context, c *apiClient, path []string, query url.Values, each func(P)) error {
	q := url.Values{}
	for k, v := range query {
		q[k] = v
	}
	for {
		page := P(new(T))
		if err := c.call(ctx, http.MethodGet, path, q, nil, page); err != nil {
			return err
		}
		each(page)
		next := page.nextPage()
		if next == "" {
			return nil
		}
		q.Set("pageToken", next)
	}
}
