// Package kubeconfig reads and writes kubeconfig files (clientcmd v1, kind Config): File is
// the document, Config the one cluster and one user of its current context with every
// credential as bytes.
package kubeconfig

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"

	"gopkg.in/yaml.v3"
)

// File is a kubeconfig document: the fields kiln reads and writes, in the order it writes
// them.
type File struct {
	APIVersion     string         `yaml:"apiVersion"`
	Kind           string         `yaml:"kind"`
	Clusters       []NamedCluster `yaml:"clusters"`
	Contexts       []NamedContext `yaml:"contexts"`
	CurrentContext string         `yaml:"current-context"`
	Preferences    map[string]any `yaml:"preferences"`
	Users          []NamedUser    `yaml:"users"`
}

// NamedCluster is an entry of clusters.
type NamedCluster struct {
	Name    string  `yaml:"name"`
	Cluster Cluster `yaml:"cluster"`
}

// Cluster is how to reach and trust an API server. The CA is given as data or as a file.
type Cluster struct {
	CAData        string `yaml:"certificate-authority-data,omitempty"`
	CAFile        string `yaml:"certificate-authority,omitempty"`
	Server        string `yaml:"server"`
	TLSServerName string `yaml:"tls-server-name,omitempty"`
}

// NamedContext is an entry of contexts.
type NamedContext struct {
	Name    string  `yaml:"name"`
	Context Context `yaml:"context"`
}

// Context pairs a cluster with a user, by name.
type Context struct {
	Cluster string `yaml:"cluster"`
	User    string `yaml:"user"`
}

// NamedUser is an entry of users.
type NamedUser struct {
	Name string `yaml:"name"`
	User User   `yaml:"user"`
}

// User holds a client's credentials: a certificate and key (as data or files) and/or a
// bearer token (inline or in a file).
type User struct {
	CertData  string `yaml:"client-certificate-data,omitempty"`
	CertFile  string `yaml:"client-certificate,omitempty"`
	KeyData   string `yaml:"client-key-data,omitempty"`
	KeyFile   string `yaml:"client-key,omitempty"`
	Token     string `yaml:"token,omitempty"`
	TokenFile string `yaml:"tokenFile,omitempty"`
}

// New returns an empty document: apiVersion v1, kind Config, no preferences.
func New() File {
	return File{APIVersion: "v1", Kind: "Config", Preferences: map[string]any{}}
}

// Decode parses a kubeconfig document. A kind other than Config is an error; a missing one is
// taken as Config.
func Decode(data []byte) (File, error) {
	var f File
	if err := yaml.Unmarshal(data, &f); err != nil {
		return File{}, err
	}
	if f.Kind != "" && f.Kind != "Config" {
		return File{}, fmt.Errorf("kind is %q, not Config", f.Kind)
	}
	return f, nil
}

