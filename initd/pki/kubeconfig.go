package pki

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"gopkg.in/yaml.v3"
)

// Kubeconfig is a one-cluster, one-user kubeconfig with everything embedded.
type Kubeconfig struct {
	Cluster       string // cluster (and context suffix) name; kubeadm uses "kubernetes"
	Server        string // https://host:port
	CAPEM         []byte // certificate-authority-data
	User          string
	CertPEM       []byte // client-certificate-data
	KeyPEM        []byte // client-key-data
	Token         string // bearer token (bootstrap token for a kubelet)
	TLSServerName string // tls-server-name: the name to check the server's certificate against
}

// Context is the kubeconfig's only context name, <user>@<cluster>, as kubeadm names it.
func (k Kubeconfig) Context() string { return k.User + "@" + k.Cluster }

// The clientcmd v1 document, only the fields kiln writes.
type kcFile struct {
	APIVersion     string         `yaml:"apiVersion"`
	Kind           string         `yaml:"kind"`
	Clusters       []kcNamedCl    `yaml:"clusters"`
	Contexts       []kcNamedCtx   `yaml:"contexts"`
	CurrentContext string         `yaml:"current-context"`
	Preferences    map[string]any `yaml:"preferences"`
	Users          []kcNamedUser  `yaml:"users"`
}

type kcNamedCl struct {
	Name    string    `yaml:"name"`
	Cluster kcCluster `yaml:"cluster"`
}

type kcCluster struct {
	CAData        string `yaml:"certificate-authority-data,omitempty"`
	Server        string `yaml:"server"`
	TLSServerName string `yaml:"tls-server-name,omitempty"`
}

type kcNamedCtx struct {
	Name    string    `yaml:"name"`
	Context kcContext `yaml:"context"`
}

type kcContext struct {
	Cluster string `yaml:"cluster"`
	User    string `yaml:"user"`
}

type kcNamedUser struct {
	Name string `yaml:"name"`
	User kcUser `yaml:"user"`
}

type kcUser struct {
	CertData string `yaml:"client-certificate-data,omitempty"`
	KeyData  string `yaml:"client-key-data,omitempty"`
	Token    string `yaml:"token,omitempty"`
}

func b64(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return base64.StdEncoding.EncodeToString(b)
}

// Marshal renders k as clientcmd v1 YAML (apiVersion v1, kind Config) with the CA, client
// certificate and key embedded as *-data.
func (k Kubeconfig) Marshal() ([]byte, error) {
	switch {
	case k.Cluster == "":
		return nil, errors.New("kubeconfig: empty cluster name")
	case k.User == "":
		return nil, errors.New("kubeconfig: empty user name")
	case k.Server == "":
		return nil, errors.New("kubeconfig: empty server")
	case len(k.CAPEM) == 0:
		return nil, errors.New("kubeconfig: no CA certificate")
	case (len(k.CertPEM) == 0) != (len(k.KeyPEM) == 0):
		return nil, errors.New("kubeconfig: a client certificate needs its key and the other way round")
	case len(k.CertPEM) == 0 && k.Token == "":
		return nil, errors.New("kubeconfig: neither a client certificate nor a token")
	}
	f := kcFile{
		APIVersion:     "v1",
		Kind:           "Config",
		Clusters:       []kcNamedCl{{Name: k.Cluster, Cluster: kcCluster{CAData: b64(k.CAPEM), Server: k.Server, TLSServerName: k.TLSServerName}}},
		Contexts:       []kcNamedCtx{{Name: k.Context(), Context: kcContext{Cluster: k.Cluster, User: k.User}}},
		CurrentContext: k.Context(),
		Preferences:    map[string]any{},
		Users:          []kcNamedUser{{Name: k.User, User: kcUser{CertData: b64(k.CertPEM), KeyData: b64(k.KeyPEM), Token: k.Token}}},
	}
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(f); err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	return buf.Bytes(), nil
}

// ParseKubeconfig reads the current context of a kubeconfig with embedded data (as
// Marshal writes it, or kubeadm).
func ParseKubeconfig(data []byte) (Kubeconfig, error) {
	var f kcFile
	if err := yaml.Unmarshal(data, &f); err != nil {
		return Kubeconfig{}, fmt.Errorf("kubeconfig: %w", err)
	}
	if f.Kind != "Config" {
		return Kubeconfig{}, fmt.Errorf("kubeconfig: kind is %q, not Config", f.Kind)
	}
	var k Kubeconfig
	var ctx *kcContext
	for i := range f.Contexts {
		if f.Contexts[i].Name == f.CurrentContext {
			ctx = &f.Contexts[i].Context
		}
	}
	if ctx == nil {
		return Kubeconfig{}, fmt.Errorf("kubeconfig: current-context %q is not among the contexts", f.CurrentContext)
	}
	k.Cluster, k.User = ctx.Cluster, ctx.User
	found := 0
	var err error
	dec := func(field, s string) []byte {
		b, e := base64.StdEncoding.DecodeString(s)
		if e != nil && err == nil {
			err = fmt.Errorf("kubeconfig: %s: %w", field, e)
		}
		return b
	}
	for _, c := range f.Clusters {
		if c.Name == ctx.Cluster {
			found++
			k.Server, k.TLSServerName = c.Cluster.Server, c.Cluster.TLSServerName
			k.CAPEM = dec("certificate-authority-data", c.Cluster.CAData)
		}
	}
	for _, u := range f.Users {
		if u.Name == ctx.User {
			found++
			k.CertPEM = dec("client-certificate-data", u.User.CertData)
			k.KeyPEM = dec("client-key-data", u.User.KeyData)
			k.Token = u.User.Token
		}
	}
	if err != nil {
		return Kubeconfig{}, err
	}
	if found != 2 {
		return Kubeconfig{}, fmt.Errorf("kubeconfig: cluster %q or user %q of the current context is missing", ctx.Cluster, ctx.User)
	}
	return k, nil
}

