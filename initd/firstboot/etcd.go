package firstboot

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/kilnproject/kiln/initd/apply"
	"github.com/kilnproject/kiln/initd/blockdev"
	"github.com/kilnproject/kiln/initd/config"
	"github.com/kilnproject/kiln/initd/etcdmember"
	"github.com/kilnproject/kiln/initd/etcdvolume"
	"github.com/kilnproject/kiln/initd/task"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

// etcdManifest is the etcd member's manifest's name in the manifests directory and on the
// volume (the templates render it at nodeimage.RenderedEtcdManifestPath).
const (
	etcdManifest = "etcd.manifest"
)

// etcdTasks give an etcd member its disk and place etcd's manifest, on that disk when it
// has one, once the role's templates rendered it.
func (p *plan) etcdTasks() []task.Task {
	return []task.Task{
		task.Converge("etcd-volume", []string{"preflight"}, p.prepareEtcdVolume),
		task.Converge("etcd-join", []string{"pki", "etcd-volume"}, p.joinEtcd),
		task.Converge("etcd-manifest", []string{"render", "etcd-volume"}, p.placeEtcdManifest),
	}
}

// factEtcdCluster is what a member with an empty data directory waits for: a running
// cluster that takes it as a learner, or, on the seed, the certainty that none runs.
// Other machines provide it (the seed may boot minutes later), so its wait has a bound of
// its own, etcdJoinWait.
const factEtcdCluster = "the etcd cluster to take this member"

// etcdJoinWait bounds the wait for factEtcdCluster.
const etcdJoinWait = time.Hour

// joinEtcd decides, before the etcd manifest is rendered, how this member starts
// (etcdmember.Decide): a member of several with an empty data directory joins the running
// cluster as a learner (its stale self removed) and starts as "existing"; the seed starts a
// one-member cluster when no other member answers; a member that cannot start yet fails with
// task.Unknown(factEtcdCluster), and the run waits (awaitEtcdCluster). A data directory
// with data is never touched. A single member starts from the static cluster.
func (p *plan) joinEtcd(ctx context.Context) (bool, error) {
	o, ok, err := p.etcdMemberOptions()
	if !ok || err != nil {
		return false, err
	}
	plan, err := etcdmember.Decide(ctx, o)
	var w *etcdmember.WaitError
	if errors.As(err, &w) {
		p.etcdWaiting.Store(w.Reason)
		return plan.Changed, task.Unknown(factEtcdCluster, err)
	}
	if err != nil {
		return false, fmt.Errorf("etcd membership: %w", err)
	}
	p.opts.Log.Info("etcd member start", "state", plan.State, "learner", plan.Learner, "why", plan.Why)
	p.etcdPlan = &plan
	return plan.Changed, nil
}

// awaitEtcdCluster waits until this member can start (etcdmember.Decide stops asking it to
// wait), asking every few seconds; the reason of the last answer is the wait's detail.
func (p *plan) awaitEtcdCluster(ctx context.Context) error {
	o, ok, err := p.etcdMemberOptions()
	if !ok || err != nil {
		return err
	}
	for {
		_, err := etcdmember.Decide(ctx, o)
		var w *etcdmember.WaitError
		if !errors.As(err, &w) {
			return nil // known, or an error the task itself reports when it runs again
		}
		p.etcdWaiting.Store(w.Reason)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Second):
		}
	}
}

// etcdWaitDetail is the wait's detail: why this member cannot start yet.
func (p *plan) etcdWaitDetail() string {
	s, _ := p.etcdWaiting.Load().(string)
	return s
}

// etcdMemberOptions are etcdmember's options for this node: ok is false when it runs no
// member of several, when first boot runs on a tree that is not the running system, and
// when the pki task has not made the client certificate (an image without the kubernetes
// overlay).
func (p *plan) etcdMemberOptions() (o etcdmember.Options, ok bool, err error) {
	if p.opts.Root != "/" {
		return o, false, nil
	}
	o, ok, err = etcdmember.ForNode(p.opts.Root, p.node, p.opts.Log)
	if errors.Is(err, fs.ErrNotExist) {
		return o, false, nil
	}
	return o, ok, err
}

// etcdMember reports whether this node runs an etcd member (and so may have a volume).
func (p *plan) etcdMember() bool { return etcdmember.RunsMember(p.node) }

