package install

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/kilnproject/kiln/initd/apply"
	"github.com/kilnproject/kiln/initd/config"
	"github.com/kilnproject/kiln/initd/source"
)

// EtcdVolume is how a node config selects its etcd volume on metal: by serial or by a
// /dev/disk/by-id name (etcd.volume.serial, etcd.volume.byId).
type EtcdVolume struct {
	Serial string
	ByID   string
}

func (v EtcdVolume) String() string {
	if v.Serial != "" {
		return "etcd.volume.serial=" + v.Serial
	}
	return "etcd.volume.byId=" + v.ByID
}

// etcdVolume fetches the config named by kiln.config.url= on the kernel command line cmdline
// (as first boot will: same variables, retries and limits) and returns the etcd volume its
// node config (/etc/kiln/node.yaml in storage.files) selects by serial or by-id name; nil
// when it has no node config, or one without such an etcd volume.
func etcdVolume(ctx context.Context, log *slog.Logger, cmdline string, client *http.Client) (*EtcdVolume, error) {
	src := &source.CmdlineURL{Cmdline: cmdline, HTTPClient: client, Logger: log}
	raw, err := src.Fetch(ctx)
	if err != nil {
		return nil, fmt.Errorf("node config from kiln.%s: %w", ParamConfigURL, err)
	}
	node, err := nodeConfig(ctx, raw, client)
	if err != nil || node == nil {
		return nil, err
	}
	if node.Etcd == nil || node.Etcd.Volume == nil {
		return nil, nil
	}
	v := node.Etcd.Volume
	if v.Serial == "" && v.ByID == "" {
		return nil, nil
	}
	return &EtcdVolume{Serial: v.Serial, ByID: v.ByID}, nil
}

// nodeConfig parses the user config raw and returns the node config it writes, nil when it
// writes none.
func nodeConfig(ctx context.Context, raw []byte, client *http.Client) (*config.Node, error) {
	data, err := source.Decode(raw)
	if err != nil {
		return nil, fmt.Errorf("node config from kiln.%s: %w", ParamConfigURL, err)
	}
	cfg, err := config.Parse(data)
	if err == nil {
		err = cfg.Validate()
	}
	if err != nil {
		return nil, fmt.Errorf("config from kiln.%s: %w", ParamConfigURL, err)
	}
	files, err := cfg.Files()
	if err != nil {
		return nil, fmt.Errorf("config from kiln.%s: %w", ParamConfigURL, err)
	}
	for _, f := range files {
		if f.Path != config.NodePath {
			continue
		}
		if f, err = f.Fetch(ctx, apply.HTTPGetter(client)); err != nil {
			return nil, fmt.Errorf("config from kiln.%s: %w", ParamConfigURL, err)
		}
		node, err := config.ParseNode(f.Contents, config.NodePath)
		if err != nil {
			return nil, fmt.Errorf("config from kiln.%s: %w", ParamConfigURL, err)
		}
		return node, nil
	}
	return nil, nil
}