// KubeconfigCluster is the cluster name kubeadm writes into its kubeconfigs.
const KubeconfigCluster = "kubernetes"

// ControlPlaneKubeconfigNames lists the kubeconfigs ControlPlaneKubeconfigs manages.
var ControlPlaneKubeconfigNames = []string{"admin.conf", "super-admin.conf", "kubelet.conf", "controller-manager.conf", "scheduler.conf"}

// controlPlaneUsers: kubeconfig file name → client certificate.
func controlPlaneUsers(hostname string) map[string]Cert {
	return map[string]Cert{
		"admin.conf":              {CommonName: "kubernetes-admin", Organization: []string{GroupClusterAdmins}, Client: true},
		"super-admin.conf":        {CommonName: "kubernetes-super-admin", Organization: []string{GroupMasters}, Client: true},
		"kubelet.conf":            {CommonName: "system:node:" + hostname, Organization: []string{GroupNodes}, Client: true},
		"controller-manager.conf": {CommonName: "system:kube-controller-manager", Client: true},
		"scheduler.conf":          {CommonName: "system:kube-scheduler", Client: true},
	}
}

// AdminKubeconfig makes the kubeadm admin.conf user (CN kubernetes-admin, O
// kubeadm:cluster-admins) for server, signed by ca.
func AdminKubeconfig(ca *CA, server, tlsServerName string, now time.Time) (Kubeconfig, error) {
	kp, err := ca.Issue(controlPlaneUsers("")["admin.conf"], now)
	if err != nil {
		return Kubeconfig{}, fmt.Errorf("admin kubeconfig: %w", err)
	}
	return Kubeconfig{Cluster: KubeconfigCluster, Server: server, CAPEM: ca.CertPEM, User: "kubernetes-admin",
		CertPEM: kp.CertPEM, KeyPEM: kp.KeyPEM, TLSServerName: tlsServerName}, nil
}

// ControlPlaneKubeconfigs is kubeadm's kubeconfig phase: admin.conf (CN kubernetes-admin,
// O kubeadm:cluster-admins), super-admin.conf (CN kubernetes-super-admin, O
// system:masters), kubelet.conf (CN system:node:<hostname>, O system:nodes),
// controller-manager.conf (CN system:kube-controller-manager) and scheduler.conf (CN
// system:kube-scheduler), each 0600 in kubeDir, all pointing at server (https://host:port)
// and signed by <pkiDir>/ca. A file that still has the same server and CA and a valid
// client certificate (CheckLeaf) is kept. It returns the file names it wrote.
func ControlPlaneKubeconfigs(kubeDir, pkiDir string, n Node, server string, now time.Time) (changed []string, err error) {
	if n.Hostname == "" {
		return nil, errors.New("control-plane kubeconfigs: node hostname is empty")
	}
	if server == "" {
		return nil, errors.New("control-plane kubeconfigs: empty server URL")
	}
	ca, err := LoadCA(pkiDir, CAName)
	if err != nil {
		return nil, err
	}
	users := controlPlaneUsers(n.Hostname)
	for _, name := range ControlPlaneKubeconfigNames {
		path := filepath.Join(kubeDir, name)
		want := users[name]
		if data, err := os.ReadFile(path); err == nil {
			if kubeconfigValid(data, ca, server, want, now) {
				if err := os.Chmod(path, ModeSecret); err != nil {
					return changed, fmt.Errorf("kubeconfig %s: %w", path, err)
				}
				continue
			}
		} else if !errors.Is(err, os.ErrNotExist) {
			return changed, fmt.Errorf("kubeconfig %s: %w", path, err)
		}
		kp, err := ca.Issue(want, now)
		if err != nil {
			return changed, fmt.Errorf("kubeconfig %s: %w", path, err)
		}
		kc := Kubeconfig{Cluster: KubeconfigCluster, Server: server, CAPEM: ca.CertPEM, User: want.CommonName, CertPEM: kp.CertPEM, KeyPEM: kp.KeyPEM}
		data, err := kc.Marshal()
		if err != nil {
			return changed, fmt.Errorf("kubeconfig %s: %w", path, err)
		}
		if err := WriteFile(path, data, ModeSecret); err != nil {
			return changed, err
		}
		changed = append(changed, name)
	}
	return changed, nil
}

func kubeconfigValid(data []byte, ca *CA, server string, want Cert, now time.Time) bool {
	k, err := ParseKubeconfig(data)
	if err != nil || k.Server != server || k.Cluster != KubeconfigCluster || k.User != want.CommonName {
		return false
	}
	caCert, err := ParseCertPEM(k.CAPEM)
	if err != nil || !caCert.Equal(ca.Cert) {
		return false
	}
	return CheckLeaf(ca, KeyPair{CertPEM: k.CertPEM, KeyPEM: k.KeyPEM}, want, now) == nil
}

// ServerURL is https://host:port for an address as node.yaml's apiEndpoint or a bare
// IP gives it; port 6443 is added when missing.
func ServerURL(endpoint string) string {
	hp := endpoint
	for _, p := range []string{"https://", "http://"} {
		if len(hp) > len(p) && hp[:len(p)] == p {
			hp = hp[len(p):]
		}
	}
	if _, _, err := net.SplitHostPort(hp); err != nil {
		hp = net.JoinHostPort(trimBrackets(hp), "6443")
	}
	return "https://" + hp
}

func trimBrackets(s string) string {
	if len(s) > 1 && s[0] == '[' && s[len(s)-1] == ']' {
		return s[1 : len(s)-1]
	}
	return s
}
