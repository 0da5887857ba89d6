package kubeconfig

import (
	"os"
	"reflect"
	"strings"
	"testing"
)

const embedded = `apiVersion: v1
kind: Config
clusters:
  - name: kubernetes
    cluster:
      certificate-authority-data: Q0E=
      server: https://10.0.0.1:6443
      tls-server-name: api.internal.demo.example.com
contexts:
  - name: u@kubernetes
    context:
      cluster: kubernetes
      user: u
current-context: u@kubernetes
preferences: {}
users:
  - name: u
    user:
      client-certificate-data: Q0VSVA==
      client-key-data: S0VZ
`

func TestEncodeIsStable(t *testing.T) {
	c := Config{Cluster: "kubernetes", Server: "https://10.0.0.1:6443", CAPEM: []byte("CA"), User: "u",
		CertPEM: []byte("CERT"), KeyPEM: []byte("KEY"), TLSServerName: "api.internal.demo.example.com"}
	data, err := c.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if string(data) != embedded {
		t.Errorf("Marshal:\n%s\nwant:\n%s", data, embedded)
	}
	back, err := Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, c) {
		t.Errorf("round trip: %+v, want %+v", back, c)
	}
}

func TestMarshalRefuses(t *testing.T) {
	ok := Config{Cluster: "c", Server: "https://x", CAPEM: []byte("CA"), User: "u", Token: "t"}
	tests := []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"no cluster", func(c *Config) { c.Cluster = "" }, "empty cluster name"},
		{"no user", func(c *Config) { c.User = "" }, "empty user name"},
		{"no server", func(c *Config) { c.Server = "" }, "empty server"},
		{"no CA", func(c *Config) { c.CAPEM = nil }, "no CA certificate"},
		{"certificate without key", func(c *Config) { c.CertPEM = []byte("C") }, "needs its key"},
		{"no credential", func(c *Config) { c.Token = "" }, "neither a client certificate nor a token"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := ok
			tt.edit(&c)
			if _, err := c.Marshal(); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Marshal: %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

func TestResolve(t *testing.T) {
	files := map[string]string{"/pki/ca.crt": "CA", "/pki/client.pem": "PEM", "/pki/token": " tok\n"}
	read := func(_, name string) ([]byte, error) {
		if s, ok := files[name]; ok {
			return []byte(s), nil
		}
		return nil, os.ErrNotExist
	}
	const head = "kind: Config\ncurrent-context: c\ncontexts: [{name: c, context: {cluster: k, user: u}}]\n"
	tests := []struct {
		name, doc string
		read      ReadFunc
		want      Config
		wantErr   string
	}{
		{"files", head + "clusters: [{name: k, cluster: {server: 'https://x', certificate-authority: /pki/ca.crt}}]\nusers: [{name: u, user: {client-certificate: /pki/client.pem, client-key: /pki/client.pem, tokenFile: /pki/token}}]\n",
			read, Config{Cluster: "k", User: "u", Server: "https://x", CAPEM: []byte("CA"), CertPEM: []byte("PEM"), KeyPEM: []byte("PEM"), Token: "tok"}, ""},
		{"only context without current-context", "contexts: [{name: c, context: {cluster: k, user: u}}]\nclusters: [{name: k, cluster: {server: 'https://x'}}]\nusers: [{name: u, user: {token: t}}]\n",
			nil, Config{Cluster: "k", User: "u", Server: "https://x", Token: "t"}, ""},
		{"inline token wins over a token file", head + "clusters: [{name: k, cluster: {server: 'https://x'}}]\nusers: [{name: u, user: {token: t, tokenFile: /nope}}]\n",
			nil, Config{Cluster: "k", User: "u", Server: "https://x", Token: "t"}, ""},
		{"file without a reader", head + "clusters: [{name: k, cluster: {server: 'https://x', certificate-authority: /pki/ca.crt}}]\nusers: [{name: u, user: {token: t}}]\n",
			nil, Config{}, "certificate-authority: refers to the file /pki/ca.crt"},
		{"missing file", head + "clusters: [{name: k, cluster: {server: 'https://x'}}]\nusers: [{name: u, user: {client-certificate: /nope, client-key: /nope}}]\n",
			read, Config{}, "client-certificate: file does not exist"},
		{"bad base64", head + "clusters: [{name: k, cluster: {server: 'https://x', certificate-authority-data: '***'}}]\nusers: [{name: u, user: {token: t}}]\n",
			nil, Config{}, "certificate-authority-data: illegal base64"},
		{"no such context", "kind: Config\ncurrent-context: x\n", nil, Config{}, `current-context "x" is not among the contexts`},
		{"missing cluster", head + "users: [{name: u, user: {token: t}}]\n", nil, Config{}, `cluster "k" or user "u" of context "c" is missing`},
		{"no server", head + "clusters: [{name: k, cluster: {}}]\nusers: [{name: u, user: {token: t}}]\n", nil, Config{}, "cluster k has no server"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, err := Decode([]byte(tt.doc))
			if err != nil {
				t.Fatal(err)
			}
			got, err := f.Resolve(tt.read)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Resolve: %v, want an error containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Resolve = %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}
}

func TestDecodeKind(t *testing.T) {
	if _, err := Decode([]byte("kind: Pod\n")); err == nil || !strings.Contains(err.Error(), `kind is "Pod"`) {
		t.Errorf("Decode of a Pod: %v", err)
	}
	if _, err := Decode([]byte("kind: [\n")); err == nil {
		t.Error("Decode of bad YAML: no error")
	}
	if _, err := Parse([]byte("kind: Pod\n")); err == nil || !strings.HasPrefix(err.Error(), "kubeconfig: ") {
		t.Errorf("Parse error does not name the kubeconfig: %v", err)
	}
}

func TestNewEncodesEmptyLists(t *testing.T) {
	f := New()
	f.Clusters = []NamedCluster{{Cluster: Cluster{CAData: "Q0E=", Server: "https://x"}}}
	data, err := f.Encode()
	if err != nil {
		t.Fatal(err)
	}
	want := "apiVersion: v1\nkind: Config\nclusters:\n  - name: \"\"\n    cluster:\n      certificate-authority-data: Q0E=\n      server: https://x\ncontexts: []\ncurrent-context: \"\"\npreferences: {}\nusers: []\n"
	if string(data) != want {
		t.Errorf("Encode:\n%s\nwant:\n%s", data, want)
	}
}

// A context added for another server trusts and authenticates as the current one does, and
// leaves the current context as it was.
func TestAddServerContext(t *testing.T) {
	f, err := Decode([]byte(embedded))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.AddServerContext("cp-2", "https://127.0.0.1:20444"); err != nil {
		t.Fatal(err)
	}
	cur, err := f.Resolve(nil)
	if err != nil || cur.Server != "https://10.0.0.1:6443" {
		t.Errorf("current context after the add: %+v, %v", cur, err)
	}
	f.CurrentContext = "cp-2"
	got, err := f.Resolve(nil)
	if err != nil {
		t.Fatal(err)
	}
	want := cur
	want.Cluster, want.Server = "cp-2", "https://127.0.0.1:20444"
	if !reflect.DeepEqual(got, want) {
		t.Errorf("context cp-2: %+v\nwant %+v", got, want)
	}
	f.CurrentContext = "missing"
	if err := f.AddServerContext("x", "https://127.0.0.1:1"); err == nil {
		t.Error("AddServerContext without a current context succeeded")
	}
}
