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
	// Server is the API's base URL, https://host:port.
	Server string
	// HTTP carries the TLS settings (CA, client certificate).
	HTTP *http.Client
	// Token, when set, is sent as a bearer token.
	Token string
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
	return &Client{Server: strings.TrimSuffix(kc.Server, "/"), Token: kc.Token, HTTP: newHTTPClient(tlsConf)}, nil
}

// NewClient is a Client for server that trusts caPEM and authenticates with token (or
// not at all when token is empty).
func NewClient(server string, caPEM []byte, token string) (*Client, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, errors.New("kube client: no PEM certificate in the CA")
	}
	return &Client{Server: strings.TrimSuffix(server, "/"), Token: token,
		HTTP: newHTTPClient(&tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool})}, nil
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

// APIError is a response from the API with a status other than 2xx.
type APIError struct {
	Method, Path string
	Code         int
	// Reason and Message come from the Status object the API returns, when it does.
	Reason, Message string
}

func (e *APIError) Error() string {
	msg := e.Message
	if msg == "" {
		msg = http.StatusText(e.Code)
	}
	return fmt.Sprintf("%s %s: %d %s", e.Method, e.Path, e.Code, msg)
}

// IsNotFound reports whether err is a 404 from the API.
func IsNotFound(err error) bool { return statusIs(err, http.StatusNotFound) }

// IsConflict reports whether err is a 409 from the API.
func IsConflict(err error) bool { return statusIs(err, http.StatusConflict) }

func statusIs(err error, code int) bool {
	var ae *APIError
	return errors.As(err, &ae) && ae.Code == code
}

// transient reports whether a request that failed with err may succeed if repeated: the
// API is not reachable yet, is starting (5xx, 429) or a write raced another (409).
func transient(err error) bool {
	var ae *APIError
	if errors.As(err, &ae) {
		return ae.Code >= 500 || ae.Code == http.StatusTooManyRequests || ae.Code == http.StatusConflict
	}
	var ue *url.Error // connection refused, TLS handshake, timeout
	return errors.As(err, &ue)
}

// Content types of the API's write verbs.
const (
	ContentJSON       = "application/json"
	ContentApply      = "application/apply-patch+yaml"
	ContentMergePatch = "application/merge-patch+json"
)

// Do sends one request. body (when not nil) is sent with contentType; a 2xx answer is
// decoded into out (when not nil), anything else is an *APIError.
func (c *Client) Do(ctx context.Context, method, path, contentType string, body []byte, out any) error {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.Server+path, rd)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	req.Header.Set("Accept", ContentJSON)
	req.Header.Set("User-Agent", "kiln-init")
	if body != nil {
		req.Header.Set("Content-Type", contentType)
	}
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 32<<20))
	if err != nil {
		return fmt.Errorf("%s %s: read answer: %w", method, path, err)
	}
	if resp.StatusCode/100 != 2 {
		ae := &APIError{Method: method, Path: path, Code: resp.StatusCode}
		var st struct{ Reason, Message string }
		if json.Unmarshal(data, &st) == nil && (st.Reason != "" || st.Message != "") {
			ae.Reason, ae.Message = st.Reason, st.Message
		} else {
			ae.Message = strings.TrimSpace(string(data))
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

// Get reads the object at path into out.
func (c *Client) Get(ctx context.Context, path string, out any) error {
	return c.Do(ctx, http.MethodGet, path, "", nil, out)
}

// Ready asks /readyz; nil means the API server says it is ready.
func (c *Client) Ready(ctx context.Context) error { return c.Check(ctx, "/readyz") }

// Check asks one of the API server's health endpoints (/healthz, /readyz, /livez); nil
// means it answered "ok". When it does not, the error names the checks that failed (the
// "[-]" lines of the answer) rather than every check.
func (c *Client) Check(ctx context.Context, path string) error {
	var body string
	err := c.Get(ctx, path, &body)
	var ae *APIError
	if errors.As(err, &ae) {
		if failed := failedChecks(ae.Message); failed != "" {
			return fmt.Errorf("GET %s: %d: %s", path, ae.Code, failed)
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