// prepareEtcdVolume finds the etcd disk, makes it safe to use (never formatting one with data),
// mounts it now and writes the mount unit that mounts it on later boots before the runtime.
func (p *plan) prepareEtcdVolume(ctx context.Context) (bool, error) {
	if !p.etcdMember() || p.node.Etcd.Volume == nil {
		return false, nil
	}
	v := p.node.Etcd.Volume
	finder, err := p.volumeFinder(ctx, v)
	if err != nil {
		return false, err
	}
	dev, err := finder.Find(ctx)
	if err != nil {
		return false, fmt.Errorf("etcd volume: %w", err)
	}
	p.opts.Log.Info("etcd volume found", "device", dev)
	if err := p.storageOnDisk(dev); err != nil {
		return false, err
	}
	res, err := etcdvolume.Prepare(ctx, dev, etcdvolume.Want{FSType: v.FSType, Label: v.Label, Wipe: v.Wipe, MinSize: v.MinBytes})
	if errors.Is(err, etcdvolume.ErrTooSmall) {
		return false, fmt.Errorf("etcd volume: %w (etcd.volume.minSize in node.yaml sets the minimum, %s by default)", err, config.DefaultEtcdMinSizeText)
	}
	if err != nil {
		return false, fmt.Errorf("etcd volume %s: %w", dev, err)
	}
	if res.Formatted {
		p.opts.Log.Info("etcd volume formatted", "device", dev, "fstype", res.FSType, "label", res.Label)
	}
	if p.opts.Root == "/" {
		if err := blockdev.Mount(dev, v.MountPath, res.FSType); err != nil {
			return false, fmt.Errorf("mount etcd volume %s on %s: %w", dev, v.MountPath, err)
		}
		p.opts.Log.Info("etcd volume mounted", "device", dev, "path", v.MountPath)
	}
	// The unit mounts it on later boots; this boot mounted it above.
	unit, err := blockdev.MountUnit(p.opts.Root, blockdev.ByUUIDPath(res.UUID), v.MountPath, res.FSType)
	if err != nil {
		return false, err
	}
	return res.Formatted || res.Wiped || unit, nil
}

// volumeFinder picks the discovery the node config asks for: by-id, or the cloud's whose
// selector it is (awsTags: EBS through EC2; gceName, gceLabels: a disk through the
// Compute API), with the instance's credentials and identity.
func (p *plan) volumeFinder(ctx context.Context, v *config.Volume) (etcdvolume.Finder, error) {
	if v.Serial != "" || v.ByID != "" {
		return etcdvolume.ByID{Serial: v.Serial, ID: v.ByID, MountPath: v.MountPath}, nil
	}
	for _, c := range clouds {
		if !c.SelectsVolume(v) {
			continue
		}
		in, err := p.instanceOn(ctx, c.Name())
		if err != nil {
			return nil, fmt.Errorf("etcd volume: %w", err)
		}
		f, err := c.EtcdVolume(ctx, p.node, v, in, p.opts.Log)
		if err != nil {
			return nil, fmt.Errorf("etcd volume: %w", err)
		}
		return f, nil
	}
	return nil, errors.New("etcd.volume: no selector (serial, byId, awsTags, gceName or gceLabels)")
}

// instanceOn is the instance's identity on cloud (aws, gce): the one the facts task read
// when the node runs there, else read now (a node config asking for a cloud volume on a
// node booted with another kiln.platform=).
func (p *plan) instanceOn(ctx context.Context, cloud string) (instance, error) {
	if p.instance != nil && p.instance.Cloud == cloud {
		return *p.instance, nil
	}
	return readInstance(ctx, cloud, p.node)
}

// placeEtcdManifest places the rendered etcd manifest: on the volume, linked from the manifests
// directory (so etcd cannot start without its disk), or straight into the manifests directory
// when the node has no etcd volume.
func (p *plan) placeEtcdManifest(ctx context.Context) (bool, error) {
	if !p.etcdMember() {
		return false, nil
	}
	data, err := os.ReadFile(filepath.Join(p.opts.Root, nodeimage.RenderedEtcdManifestPath))
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil // the image's templates have no etcd manifest
	}
	if err != nil {
		return false, err
	}
	if v := p.node.Etcd.Volume; v != nil {
		wrote, err := etcdvolume.WriteManifest(p.opts.Root, v.MountPath, etcdManifest, data)
		if err != nil {
			return false, err
		}
		linked, err := etcdvolume.LinkManifest(p.opts.Root, v.MountPath, etcdManifest)
		return wrote || linked, err
	}
	changed, err := apply.Files(ctx, p.opts.Root, []config.File{{Field: "etcd manifest",
		Path: filepath.Join(nodeimage.ManifestsDir, etcdManifest), Mode: 0o600, ModeSet: true,
		Overwrite: true, HasContents: true, Contents: data}}, nil)
	return len(changed) > 0, err
}
