package firstboot

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"net/http"
	"slices"

	"github.com/kilnproject/kiln/initd/apply"
	"github.com/kilnproject/kiln/initd/blockdev"
	"github.com/kilnproject/kiln/initd/config"
	"github.com/kilnproject/kiln/initd/etcdvolume"
	"github.com/kilnproject/kiln/initd/firstboot/storage"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

// hasStorage reports whether the config sets up disks, arrays, LUKS volumes or filesystems.
func (p *plan) hasStorage() bool {
	s := p.cfg.Ignition.Storage
	return len(s.Disks)+len(s.Raid)+len(s.Luks)+len(s.Filesystems) > 0
}

// applyStorage sets up the config's storage.disks, raid, luks and filesystems (package
// initd/storage) before anything else is written, so that users, directories and files
// may land on the new filesystems. It refuses, before touching anything, a swap area on a
// node that runs kubelet, and any device on the disk node.yaml's etcd volume selects: the
// etcd volume belongs to node.yaml, which formats and mounts it itself.
func (p *plan) applyStorage(ctx context.Context) (bool, error) {
	if !p.hasStorage() {
		return false, nil
	}
	node, err := p.configuredNode()
	if err != nil {
		return false, err
	}
	role := config.Role(p.imageRole)
	if node != nil && node.Role != "" {
		role = node.Role
	}
	if err := p.cfg.CheckRole(role); err != nil {
		return false, err
	}
	// A mount path may lead, through the image's links (/var/run, a merged /usr's /lib),
	// where no filesystem may go: Validate saw it only as written.
	if err := config.CheckMountPaths(p.opts.Root, p.cfg.Ignition.Storage.Filesystems); err != nil {
		return false, err
	}
	forbidden := map[string]string{}
	if node != nil && node.Etcd != nil && node.Etcd.Volume != nil {
		v := node.Etcd.Volume
		if v.Serial != "" || v.ByID != "" {
			dev, err := etcdvolume.ByID{Serial: v.Serial, ID: v.ByID}.Present()
			if err == nil && dev != "" {
				forbidden[dev] = fmt.Sprintf("is the etcd volume %s selects (etcd.volume.%s); node.yaml's etcd volume wins", nodeimage.NodeConfigPath, etcdSelector(v))
			}
		}
		if v.GCEName != "" {
			forbidden["/dev/disk/by-id/google-"+v.GCEName] = fmt.Sprintf("is the etcd volume %s selects (etcd.volume.gceName %s); node.yaml's etcd volume wins", nodeimage.NodeConfigPath, v.GCEName)
		}
	}
	changed, err := storage.Apply(ctx, p.cfg.Ignition, storage.Options{Root: p.opts.Root, Live: p.opts.Root == "/",
		Forbidden: forbidden, Get: apply.HTTPGetter(http.DefaultClient), Log: p.opts.Log})
	if err != nil {
		return len(changed) > 0, fmt.Errorf("storage: %w", err)
	}
	p.reload = p.reload || len(changed) > 0
	return len(changed) > 0, nil
}

func etcdSelector(v *config.Volume) string {
	if v.Serial != "" {
		return "serial " + v.Serial
	}
	return "byId " + v.ByID
}

// configuredNode is the node config as it will be once the files are written: the one the
// config writes, else the one on the node; nil when there is none.
func (p *plan) configuredNode() (*config.Node, error) {
	files, err := p.cfg.Files()
	if err != nil {
		return nil, err
	}
	for _, f := range slices.Backward(files) {
		if f.Path == nodeimage.NodeConfigPath && f.HasContents && !f.Remote() {
			n, err := config.ParseNode(f.Contents, nodeimage.NodeConfigPath)
			if err != nil {
				return nil, fmt.Errorf("%s (%s): %w", f.Field, nodeimage.NodeConfigPath, err)
			}
			return n, nil
		}
	}
	n, err := config.LoadNodeIn(p.opts.Root)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	return n, err
}

// storageDevices lists the devices the config's storage section names, with their JSON paths.
func (p *plan) storageDevices() map[string]string {
	s := p.cfg.Ignition.Storage
	out := map[string]string{}
	for i, d := range s.Disks {
		out[fmt.Sprintf("storage.disks[%d].device", i)] = d.Device
	}
	for i, r := range s.Raid {
		for j, d := range r.Devices {
			out[fmt.Sprintf("storage.raid[%d].devices[%d]", i, j)] = string(d)
		}
	}
	for i, l := range s.Luks {
		if l.Device != nil {
			out[fmt.Sprintf("storage.luks[%d].device", i)] = *l.Device
		}
	}
	for i, f := range s.Filesystems {
		out[fmt.Sprintf("storage.filesystems[%d].device", i)] = f.Device
	}
	return out
}

// storageOnDisk refuses the etcd volume dev when the config's storage section uses its disk:
// the etcd volume is node.yaml's, and a disk both would set up is refused, naming both. The
// storage task refuses the same before it acts when it can tell the volume's disk then (a
// serial, byId or gceName selector with the disk attached); a disk attached later (awsTags,
// gceLabels) is caught here.
func (p *plan) storageOnDisk(dev string) error {
	devs := p.storageDevices()
	for _, field := range slices.Sorted(maps.Keys(devs)) {
		if d := blockdev.SharedDisk("", dev, devs[field]); d != "" {
			return fmt.Errorf("etcd volume %s: %s (%s) is on the same disk %s; node.yaml's etcd volume and the config's storage may not share a disk (leave the disk out of the config's storage)", dev, field, devs[field], d)
		}
	}
	return nil
}
