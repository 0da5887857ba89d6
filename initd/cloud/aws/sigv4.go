package aws

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kilnproject/kiln/internal/percent"
)

// AWS Signature Version 4 for the requests of the node's API clients (EC2, Route 53): the
// signature goes in the Authorization header, over the method, the path, the query, the
// signed headers and the payload's SHA-256, with a key derived from the secret for the
// day, region and service. The request's own header set decides what is signed, as the
// AWS SDK's signer does, so both sign a request alike.

const (
	sigV4Algorithm = "AWS4-HMAC-SHA256"
	amzDateFormat  = "20060102T150405Z"
	scopeDate      = "20060102"
)

// awsCredentials are what a request is signed with: an access key, its secret and, for
// temporary credentials (an instance role's), the session token.
type awsCredentials struct {
	AccessKeyID, SecretAccessKey, SessionToken string
}

// signV4 signs req, whose body hashes to payloadHash (hex SHA-256), with c for service in
// region at t. It sets X-Amz-Date, X-Amz-Security-Token when c has a session token, and
// Authorization. Signed are the host (without the scheme's default port, which req.Host
// then leaves out too), Content-Length when req.ContentLength is positive, and every
// header req carries except those the HTTP stack or a proxy may change (User-Agent,
// Expect, Transfer-Encoding, X-Amzn-Trace-Id). The path is escaped a second time, as
// every service but S3 expects.
func signV4(req *http.Request, payloadHash string, c awsCredentials, service, region string, t time.Time) {
	t = t.UTC()
	amzDate := t.Format(amzDateFormat)
	req.Header.Set("X-Amz-Date", amzDate)
	if c.SessionToken != "" {
		req.Header.Set("X-Amz-Security-Token", c.SessionToken)
	}
	req.Host = signingHost(req)
	names, headers := canonicalHeaders(req)
	scope := t.Format(scopeDate) + "/" + region + "/" + service + "/aws4_request"
	canonical := strings.Join([]string{req.Method, canonicalURI(req.URL), canonicalQuery(req.URL), headers, names, payloadHash}, "\n")
	toSign := sigV4Algorithm + "\n" + amzDate + "\n" + scope + "\n" + hexSHA256([]byte(canonical))
	key := hmacSHA256([]byte("AWS4"+c.SecretAccessKey), t.Format(scopeDate))
	for _, part := range []string{region, service, "aws4_request"} {
		key = hmacSHA256(key, part)
	}
	req.Header.Set("Authorization", sigV4Algorithm+" Credential="+c.AccessKeyID+"/"+scope+
		", SignedHeaders="+names+", Signature="+hex.EncodeToString(hmacSHA256(key, toSign)))
}

// signingHost is req's host as signed and sent: req.Host, else the URL's, without the
// default port of the URL's scheme.
func signingHost(req *http.Request) string {
	host := req.Host
	if host == "" {
		host = req.URL.Host
	}
	switch {
	case req.URL.Scheme == "http" && strings.HasSuffix(host, ":80"):
		return strings.TrimSuffix(host, ":80")
	case req.URL.Scheme == "https" && strings.HasSuffix(host, ":443"):
		return strings.TrimSuffix(host, ":443")
	}
	return host
}

// signsHeader reports whether a header (by its lower-case name) is signed when present.
// Content-Length is signed from req.ContentLength, not from the header map.
func signsHeader(name string) bool {
	switch name {
	case "authorization", "user-agent", "x-amzn-trace-id", "expect", "transfer-encoding", "content-length", "host":
		return false
	}
	return true
}

// canonicalHeaders returns the signed header names ("host;x-amz-date") and the canonical
// headers, one "name:value" line each.
func canonicalHeaders(req *http.Request) (names, lines string) {
	values := map[string][]string{"host": {req.Host}}
	if req.ContentLength > 0 {
		values["content-length"] = []string{strconv.FormatInt(req.ContentLength, 10)}
	}
	for k, vs := range req.Header {
		if k := strings.ToLower(k); signsHeader(k) {
			values[k] = append(values[k], vs...)
		}
	}
	keys := make([]string, 0, len(values))
	for k := range values {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	for _, k := range keys {
		b.WriteString(k)
		b.WriteByte(':')
		for i, v := range values[k] {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(trimSpaces(v))
		}
		b.WriteByte('\n')
	}
	return strings.Join(keys, ";"), b.String()
}

// trimSpaces trims v's leading and trailing spaces and turns each run of spaces inside it
// into one.
func trimSpaces(v string) string {
	v = strings.TrimSpace(v)
	if !strings.Contains(v, "  ") {
		return v
	}
	var b strings.Builder
	for i := 0; i < len(v); i++ {
		if v[i] == ' ' && i > 0 && v[i-1] == ' ' {
			continue
		}
		b.WriteByte(v[i])
	}
	return b.String()
}

// canonicalURI is u's escaped path ("/" when empty) escaped once more: every byte but the
// unreserved characters and '/'.
func canonicalURI(u *url.URL) string {
	p := u.EscapedPath()
	if p == "" {
		return "/"
	}
	return uriEncode(p, false)
}

// canonicalQuery is u's query with each name and value URI-encoded, sorted by name, then
// value.
func canonicalQuery(u *url.URL) string {
	var pairs []string
	for k, vs := range u.Query() {
		for _, v := range vs {
			pairs = append(pairs, uriEncode(k, true)+"="+uriEncode(v, true))
		}
	}
	slices.SortFunc(pairs, func(a, b string) int {
		ak, av, _ := strings.Cut(a, "=")
		bk, bv, _ := strings.Cut(b, "=")
		if c := strings.Compare(ak, bk); c != 0 {
			return c
		}
		return strings.Compare(av, bv)
	})
	return strings.Join(pairs, "&")
}

// uriEncode percent-encodes every byte of s but the unreserved characters A-Z a-z 0-9 - _
// . ~ and, unless slash, '/'.
func uriEncode(s string, slash bool) string {
	if slash {
		return percent.Encode(s, "")
	}
	return percent.Encode(s, "/")
}

func hexSHA256(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

func hmacSHA256(key []byte, data string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(data))
	return m.Sum(nil)
}
