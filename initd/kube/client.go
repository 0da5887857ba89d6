package kube

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
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

	"gopkg.in/yaml.v3"
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

// kubeconfig is the part of a clientcmd v1 file LoadKubeconfig reads.
type kubeconfig struct {
	Kind     string `yaml:"kind"`
	Clusters []struct {
		Name    string `yaml:"name"`
		Cluster struct {
			Server        string `yaml:"server"`
			CAData        string `yaml:"certificate-authority-data"`
			CAFile        string `yaml:"certificate-authority"`
			TLSServerName string `yaml:"tls-server-name"`
		} `yaml:"cluster"`
	} `yaml:"clusters"`
	Users []struct {
		Name string `yaml:"name"`
		User struct {
			CertData  string `yaml:"client-certificate-data"`
			CertFile  string `yaml:"client-certificate"`
			KeyData   string `yaml:"client-key-data"`
			KeyFile   string `yaml:"client-key"`
			Token     string `yaml:"token"`
			TokenFile string `yaml:"tokenFile"`
		} `yaml:"user"`
	} `yaml:"users"`
	Contexts []struct {
		Name    string `yaml:"name"`
		Context struct {
			Cluster string `yaml:"cluster"`
			User    string `yaml:"user"`
		} `yaml:"context"`
	} `yaml:"contexts"`
	CurrentContext string `yaml:"current-context"`
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
	var kc kubeconfig
	if err := yaml.Unmarshal(data, &kc); err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", path, err)
	}
	if kc.Kind != "" && kc.Kind != "Config" {
		return nil, fmt.Errorf("kubeconfig %s: kind is %q, not Config", path, kc.Kind)
	}
	ctxName := kc.CurrentContext
	if ctxName == "" && len(kc.Contexts) == 1 {
		ctxName = kc.Contexts[0].Name
	}
	var clusterName, userName string
	found := false
	for _, c := range kc.Contexts {
		if c.Name == ctxName {
			clusterName, userName, found = c.Context.Cluster, c.Context.User, true
		}
	}
	if !found {
		return nil, fmt.Errorf("kubeconfig %s: current-context %q is not among the contexts", path, ctxName)
	}
	file := func(field, name string) ([]byte, error) {
		if !filepath.IsAbs(name) {
			name = filepath.Join(filepath.Dir(path), name)
		}
		b, err := os.ReadFile(filepath.Join(root, name))
		if err != nil {
			return nil, fmt.Errorf("kubeconfig %s: %s: %w", path, field, err)
		}
		return b, nil
	}
	b64 := func(field, s string) ([]byte, error) {
		b, err := base64.StdEncoding.DecodeString(s)
		if err != nil {
			return nil, fmt.Errorf("kubeconfig %s: %s: %w", path, field, err)
		}
		return b, nil
	}
	pick := func(field, data, fileName string) ([]byte, error) {
		switch {
		case data != "":
			return b64(field+"-data", data)
		case fileName != "":
			return file(field, fileName)
		}
		return nil, nil
	}

	tlsConf := &tls.Config{MinVersion: tls.VersionTLS12}
	c := &Client{}
	clusterFound, userFound := false, false
	for _, cl := range kc.Clusters {
		if cl.Name != clusterName {
			continue
		}
		clusterFound = true
		c.Server = strings.TrimSuffix(cl.Cluster.Server, "/")
		tlsConf.ServerName = cl.Cluster.TLSServerName
		ca, err := pick("certificate-authority", cl.Cluster.CAData, cl.Cluster.CAFile)
		if err != nil {
			return nil, err
		}
		if len(ca) > 0 {
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(ca) {
				return nil, fmt.Errorf("kubeconfig %s: cluster %s: no PEM certificate in the certificate authority", path, clusterName)
			}
			tlsConf.RootCAs = pool
		}
	}
	for _, u := range kc.Users {
		if u.Name != userName {
			continue
		}
		userFound = true
		cert, err := pick("client-certificate", u.User.CertData, u.User.CertFile)
		if err != nil {
			return nil, err
		}
		key, err := pick("client-key", u.User.KeyData, u.User.KeyFile)
		if err != nil {
			return nil, err
		}
		if len(cert) > 0 || len(key) > 0 {
			pair, err := tls.X509KeyPair(cert, key)
			if err != nil {
				return nil, fmt.Errorf("kubeconfig %s: user %s: %w", path, userName, err)
			}
			tlsConf.Certificates = []tls.Certificate{pair}
		}
		c.Token = u.User.Token
		if c.Token == "" && u.User.TokenFile != "" {
			b, err := file("tokenFile", u.User.TokenFile)
			if err != nil {
				return nil, err
			}
			c.Token = strings.TrimSpace(string(b))
		}
	}
	if !clusterFound || !userFound {
		return nil, fmt.Errorf("kubeconfig %s: cluster %q or user %q of context %q is missing", path, clusterName, userName, ctxName)
	}
	if c.Server == "" {
		return nil, fmt.Errorf("kubeconfig %s: cluster %s has no server", path, clusterName)
	}
	c.HTTP = newHTTPClient(tlsConf)
	return c, nil
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
func (c *Client) Ready(ctx context.Context) error {
	var body string
	if err := c.Get(ctx, "/readyz", &body); err != nil {
		return err
	}
	if strings.TrimSpace(body) != "ok" {
		return fmt.Errorf("GET /readyz: %q", strings.TrimSpace(body))
	}
	return nil
}
