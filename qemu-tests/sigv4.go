package qemutests

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
)

// roleCreds are the temporary credentials of the instance role: the IMDS fake hands them
// out, the EC2 and Route 53 fakes accept requests signed with them and nothing else.
type roleCreds struct{ key, secret, token string }

var sigV4Auth = regexp.MustCompile(`^AWS4-HMAC-SHA256 Credential=([^/]+)/(\d{8})/([^/]+)/([^/]+)/aws4_request, SignedHeaders=([a-z0-9;-]+), Signature=([0-9a-f]{64})$`)

// checkSigV4 checks r as AWS does: a SigV4 Authorization for service with c's access key,
// c's session token, a date within 15 minutes, and a signature that matches the request
// (computed again over the signed headers and the body). It returns the region signed for.
func checkSigV4(r *http.Request, body []byte, c roleCreds, service string) (string, error) {
	auth := r.Header.Get("Authorization")
	m := sigV4Auth.FindStringSubmatch(auth)
	switch {
	case m == nil:
		return "", fmt.Errorf("Authorization %q is not SigV4", auth)
	case m[1] != c.key:
		return "", fmt.Errorf("access key %s is not the instance role's", m[1])
	case m[4] != service:
		return "", fmt.Errorf("signed for service %s, not %s", m[4], service)
	case r.Header.Get("X-Amz-Security-Token") != c.token:
		return "", fmt.Errorf("X-Amz-Security-Token is not the instance role's session token")
	}
	when, err := time.Parse("20060102T150405Z", r.Header.Get("X-Amz-Date"))
	if err != nil {
		return "", fmt.Errorf("X-Amz-Date: %w", err)
	}
	if d := time.Since(when); d > 15*time.Minute || d < -15*time.Minute {
		return "", fmt.Errorf("signed at %s, %s from now (AWS allows 15 minutes)", when, d.Round(time.Second))
	}
	check, err := http.NewRequest(r.Method, "http://"+r.Host+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	check.ContentLength = r.ContentLength
	for _, h := range strings.Split(m[5], ";") {
		if h != "host" && h != "content-length" {
			check.Header[http.CanonicalHeaderKey(h)] = r.Header.Values(h)
		}
	}
	sum := sha256.Sum256(body)
	creds := aws.Credentials{AccessKeyID: c.key, SecretAccessKey: c.secret, SessionToken: c.token}
	if err := v4.NewSigner().SignHTTP(context.Background(), creds, check, hex.EncodeToString(sum[:]), service, m[3], when); err != nil {
		return "", err
	}
	if got := check.Header.Get("Authorization"); got != auth {
		return "", fmt.Errorf("signature does not match the request")
	}
	return m[3], nil
}
