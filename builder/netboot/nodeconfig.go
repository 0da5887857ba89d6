package netboot

import (
	"bytes"
	"errors"
	"fmt"
	"path"

	"github.com/coreos/ignition/v2/config/v3_6/types"
	"github.com/vincent-petithory/dataurl"
	"gopkg.in/yaml.v3"

	"github.com/kilnproject/kiln/initd/config"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

// groupConfig is a group's node config, parsed and checked once.
type groupConfig struct {
	path string
	cfg  *config.Config
	// nodeYAML is the contents of the /etc/kiln/node.yaml the config writes, nil if none;
	// nodeMode its mode.
	nodeYAML []byte
	nodeMode int
}

// loadGroupConfig reads, parses and checks a node config as first boot would: Ignition JSON
// or Butane YAML, kiln's supported fields only, and the node.yaml it writes.
func loadGroupConfig(path string) (*groupConfig, error) {
	raw, err := readRegular(path)
	if err != nil {
		return nil, err
	}
	cfg, err := config.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	files, err := cfg.Files()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	gc := &groupConfig{path: path, cfg: cfg, nodeMode: 0o644}
	for _, f := range files {
		if f.Path != nodeimage.NodeConfigPath {
			continue
		}
		if f.Remote() {
			return nil, fmt.Errorf("%s: %s: %s comes from %s; kiln serve renders per-machine values into it and needs it inline (a data: URL)", path, f.Field, nodeimage.NodeConfigPath, f.Source)
		}
		if _, err := config.ParseNode(f.Contents, path+": "+nodeimage.NodeConfigPath); err != nil {
			return nil, err
		}
		gc.nodeYAML = f.Contents
		if f.ModeSet {
			gc.nodeMode = int(f.Mode.Perm())
		}
	}
	return gc, nil
}

// render returns machine m's config as Ignition JSON: the group's config (nil: none) with
// the machine's hostname and etcd member written into it, checked again as the node will.
func render(gc *groupConfig, m *Machine) ([]byte, error) {
	cfg := &config.Config{Ignition: types.Config{Ignition: types.Ignition{Version: "3.6.0"}}}
	if gc != nil {
		cfg = &config.Config{Ignition: gc.cfg.Ignition, Warnings: gc.cfg.Warnings}
	}
	if err := machineFiles(cfg, gc, m); err != nil {
		return nil, err
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("config of machine %s: %w", m.ID, err)
	}
	js, err := config.CompactJSON(cfg.Ignition, "")
	if err != nil {
		return nil, err
	}
	if _, err := config.Parse(js); err != nil {
		return nil, fmt.Errorf("config of machine %s: %w", m.ID, err)
	}
	return js, nil
}

// machineFiles writes m's own values into cfg (a copy of the group's): the node.yaml entry
// with hostname and etcd.member set, or an /etc/hostname entry when the config has no
// node.yaml. An entry for the same path gets the new contents, without the group entry's
// compression or hash (as a later config's entry wins in Ignition's merge); the group's
// config itself is left as it was.
func machineFiles(cfg *config.Config, gc *groupConfig, m *Machine) error {
	if m.Hostname == "" && m.EtcdMember == "" {
		return nil
	}
	switch {
	case gc != nil && gc.nodeYAML != nil:
		data, err := editNodeYAML(gc.nodeYAML, m)
		if err != nil {
			return fmt.Errorf("config of machine %s: %w", m.ID, err)
		}
		setFile(&cfg.Ignition, inlineFile(nodeimage.NodeConfigPath, data, gc.nodeMode))
	case m.EtcdMember != "":
		where := "it has no config"
		if gc != nil {
			where = gc.path + " writes no " + nodeimage.NodeConfigPath
		}
		return fmt.Errorf("machine %s: etcdMember %s needs a node config with etcd.members in %s, and %s", m.ID, m.EtcdMember, nodeimage.NodeConfigPath, where)
	default:
		setFile(&cfg.Ignition, inlineFile("/etc/hostname", []byte(m.Hostname+"\n"), 0o644))
	}
	return nil
}

// setFile gives ign's entry for f's path f's contents (its other fields kept: owner, mode,
// overwrite), or appends f; ign's list is copied first.
func setFile(ign *types.Config, f types.File) {
	files := append([]types.File(nil), ign.Storage.Files...)
	for i := range files {
		if path.Clean("/"+files[i].Path) == f.Path {
			files[i].Contents = f.Contents
			ign.Storage.Files = files
			return
		}
	}
	ign.Storage.Files = append(files, f)
}

// inlineFile is an entry writing data to p, as a percent-encoded data: URL (readable in
// the served JSON).
func inlineFile(p string, data []byte, mode int) types.File {
	du := dataurl.New(data, "text/plain")
	du.Encoding = dataurl.EncodingASCII
	src, yes := du.String(), true
	return types.File{
		Node:          types.Node{Path: p, Overwrite: &yes},
		FileEmbedded1: types.FileEmbedded1{Mode: &mode, Contents: types.Resource{Source: &src}},
	}
}

// editNodeYAML sets hostname and etcd.member in a node.yaml, keeping every other field and
// comment, and checks the result with the node's parser.
func editNodeYAML(data []byte, m *Machine) ([]byte, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("%s: %w", nodeimage.NodeConfigPath, err)
	}
	if len(doc.Content) == 0 || doc.Content[0].Kind != yaml.MappingNode {
		return nil, fmt.Errorf("%s: %w", nodeimage.NodeConfigPath, errors.New("is not a mapping"))
	}
	root := doc.Content[0]
	if m.Hostname != "" {
		setKey(root, "hostname", m.Hostname)
	}
	if m.EtcdMember != "" {
		etcd := mapValue(root, "etcd")
		if etcd == nil || etcd.Kind != yaml.MappingNode {
			return nil, fmt.Errorf("%s: etcdMember %s: the group's node.yaml has no etcd section (members)", nodeimage.NodeConfigPath, m.EtcdMember)
		}
		setKey(etcd, "member", m.EtcdMember)
	}
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(&doc); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	if _, err := config.ParseNode(buf.Bytes(), nodeimage.NodeConfigPath); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func mapValue(n *yaml.Node, key string) *yaml.Node {
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1]
		}
	}
	return nil
}

// setKey sets key to the string value in mapping n, adding it at the end when absent.
func setKey(n *yaml.Node, key, value string) {
	if v := mapValue(n, key); v != nil {
		*v = yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: value}
		return
	}
	n.Content = append(n.Content,
		&yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: key},
		&yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: value})
}