// Encode renders f as YAML indented by two spaces.
func (f File) Encode() ([]byte, error) {
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(f); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// current returns the current context: current-context, or the only context when that is
// empty.
func (f File) current() (NamedContext, error) {
	name := f.CurrentContext
	if name == "" && len(f.Contexts) == 1 {
		name = f.Contexts[0].Name
	}
	for _, c := range f.Contexts {
		if c.Name == name {
			return c, nil
		}
	}
	return NamedContext{}, fmt.Errorf("current-context %q is not among the contexts", name)
}

// ReadFunc reads a credential that a kubeconfig names by file; field is the kubeconfig
// field that names it, for errors.
type ReadFunc func(field, name string) ([]byte, error)

// Resolve reads the current context's cluster and user into a Config. Credentials given as
// files are read with read; when read is nil, such a credential is an error.
func (f File) Resolve(read ReadFunc) (Config, error) {
	ctx, err := f.current()
	if err != nil {
		return Config{}, err
	}
	cl, u, err := f.pair(ctx)
	if err != nil {
		return Config{}, err
	}
	r := resolver{read: read}
	c := Config{Cluster: ctx.Context.Cluster, User: ctx.Context.User, Server: cl.Server, TLSServerName: cl.TLSServerName}
	c.CAPEM = r.pick("certificate-authority", cl.CAData, cl.CAFile)
	c.CertPEM = r.pick("client-certificate", u.CertData, u.CertFile)
	c.KeyPEM = r.pick("client-key", u.KeyData, u.KeyFile)
	c.Token = u.Token
	if c.Token == "" && u.TokenFile != "" {
		c.Token = strings.TrimSpace(string(r.file("tokenFile", u.TokenFile)))
	}
	if r.err != nil {
		return Config{}, r.err
	}
	if c.Server == "" {
		return Config{}, fmt.Errorf("cluster %s has no server", c.Cluster)
	}
	return c, nil
}

// AddServerContext adds a context name that reaches server as the current context reaches its
// own: the current context's cluster (CA, tls-server-name) under name with server instead, and
// the current context's user.
func (f *File) AddServerContext(name, server string) error {
	ctx, err := f.current()
	if err != nil {
		return err
	}
	cl, _, err := f.pair(ctx)
	if err != nil {
		return err
	}
	c := *cl
	c.Server = server
	f.Clusters = append(f.Clusters, NamedCluster{Name: name, Cluster: c})
	f.Contexts = append(f.Contexts, NamedContext{Name: name, Context: Context{Cluster: name, User: ctx.Context.User}})
	return nil
}

// pair finds the cluster and the user ctx names.
func (f File) pair(ctx NamedContext) (*Cluster, *User, error) {
	var cl *Cluster
	var u *User
	for i := range f.Clusters {
		if f.Clusters[i].Name == ctx.Context.Cluster && cl == nil {
			cl = &f.Clusters[i].Cluster
		}
	}
	for i := range f.Users {
		if f.Users[i].Name == ctx.Context.User && u == nil {
			u = &f.Users[i].User
		}
	}
	if cl == nil || u == nil {
		return nil, nil, fmt.Errorf("cluster %q or user %q of context %q is missing", ctx.Context.Cluster, ctx.Context.User, ctx.Name)
	}
	return cl, u, nil
}

// resolver reads credentials and keeps the first error.
type resolver struct {
	read ReadFunc
	err  error
}

// pick returns field's data (<field>-data, base64) or else the file it names.
func (r *resolver) pick(field, data, file string) []byte {
	switch {
	case data != "":
		b, err := base64.StdEncoding.DecodeString(data)
		if err != nil && r.err == nil {
			r.err = fmt.Errorf("%s-data: %w", field, err)
		}
		return b
	case file != "":
		return r.file(field, file)
	}
	return nil
}

func (r *resolver) file(field, name string) []byte {
	if r.err != nil {
		return nil
	}
	if r.read == nil {
		r.err = fmt.Errorf("%s: refers to the file %s; only embedded data is read here", field, name)
		return nil
	}
	b, err := r.read(field, name)
	if err != nil {
		r.err = fmt.Errorf("%s: %w", field, err)
	}
	return b
}

// Config is a kubeconfig with one cluster, one user and one context, <user>@<cluster> as
// kubeadm names it, every credential held as bytes.
type Config struct {
	Cluster       string // cluster name; kubeadm uses "kubernetes"
	Server        string // https://host:port
	CAPEM         []byte // certificate-authority(-data)
	User          string
	CertPEM       []byte // client-certificate(-data)
	KeyPEM        []byte // client-key(-data)
	Token         string // bearer token (bootstrap token for a kubelet)
	TLSServerName string // tls-server-name: the name to check the server's certificate against
}

// Context is the context's name, <user>@<cluster>.
func (c Config) Context() string { return c.User + "@" + c.Cluster }

// Parse reads the current context of a kubeconfig whose credentials are embedded (as Marshal
// writes it, or kubeadm).
func Parse(data []byte) (Config, error) {
	f, err := Decode(data)
	if err != nil {
		return Config{}, fmt.Errorf("kubeconfig: %w", err)
	}
	c, err := f.Resolve(nil)
	if err != nil {
		return Config{}, fmt.Errorf("kubeconfig: %w", err)
	}
	return c, nil
}

// file returns c as a document with the credentials embedded as *-data.
func (c Config) file() File {
	f := New()
	f.Clusters = []NamedCluster{{Name: c.Cluster, Cluster: Cluster{CAData: b64(c.CAPEM), Server: c.Server, TLSServerName: c.TLSServerName}}}
	f.Contexts = []NamedContext{{Name: c.Context(), Context: Context{Cluster: c.Cluster, User: c.User}}}
	f.CurrentContext = c.Context()
	f.Users = []NamedUser{{Name: c.User, User: User{CertData: b64(c.CertPEM), KeyData: b64(c.KeyPEM), Token: c.Token}}}
	return f
}

// Marshal renders c as YAML with the CA, client certificate and key embedded. It refuses a
// Config that cannot authenticate: no names, server or CA, a certificate without its key,
// neither a certificate nor a token.
func (c Config) Marshal() ([]byte, error) {
	switch {
	case c.Cluster == "":
		return nil, errors.New("kubeconfig: empty cluster name")
	case c.User == "":
		return nil, errors.New("kubeconfig: empty user name")
	case c.Server == "":
		return nil, errors.New("kubeconfig: empty server")
	case len(c.CAPEM) == 0:
		return nil, errors.New("kubeconfig: no CA certificate")
	case (len(c.CertPEM) == 0) != (len(c.KeyPEM) == 0):
		return nil, errors.New("kubeconfig: a client certificate needs its key and the other way round")
	case len(c.CertPEM) == 0 && c.Token == "":
		return nil, errors.New("kubeconfig: neither a client certificate nor a token")
	}
	data, err := c.file().Encode()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	return data, nil
}

func b64(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return base64.StdEncoding.EncodeToString(b)
}
