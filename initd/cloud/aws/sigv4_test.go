package aws

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	sdkaws "github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"

	"github.com/kilnproject/kiln/internal/cloudfake"
)

// The SigV4 test suite's credentials, time and scope.
var (
	suiteCreds = awsCredentials{AccessKeyID: "AKIDEXAMPLE", SecretAccessKey: "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"}
	suiteTime  = time.Date(2015, 8, 30, 12, 36, 0, 0, time.UTC)
)

const suiteCredential = "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, "

func sha256Hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// TestSigV4Vectors: the signer gives the Authorization AWS publishes for requests of its
// SigV4 test suite (get-vanilla and others, region us-east-1, service "service").
func TestSigV4Vectors(t *testing.T) {
	tests := []struct {
		name    string
		method  string
		url     string
		headers map[string]string
		// length is the request's Content-Length (the suite's requests carry none but one).
		length int64
		body   string
		want   string
	}{
		{name: "get-vanilla", method: "GET", url: "https://example.amazonaws.com/",
			want: suiteCredential + "SignedHeaders=host;x-amz-date, Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"},
		{name: "get-vanilla-query-order-key-case", method: "GET", url: "https://example.amazonaws.com/?Param2=value2&Param1=value1",
			want: suiteCredential + "SignedHeaders=host;x-amz-date, Signature=b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500"},
		{name: "post-vanilla", method: "POST", url: "https://example.amazonaws.com/",
			want: suiteCredential + "SignedHeaders=host;x-amz-date, Signature=5da7c1a2acd57cee7505fc6676e4e544621c30862966e37dddb68e92efbe5d6b"},
		{name: "post-vanilla-query", method: "POST", url: "https://example.amazonaws.com/?Param1=value1",
			want: suiteCredential + "SignedHeaders=host;x-amz-date, Signature=28038455d6de14eafc1f9222cf5aa6f1a96197d7deb8263271d420d138af7f11"},
		{name: "post-x-www-form-urlencoded", method: "POST", url: "https://example.amazonaws.com/",
			headers: map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, body: "Param1=value1",
			want: suiteCredential + "SignedHeaders=content-type;host;x-amz-date, Signature=ff11897932ad3f4e8b18135d722051e5ac45fc38421b1da7b9d196a0fe09473a"},
		// aws-c-auth's signed-body case: Content-Length and X-Amz-Content-Sha256 signed.
		{name: "signed body with its length", method: "POST", url: "https://example.amazonaws.com/",
			headers: map[string]string{"X-Amz-Content-Sha256": sha256Hex("hello")}, length: 5, body: "hello",
			want: suiteCredential + "SignedHeaders=content-length;host;x-amz-content-sha256;x-amz-date, Signature=8e17c5b22b7bb28da47f44b08691c087a0993d0965bfab053376360790d44d6c"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequest(tc.method, tc.url, nil)
			if err != nil {
				t.Fatal(err)
			}
			req.ContentLength = tc.length
			for k, v := range tc.headers {
				req.Header.Set(k, v)
			}
			signV4(req, sha256Hex(tc.body), suiteCreds, "service", "us-east-1", suiteTime)
			if got := req.Header.Get("Authorization"); got != tc.want {
				t.Errorf("Authorization\n got  %s\n want %s", got, tc.want)
			}
			if got := req.Header.Get("X-Amz-Date"); got != "20150830T123600Z" {
				t.Errorf("X-Amz-Date = %q", got)
			}
			if req.Header.Get("X-Amz-Security-Token") != "" {
				t.Errorf("X-Amz-Security-Token set without a session token")
			}
		})
	}
}

// sigv4Request is a request as the API clients send them, signed by one signer or the
// other.
type sigv4Request struct {
	name, method, url string
	headers           map[string][]string
	body              string
	service, region   string
	creds             awsCredentials
}

// build makes r's request, its body hash and the signing time.
func (r sigv4Request) build(t *testing.T) (*http.Request, string) {
	t.Helper()
	var body io.Reader
	if r.body != "" {
		body = strings.NewReader(r.body)
	}
	req, err := http.NewRequest(r.method, r.url, body)
	if err != nil {
		t.Fatal(err)
	}
	for k, vs := range r.headers {
		req.Header[k] = vs
	}
	return req, sha256Hex(r.body)
}

var roleCreds = awsCredentials{AccessKeyID: "ASIAKILNTEST", SecretAccessKey: "kiln/role+secret", SessionToken: "kiln-session-token/with+odd=chars"}

