package etcdvolume

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

// Selection is how a node config selects its etcd volume on metal: by serial or by a
// /dev/disk/by-id name (etcd.volume.serial, etcd.volume.byId). Stage 1's network boots keep
// clear of it: a live boot never puts /var on it, an install never writes it.
type Selection struct {
	Serial string
	ByID   string
}

// String names the selection as node.yaml gives it: etcd.volume.serial=etcd-main.
func (v Selection) String() string {
	if v.Serial != "" {
		return "etcd.volume.serial=" + v.Serial
	}
	return "etcd.volume.byId=" + v.ByID
}

// Selects reports whether v selects the disk with ids (the names blockdev.ReadDiskIDs derives
// from sysfs, as udev would).
func (v Selection) Selects(ids blockdev.DiskIDs) bool {
	return v.Serial != "" && ids.SelectedBySerial(v.Serial) || v.ByID != "" && ids.SelectedByID(v.ByID)
}

// FetchSelection fetches the config kiln.config.url= names on the kernel command line cmdline
// (as first boot will: same variables, retries and limits, and the configs it merges or
// replaces itself with) and returns the etcd volume its node config (/etc/kiln/node.yaml in
// storage.files) selects by serial or by-id name; nil when it has no node config, or one
// without such an etcd volume. A nil client is http.DefaultClient.
func FetchSelection(ctx context.Context, log *slog.Logger, cmdline string, client *http.Client) (*Selection, error) {
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
	return &Selection{Serial: v.Serial, ByID: v.ByID}, nil
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
