package kube

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/kilnproject/kiln/internal/kubeconfig"
)

// Client talks to the Kubernetes API over plain net/http with the credentials of one
// kubeconfig: no client-go. It does what first boot needs and nothing more: GET, create,
// server-side apply, merge patch.
type Client struct {
	// server is the API's base URL, https://host:port.
	server string
	// httpClient carries the TLS settings (CA, client certificate).
	httpClient *http.Client
	// token, when set, is sent as a bearer token.
	token string
}

// LoadKubeconfig builds a Client from the current context of the kubeconfig at path.
// Credentials may be embedded (*-data, as kubeadm and kiln write them) or files (as
// kubelet writes kubelet.conf after its TLS bootstrap: client-certificate and client-key
// pointing at /var/lib/kubelet/pki/kubelet-client-current.pem); relative file names are
// relative to the kubeconfig's directory. root ("" or "/" on a node) is prefixed to
// absolute file names inside the kubeconfig, so tests can use a node tree.
func LoadKubeconfig(root, path string) (*Client, error) {
	data, err := os.ReadFile(filepath.Join(root, path))
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	f, err := kubeconfig.Decode(data)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", path, err)
	}
	kc, err := f.Resolve(func(_, name string) ([]byte, error) {
		if !filepath.IsAbs(name) {
			name = filepath.Join(filepath.Dir(path), name)
		}
		return os.ReadFile(filepath.Join(root, name))
	})
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", path, err)
	}
	tlsConf := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: kc.TLSServerName}
	if len(kc.CAPEM) > 0 {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(kc.CAPEM) {
			return nil, fmt.Errorf("kubeconfig %s: cluster %s: no PEM certificate in the certificate authority", path, kc.Cluster)
		}
		tlsConf.RootCAs = pool
	}
	if len(kc.CertPEM) > 0 || len(kc.KeyPEM) > 0 {
		pair, err := tls.X509KeyPair(kc.CertPEM, kc.KeyPEM)
		if err != nil {
			return nil, fmt.Errorf("kubeconfig %s: user %s: %w", path, kc.User, err)
		}
		tlsConf.Certificates = []tls.Certificate{pair}
	}
	return &Client{server: strings.TrimSuffix(kc.Server, "/"), token: kc.Token, httpClient: newHTTPClient(tlsConf)}, nil
}

// newClient is a Client for server that trusts caPEM and authenticates with token (or
// not at all when token is empty).
func newClient(server string, caPEM []byte, token string) (*Client, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, errors.New("kube client: no PEM certificate in the CA")
	}
	return &Client{server: strings.TrimSuffix(server, "/"), token: token,
		httpClient: newHTTPClient(&tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool})}, nil
}

func newHTTPClient(tlsConf *tls.Config) *http.Client {
	return &http.Client{
		Timeout: 30 * time.Second,
		Transport: &http.Transport{
			TLSClientConfig:     tlsConf,
			TLSHandshakeTimeout: 10 * time.Second,
			// The API server may be slow to come up; one connection is plenty.
			MaxIdleConnsPerHost: 2,
			IdleConnTimeout:     30 * time.Second,
		},
	}
}

// apiError is a response from the API with a status other than 2xx.
type apiError struct {
	method, path string
	code         int
	// reason and message come from the Status object the API returns, when it does.
	reason, message string
}

func (e *apiError) Error() string {
	msg := e.message
	if msg == "" {
		msg = http.StatusText(e.code)
	}
	return fmt.Sprintf("%s %s: %d %s", e.method, e.path, e.code, msg)
}

// isNotFound reports whether err is a 404 from the API.
func isNotFound(err error) bool { return statusIs(err, http.StatusNotFound) }

// isConflict reports whether err is a 409 from the API.
func isConflict(err error) bool { return statusIs(err, http.StatusConflict) }

func statusIs(err error, code int) bool {
	var ae *apiError
	return errors.As(err, &ae) && ae.code == code
}

// transient reports whether a request that failed with err may succeed if repeated: the
// API is not reachable yet, is starting (5xx, 429) or a write raced another (409).
func transient(err error) bool {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae.code >= 500 || ae.code == http.StatusTooManyRequests || ae.code == http.StatusConflict
	}
	var ue *url.Error // connection refused, TLS handshake, timeout
	return errors.As(err, &ue)
}

// Content types of the API's write verbs.
const (
	contentJSON       = "application/json"
	contentApply      = "application/apply-patch+yaml"
	contentMergePatch = "application/merge-patch+json"
)

// do sends one request. body (when not nil) is sent with contentType; a 2xx answer is
// decoded into out (when not nil), anything else is an *apiError.
func (c *Client) do(ctx context.Context, method, path, contentType string, body []byte, out any) error {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.server+path, rd)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	req.Header.Set("Accept", contentJSON)
	req.Header.Set("User-Agent", "kiln-init")
	if body != nil {
		req.Header.Set("Content-Type", contentType)
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.httpClient.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 32<<20))
	if err != nil {
		return fmt.Errorf("%s %s: read answer: %w", method, path, err)
	}
	if resp.StatusCode/100 != 2 {
		ae := &apiError{method: method, path: path, code: resp.StatusCode}
		var st struct{ Reason, Message string }
		if json.Unmarshal(data, &st) == nil && (st.Reason != "" || st.Message != "") {
			ae.reason, ae.message = st.Reason, st.Message
		} else {
			ae.message = strings.TrimSpace(string(data))
		}
		return ae
	}
	if out == nil {
		return nil
	}
	if s, ok := out.(*string); ok {
		*s = string(data)
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("%s %s: decode answer: %w", method, path, err)
	}
	return nil
}

// get reads the object at path into out.
func (c *Client) get(ctx context.Context, path string, out any) error {
	return c.do(ctx, http.MethodGet, path, "", nil, out)
}

// ready asks /readyz; nil means the API server says it is ready.
func (c *Client) ready(ctx context.Context) error { return c.check(ctx, "/readyz") }

// check asks one of the API server's health endpoints (/healthz, /readyz, /livez); nil
// means it answered "ok". When it does not, the error names the checks that failed (the
// "[-]" lines of the answer) rather than every check.
func (c *Client) check(ctx context.Context, path string) error {
	var body string
	err := c.get(ctx, path, &body)
	var ae *apiError
	if errors.As(err, &ae) {
		if failed := failedChecks(ae.message); failed != "" {
			return fmt.Errorf("GET %s: %d: %s", path, ae.code, failed)
		}
	}
	if err != nil {
		return err
	}
	if strings.TrimSpace(body) != "ok" {
		return fmt.Errorf("GET %s: %q", path, strings.TrimSpace(body))
	}
	return nil
}

// failedChecks joins the "[-]name failed: reason" lines of a health endpoint's answer.
func failedChecks(answer string) string {
	var failed []string
	for _, l := range strings.Split(answer, "\n") {
		if name, ok := strings.CutPrefix(strings.TrimSpace(l), "[-]"); ok {
			failed = append(failed, name)
		}
	}
	return strings.Join(failed, "; ")
}
