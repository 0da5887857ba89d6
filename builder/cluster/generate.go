package cluster

import (
	"bytes"
	"fmt"
	"os"
	"path"
	"time"

	"github.com/coreos/ignition/v2/config/v3_4/types"
	"github.com/vincent-petithory/dataurl"
	"gopkg.in/yaml.v3"

	"github.com/kilnproject/kiln/initd/config"
	"github.com/kilnproject/kiln/initd/pki"
	"github.com/kilnproject/kiln/internal/kubeconfig"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

// The bootstrap kubeconfig's user and cluster names.
const (
	bootstrapUser         = "kubelet-bootstrap"
	bootstrapKubeconfigCl = pki.KubeconfigCluster
)

// File names in the output directory.
const (
	AdminKubeconfigFile = "admin.conf"
	tokenFile           = "bootstrap-token"
	specFile            = "cluster.yaml"
	PKIDir              = "pki"
)

// file is one file of the output directory.
type file struct {
	Path string // relative, slash-separated
	Data []byte
	Mode os.FileMode
}

// Cluster is a generated cluster, in memory.
type Cluster struct {
	Spec  Spec // with defaults filled in
	Nodes []Node
	// CA, FrontProxyCA and EtcdCA are the three CAs; ServiceAccount the signing key.
	CA, FrontProxyCA, EtcdCA, ServiceAccount pki.KeyPair
	Token                                    pki.Token
	Admin                                    kubeconfig.Config
	// Files is the output directory's content, in the order it is written.
	Files []file
}

// generate makes a cluster's secrets and every file of its output directory. Errors in
// s name the `kiln cluster init` flag.
func generate(s Spec, now time.Time) (*Cluster, error) {
	s, err := s.withDefaults()
	if err != nil {
		return nil, err
	}
	if err := s.checkNodeConfigs(); err != nil {
		return nil, err
	}
	c := &Cluster{Spec: s, Nodes: s.nodes()}
	for _, ca := range []struct {
		kp *pki.KeyPair
		cn string
	}{{&c.CA, pki.CACommonName}, {&c.FrontProxyCA, pki.FrontProxyCACommonName}, {&c.EtcdCA, pki.EtcdCACommonName}} {
		if *ca.kp, err = pki.NewCA(ca.cn, now); err != nil {
			return nil, err
		}
	}
	if c.ServiceAccount, err = pki.NewServiceAccountKey(); err != nil {
		return nil, err
	}
	if c.Token, err = pki.NewToken(); err != nil {
		return nil, err
	}
	ca, err := pki.ParseCA(c.CA)
	if err != nil {
		return nil, err
	}
	if c.Admin, err = pki.AdminKubeconfig(ca, s.AdminServer, s.AdminTLSServerName, now); err != nil {
		return nil, err
	}
	c.Admin.Cluster = s.Name
	if err := c.files(); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *Cluster) add(p string, data []byte, mode os.FileMode) {
	c.Files = append(c.Files, file{Path: p, Data: data, Mode: mode})
}

func (c *Cluster) files() error {
	for _, p := range []struct {
		name string
		kp   pki.KeyPair
	}{{pki.CAName, c.CA}, {pki.FrontProxyCAName, c.FrontProxyCA}, {pki.EtcdCAName, c.EtcdCA}} {
		c.add(path.Join(PKIDir, p.name+".crt"), p.kp.CertPEM, pki.ModeCert)
		c.add(path.Join(PKIDir, p.name+".key"), p.kp.KeyPEM, pki.ModeSecret)
	}
	c.add(path.Join(PKIDir, pki.ServiceAccount+".key"), c.ServiceAccount.KeyPEM, pki.ModeSecret)
	c.add(path.Join(PKIDir, pki.ServiceAccount+".pub"), c.ServiceAccount.CertPEM, pki.ModeCert)

	admin, err := c.Admin.Marshal()
	if err != nil {
		return fmt.Errorf("admin.conf: %w", err)
	}
	c.add(AdminKubeconfigFile, admin, pki.ModeSecret)
	c.add(tokenFile, []byte(c.Token.String()+"\n"), pki.ModeSecret)

	var record bytes.Buffer
	record.WriteString("# written by kiln cluster init: what was asked and the nodes it made\n")
	enc := yaml.NewEncoder(&record)
	enc.SetIndent(2)
	if err := enc.Encode(struct {
		Spec  `yaml:",inline"`
		Nodes []Node `yaml:"nodes"`
	}{c.Spec, c.Nodes}); err != nil {
		return fmt.Errorf("cluster.yaml: %w", err)
	}
	enc.Close()
	c.add(specFile, record.Bytes(), 0o644)

	for _, n := range c.Nodes {
		ign, err := c.ignition(n)
		if err != nil {
			return err
		}
		c.add(n.Ignition, ign, pki.ModeSecret)
	}
	return nil
}

// nodeConfig is node n's /etc/kiln/node.yaml.
func (c *Cluster) nodeConfig(n Node) config.Node {
	s := c.Spec
	nc := config.Node{
		Cluster:     config.Cluster{Name: s.Name, DNSZone: s.DNSZone},
		Role:        config.Role(n.Role),
		Hostname:    n.Name,
		APIEndpoint: s.APIEndpoint,
		Kubernetes:  config.Kubernetes{Version: s.KubernetesVersion, PodCIDR: s.PodCIDR, ServiceCIDR: s.ServiceCIDR},
	}
	switch {
	case n.Role == roleControlPlane && s.EtcdNodes > 0:
		nc.Etcd = &config.Etcd{External: true, Members: s.EtcdMembers()}
	case n.Role == roleControlPlane || n.Role == roleEtcd:
		nc.Etcd = &config.Etcd{Member: n.EtcdMember, Members: s.EtcdMembers()}
		if s.SlowControlPlane {
			nc.Etcd.HeartbeatInterval, nc.Etcd.ElectionTimeout = slowEtcdHeartbeat, slowEtcdElection
		}
		if s.EtcdDiskSerial != "" {
			nc.Etcd.Volume = &config.Volume{Serial: s.EtcdDiskSerial}
		}
	}
	if n.Role == roleControlPlane {
		if s.SlowControlPlane {
			nc.Kubernetes.LeaderElection = slowLeaderElection
		}
		nc.Preflight.Ignore = s.ControlPlanePreflightIgnore
	}
	return nc
}

// marshalNodeConfig renders a node config as YAML without the fields left empty (they
// take their defaults on the node), and checks it the way the node will.
func marshalNodeConfig(n config.Node) ([]byte, error) {
	var doc yaml.Node
	if err := doc.Encode(n); err != nil {
		return nil, err
	}
	prune(&doc)
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(&doc); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	if _, err := config.ParseNode(buf.Bytes(), "node.yaml"); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// prune drops the mapping entries whose values are empty: "", 0, false, null, {} or [].
func prune(n *yaml.Node) bool {
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			prune(c)
		}
		return false
	case yaml.MappingNode:
		kept := n.Content[:0]
		for i := 0; i+1 < len(n.Content); i += 2 {
			if !prune(n.Content[i+1]) {
				kept = append(kept, n.Content[i], n.Content[i+1])
			}
		}
		n.Content = kept
		return len(kept) == 0
	case yaml.SequenceNode:
		return len(n.Content) == 0
	case yaml.ScalarNode:
		switch n.Tag {
		case "!!null":
			return true
		case "!!str":
			return n.Value == ""
		case "!!int":
			return n.Value == "0"
		case "!!bool":
			return n.Value == "false"
		}
	}
	return false
}

