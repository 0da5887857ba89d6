// Package cloudfake holds kiln's local fakes of the cloud APIs a node talks to, and the
// request checks they share, so that every fake answers and refuses requests the way the
// cloud does, written once. Each fake is an http.Handler for an httptest.Server (or any
// listener) that the official SDK clients are pointed at:
//
//   - EC2: the EC2 Query API's DescribeVolumes and AttachVolume (ec2.go);
//   - Route53: the Route 53 REST-XML API for one hosted zone (route53.go);
//   - IMDS: the EC2 instance metadata service with IMDSv2 required (imds.go);
//   - Compute: the Compute Engine v1 API's disks, instances and zone operations (compute.go);
//   - CloudDNS: the Cloud DNS v1 API for one managed zone (clouddns.go);
//   - GCEMetadata: the GCE metadata server (gcemeta.go);
//
// and CheckSigV4, the AWS SigV4 check that the EC2 and Route 53 fakes here and the EC2,
// EBS and STS fakes of the publisher tests make.
//
// A fake records the requests it refused (Refused): what a correct client never sends,
// such as an unsigned or wrongly signed request, an unknown action or filter, or a body
// the API does not take. It answers them with the cloud's own error, and a test asserts
// on the record. Answers about the state of things (a volume in use, a disk not found)
// are not refusals. A fake's exported state is guarded by its lock: a test reads or
// changes it while the fake serves only holding the lock, and hooks run holding it unless
// their documentation says otherwise.
//
// Only tests and test harnesses (the unit tests, builder/publish/publishtest and
// qemu-tests) import it.
package cloudfake

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
)

// AWSCredentials are the credentials a fake accepts.
type AWSCredentials struct {
	AccessKeyID, SecretAccessKey string
	// SessionToken, when set, must come as X-Amz-Security-Token (an instance role's
	// temporary credentials); when empty, none may.
	SessionToken string
}

// SigV4Scope is what a request's SigV4 Authorization says it was signed for.
type SigV4Scope struct {
	AccessKeyID, Region, Service string
}

// CredentialsError is a request AWS would refuse for its credentials: another access key,
// another session token, or a signature that does not match. AWS answers it with
// AuthFailure (EC2), InvalidSignatureException or UnrecognizedClientException (JSON
// APIs), SignatureDoesNotMatch (Route 53, STS).
type CredentialsError struct{ Reason string }

func (e *CredentialsError) Error() string { return e.Reason }

var sigV4Auth = regexp.MustCompile(`^AWS4-HMAC-SHA256 Credential=([^/]+)/(\d{8})/([^/]+)/([^/]+)/aws4_request, SignedHeaders=([a-z0-9;-]+), Signature=([0-9a-f]{64})$`)

// maxSkew is how far X-Amz-Date may be from now: AWS refuses a request signed more than 15
// minutes away (RequestTimeTooSkewed).
const maxSkew = 15 * time.Minute

// CheckSigV4 checks r, whose body the caller has read into body, as AWS does: a SigV4
// Authorization with creds' access key, creds' session token (or none), X-Amz-Date within 15
// minutes of now, the host and X-Amz-Date among the signed headers, and a signature that
// matches the request (computed again over the signed headers and the body, or over the
// X-Amz-Content-Sha256 the request signed). It returns the scope the request was signed
// for, as far as it could be read also when the check fails.
func CheckSigV4(r *http.Request, body []byte, creds AWSCredentials) (SigV4Scope, error) {
	auth := r.Header.Get("Authorization")
	m := sigV4Auth.FindStringSubmatch(auth)
	if m == nil {
		return SigV4Scope{}, fmt.Errorf("Authorization %q is not SigV4", auth)
	}
	scope := SigV4Scope{AccessKeyID: m[1], Region: m[3], Service: m[4]}
	signed := strings.Split(m[5], ";")
	switch {
	case m[1] != creds.AccessKeyID:
		return scope, &CredentialsError{"access key " + m[1] + " is not the one the fake accepts"}
	case r.Header.Get("X-Amz-Security-Token") != creds.SessionToken:
		return scope, &CredentialsError{"X-Amz-Security-Token is not the credentials' session token"}
	case !slices.Contains(signed, "host") || !slices.Contains(signed, "x-amz-date"):
		return scope, fmt.Errorf("signed headers %q lack host or x-amz-date", m[5])
	}
	when, err := time.Parse("20060102T150405Z", r.Header.Get("X-Amz-Date"))
	if err != nil {
		return scope, fmt.Errorf("X-Amz-Date: %w", err)
	}
	if d := time.Since(when); d > maxSkew || d < -maxSkew {
		return scope, fmt.Errorf("signed at %s, %s from now (AWS allows 15 minutes)", when, d.Round(time.Second))
	}
	check, err := http.NewRequest(r.Method, "http://"+r.Host+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		return scope, err
	}
	check.ContentLength = r.ContentLength
	for _, h := range signed {
		if h != "host" && h != "content-length" {
			check.Header[http.CanonicalHeaderKey(h)] = r.Header.Values(h)
		}
	}
	payload := r.Header.Get("X-Amz-Content-Sha256")
	if payload == "" {
		sum := sha256.Sum256(body)
		payload = hex.EncodeToString(sum[:])
	}
	c := aws.Credentials{AccessKeyID: creds.AccessKeyID, SecretAccessKey: creds.SecretAccessKey, SessionToken: creds.SessionToken}
	if err := v4.NewSigner().SignHTTP(context.Background(), c, check, payload, scope.Service, scope.Region, when); err != nil {
		return scope, err
	}
	if got := check.Header.Get("Authorization"); got != auth {
		return scope, &CredentialsError{fmt.Sprintf("signature does not match the request:\n got  %s\n want %s", auth, got)}
	}
	return scope, nil
}

// checkAWS checks r as AWS does (CheckSigV4) with creds, and that it was signed for
// service, and for region unless region is "".
func checkAWS(r *http.Request, body []byte, creds AWSCredentials, service, region string) error {
	scope, err := CheckSigV4(r, body, creds)
	switch {
	case err != nil:
		return err
	case scope.Service != service:
		return fmt.Errorf("signed for service %s, not %s", scope.Service, service)
	case region != "" && scope.Region != region:
		return fmt.Errorf("signed for region %s, the endpoint is in %s", scope.Region, region)
	}
	return nil
}
