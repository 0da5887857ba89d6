package stage1

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/kilnproject/kiln/initd/apply"
	"github.com/kilnproject/kiln/initd/blockdev"
	"github.com/kilnproject/kiln/initd/config"
	"github.com/kilnproject/kiln/initd/source"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

// EtcdVolume is how a node config selects its etcd volume on metal: by serial or by a
// /dev/disk/by-id name (etcd.volume.serial, etcd.volume.byId). A network boot keeps clear of
// it: a live boot never puts /var on it, an install never writes it.
type EtcdVolume struct {
	serial string
	byID   string
}

func (v EtcdVolume) String() string {
	if v.serial != "" {
		return "etcd.volume.serial=" + v.serial
	}
	return "etcd.volume.byId=" + v.byID
}

// Selects reports whether v selects the disk with ids (the names blockdev.ReadDiskIDs derives
// from sysfs, as udev would).
func (v EtcdVolume) Selects(ids blockdev.DiskIDs) bool {
	return v.serial != "" && ids.SelectedBySerial(v.serial) || v.byID != "" && ids.SelectedByID(v.byID)
}

// FetchEtcdVolume fetches the config kiln.config.url= names on the kernel command line cmdline
// (as first boot will: same variables, retries and limits, and the configs it merges or
// replaces itself with) and returns the etcd volume its node config (/etc/kiln/node.yaml in
// storage.files) selects by serial or by-id name; nil when it has no node config, or one
// without such an etcd volume. A nil client is http.DefaultClient.
func FetchEtcdVolume(ctx context.Context, log *slog.Logger, cmdline string, client *http.Client) (*EtcdVolume, error) {
	client = cmp.Or(client, http.DefaultClient)
	src := &source.CmdlineURL{Cmdline: cmdline, HTTPClient: client, Logger: log}
	raw, err := src.Fetch(ctx)
	if err != nil {
		return nil, fmt.Errorf("node config from kiln.config.url: %w", err)
	}
	node, err := nodeConfig(ctx, log, raw, client)
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
	return &EtcdVolume{serial: v.Serial, byID: v.ByID}, nil
}

// nodeConfig parses the user config raw, renders it (ignition.config.merge and replace,
// fetched as first boot fetches them) and returns the node config it writes, nil when it
// writes none.
func nodeConfig(ctx context.Context, log *slog.Logger, raw []byte, client *http.Client) (*config.Node, error) {
	data, err := source.Decode(raw)
	if err != nil {
		return nil, fmt.Errorf("node config from kiln.config.url: %w", err)
	}
	cfg, err := config.Parse(data)
	if err == nil {
		err = cfg.Validate()
	}
	if err == nil {
		get := config.URLGetter(config.FetchOptions{HTTPClient: client, Retry: source.DefaultURLTimeout, Log: log})
		cfg, err = cfg.Render(ctx, config.RenderOptions{Get: get})
	}
	if err != nil {
		return nil, fmt.Errorf("config from kiln.config.url: %w", err)
	}
	files, err := cfg.Files()
	if err != nil {
		return nil, fmt.Errorf("config from kiln.config.url: %w", err)
	}
	for _, f := range files {
		if f.Path != nodeimage.NodeConfigPath {
			continue
		}
		if f, err = f.Fetch(ctx, apply.HTTPGetter(client)); err != nil {
			return nil, fmt.Errorf("config from kiln.config.url: %w", err)
		}
		node, err := config.ParseNode(f.Contents, nodeimage.NodeConfigPath)
		if err != nil {
			return nil, fmt.Errorf("config from kiln.config.url: %w", err)
		}
		return node, nil
	}
	return nil, nil
}