// ignition is node n's Ignition config (spec 3.4.0, JSON): the files listed in the
// package documentation, as data: URLs, owned by root, overwritten.
func (c *Cluster) ignition(n Node) ([]byte, error) {
	nodeYAML, err := marshalNodeConfig(c.nodeConfig(n))
	if err != nil {
		return nil, fmt.Errorf("node config of %s: %w", n.Name, err)
	}
	var files []types.File
	add := func(p string, data []byte, mode os.FileMode) {
		m, src, yes := int(mode), dataurl.New(data, "application/octet-stream").String(), true
		files = append(files, types.File{
			Node:          types.Node{Path: p, Overwrite: &yes},
			FileEmbedded1: types.FileEmbedded1{Mode: &m, Contents: types.Resource{Source: &src}},
		})
	}
	add(nodeimage.NodeConfigPath, nodeYAML, 0o644)
	if n.Role != roleEtcd {
		add(path.Join(nodeimage.KubePKIDir, pki.CAName+".crt"), c.CA.CertPEM, pki.ModeCert)
	}
	switch n.Role {
	case roleEtcd:
		// The etcd CA only: the node makes its member's certificates from it.
		add(path.Join(nodeimage.KubePKIDir, pki.EtcdCAName+".crt"), c.EtcdCA.CertPEM, pki.ModeCert)
		add(path.Join(nodeimage.KubePKIDir, pki.EtcdCAName+".key"), c.EtcdCA.KeyPEM, pki.ModeSecret)
	case roleControlPlane:
		add(path.Join(nodeimage.KubePKIDir, pki.CAName+".key"), c.CA.KeyPEM, pki.ModeSecret)
		for _, p := range []struct {
			name string
			kp   pki.KeyPair
		}{{pki.FrontProxyCAName, c.FrontProxyCA}, {pki.EtcdCAName, c.EtcdCA}} {
			add(path.Join(nodeimage.KubePKIDir, p.name+".crt"), p.kp.CertPEM, pki.ModeCert)
			add(path.Join(nodeimage.KubePKIDir, p.name+".key"), p.kp.KeyPEM, pki.ModeSecret)
		}
		add(path.Join(nodeimage.KubePKIDir, pki.ServiceAccount+".key"), c.ServiceAccount.KeyPEM, pki.ModeSecret)
		add(path.Join(nodeimage.KubePKIDir, pki.ServiceAccount+".pub"), c.ServiceAccount.CertPEM, pki.ModeCert)
		add(nodeimage.BootstrapTokenPath, []byte(c.Token.String()+"\n"), pki.ModeSecret)
	case roleWorker:
		kc := kubeconfig.Config{Cluster: bootstrapKubeconfigCl, Server: pki.ServerURL(c.Spec.APIEndpoint),
			CAPEM: c.CA.CertPEM, User: bootstrapUser, Token: c.Token.String()}
		data, err := kc.Marshal()
		if err != nil {
			return nil, fmt.Errorf("bootstrap kubeconfig of %s: %w", n.Name, err)
		}
		add(nodeimage.BootstrapKubeletConfPath, data, pki.ModeSecret)
	}
	cfg := types.Config{Ignition: types.Ignition{Version: "3.4.0"}, Storage: types.Storage{Files: files}}
	out, err := config.CompactJSON(cfg, "  ")
	if err != nil {
		return nil, fmt.Errorf("ignition config of %s: %w", n.Name, err)
	}
	return append(out, '\n'), nil
}