// sigv4Requests are requests shaped as the EC2 and Route 53 clients send them, and some
// odd ones.
var sigv4Requests = []sigv4Request{
	{name: "EC2 form POST with a session token", method: "POST", url: "https://ec2.eu-west-1.amazonaws.com/",
		headers: map[string][]string{"Content-Type": {"application/x-www-form-urlencoded"}},
		body:    "Action=DescribeVolumes&Filter.1.Name=tag%3Akubernetes.io%2Fcluster%2Fprod&Filter.1.Value.1=owned&Version=2016-11-15",
		service: "ec2", region: "eu-west-1", creds: roleCreds},
	{name: "Route 53 list with a name, a type and an identifier", method: "GET",
		url:     "https://route53.amazonaws.com/2013-04-01/hostedzone/Z0KILN12345/rrset?name=api.internal.example.test.&type=A&identifier=a+b%2Fc~%2A&maxitems=10",
		service: "route53", region: "us-east-1", creds: roleCreds},
	{name: "Route 53 change batch", method: "POST", url: "https://route53.amazonaws.com/2013-04-01/hostedzone/Z0KILN12345/rrset",
		headers: map[string][]string{"Content-Type": {"application/xml"}},
		body:    `<?xml version="1.0" encoding="UTF-8"?><ChangeResourceRecordSetsRequest xmlns="https://route53.amazonaws.com/doc/2013-04-01/"></ChangeResourceRecordSetsRequest>`,
		service: "route53", region: "us-east-1", creds: suiteCreds},
	{name: "endpoint with a path prefix, a port and an escaped path", method: "GET", url: "http://127.0.0.1:8443/prefix/2013-04-01/change/C%2F1%20x",
		service: "route53", region: "us-east-1", creds: roleCreds},
	{name: "default https port left out", method: "GET", url: "https://example.amazonaws.com:443/?b=2&a=1&a=0",
		service: "service", region: "us-east-1", creds: suiteCreds},
	{name: "default http port left out", method: "GET", url: "http://example.amazonaws.com:80/",
		service: "service", region: "us-east-1", creds: suiteCreds},
	{name: "headers with runs of spaces, repeated, and unsigned ones", method: "GET", url: "https://example.amazonaws.com/",
		headers: map[string][]string{"My-Header1": {"  a   b  c "}, "My-Header2": {"v2", "v1"}, "User-Agent": {"kiln"}, "Expect": {"100-continue"}},
		service: "service", region: "us-east-1", creds: suiteCreds},
}

// TestSigV4MatchesSDK: for the requests the clients send, the signer signs as the SDK's
// does (the independent reference the fakes check against), session token included.
func TestSigV4MatchesSDK(t *testing.T) {
	now := time.Now()
	for _, r := range sigv4Requests {
		t.Run(r.name, func(t *testing.T) {
			mine, hash := r.build(t)
			signV4(mine, hash, r.creds, r.service, r.region, now)

			sdk, hash := r.build(t)
			sdk.Host = signingHost(sdk) // the SDK's signer leaves the default port out as well
			c := sdkaws.Credentials{AccessKeyID: r.creds.AccessKeyID, SecretAccessKey: r.creds.SecretAccessKey, SessionToken: r.creds.SessionToken}
			if err := v4.NewSigner().SignHTTP(context.Background(), c, sdk, hash, r.service, r.region, now); err != nil {
				t.Fatal(err)
			}
			for _, h := range []string{"Authorization", "X-Amz-Date", "X-Amz-Security-Token"} {
				if got, want := mine.Header.Get(h), sdk.Header.Get(h); got != want {
					t.Errorf("%s\n got  %s\n want %s", h, got, want)
				}
			}
			if mine.Host != sdk.Host {
				t.Errorf("Host = %q, the SDK's %q", mine.Host, sdk.Host)
			}
			if r.creds.SessionToken != "" && !strings.Contains(mine.Header.Get("Authorization"), ";x-amz-security-token,") {
				t.Errorf("the session token is not signed: %s", mine.Header.Get("Authorization"))
			}
		})
	}
}

// TestSigV4AcceptedByFakes: cloudfake's check, which AWS's refusals are modelled on,
// accepts what the signer signs, and refuses it with another secret or session token.
func TestSigV4AcceptedByFakes(t *testing.T) {
	for _, r := range sigv4Requests {
		t.Run(r.name, func(t *testing.T) {
			req, hash := r.build(t)
			signV4(req, hash, r.creds, r.service, r.region, time.Now())
			fake := cloudfake.AWSCredentials{AccessKeyID: r.creds.AccessKeyID, SecretAccessKey: r.creds.SecretAccessKey, SessionToken: r.creds.SessionToken}
			if _, err := cloudfake.CheckSigV4(req, []byte(r.body), fake); err != nil {
				t.Errorf("refused: %v", err)
			}
			other := fake
			other.SecretAccessKey += "x"
			if _, err := cloudfake.CheckSigV4(req, []byte(r.body), other); err == nil {
				t.Errorf("accepted with another secret")
			}
			other = fake
			other.SessionToken += "x"
			if _, err := cloudfake.CheckSigV4(req, []byte(r.body), other); err == nil {
				t.Errorf("accepted with another session token")
			}
		})
	}
}
