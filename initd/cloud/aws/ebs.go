package aws

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/kilnproject/kiln/initd/blockdev"
	"github.com/kilnproject/kiln/initd/etcdvolume"
)

// EC2API is the part of the EC2 API the EBS finder calls (*EC2Client).
type EC2API interface {
	// DescribeVolumes returns the volumes among ids (all when none) that pass every filter.
	DescribeVolumes(ctx context.Context, ids []string, filters []Filter) ([]Volume, error)
	AttachVolume(ctx context.Context, id, instance, device string) error
}

// defaultEtcdCluster is the etcd cluster whose volumes EBS selects when EtcdCluster is
// empty: kOps tags them k8s.io/etcd/main.
const defaultEtcdCluster = "main"

// EBS finds this member's etcd EBS volume as kOps tags it and attaches it to this
// instance. The volumes are selected in the instance's availability zone by the tags
// kubernetes.io/cluster/<Cluster>=owned (when Cluster is set), the key
// k8s.io/etcd/<EtcdCluster> and every entry of Tags; among them, the volume for Member
// is the one whose k8s.io/etcd/<EtcdCluster> value is "<Member>/<all members>"
// (k8s.io/etcd/main=b/a,b,c for member b).
//
// A volume attached to this instance is used as it is; an available one is attached
// with AttachVolume to the first free device name; one attached to another instance,
// or taken by another instance while this one tries, gives etcdvolume.ErrAttachedElsewhere: nodes
// race for volumes and the loser retries later. On Nitro instances the volume appears
// as /dev/disk/by-id/aws-ebs-<volume id> (the kiln image's udev rule) or
// nvme-Amazon_Elastic_Block_Store_vol<id without the dash> (systemd's); on Xen instances
// as the device name it was attached under.
type EBS struct {
	Client     EC2API
	InstanceID string
	AZ         string
	// Cluster is the Kubernetes cluster name (kubernetes.io/cluster/<Cluster>=owned).
	Cluster string
	// EtcdCluster is the etcd cluster's name in the tag key k8s.io/etcd/<EtcdCluster>;
	// empty means defaultEtcdCluster.
	EtcdCluster string
	// Member is this node's etcd member name.
	Member string
	// Tags are further filters: each key must carry that value ("" matches any value).
	Tags map[string]string
	// MountPath is the volume's mount point: a disk mounted there and nowhere else is
	// the volume, mounted by an earlier run, and is accepted. Any other use of the disk
	// found (see etcdvolume.CheckDisk) is refused.
	MountPath string
	// DevDir is the by-id directory; empty means blockdev.ByIDDir.
	DevDir string
	// SysDir is where sysfs is mounted, which the disk checks read; empty means
	// /sys.
	SysDir string
	// Devices are the device names tried for AttachVolume, in order; empty means
	// /dev/xvdu to /dev/xvdz (the range kOps uses for etcd volumes).
	Devices []string
	// Timeout bounds each wait (attachment, device node); Poll is how often to look.
	Timeout, Poll time.Duration
	// Log reports attachments; nil means slog.Default().
	Log *slog.Logger
}

// Find returns the device node of this member's volume, attaching it first if needed.
// A device that is not a whole disk free for the volume is an error matching etcdvolume.ErrUnsafeDisk.
func (a EBS) Find(ctx context.Context) (string, error) {
	switch {
	case a.Client == nil:
		return "", errors.New("aws volume: no EC2 client")
	case a.InstanceID == "" || a.AZ == "":
		return "", errors.New("aws volume: instance ID and availability zone are required")
	case a.Member == "":
		return "", errors.New("aws volume: etcd member name is required")
	}
	vol, err := a.find(ctx)
	if err != nil {
		return "", err
	}
	id := vol.ID
	att, err := a.attachment(vol)
	if err != nil {
		return "", err
	}
	if att == nil {
		if vol.State != volumeAvailable {
			return "", fmt.Errorf("aws volume %s is %s, not available to attach", id, vol.State)
		}
		if err := a.attach(ctx, id); err != nil {
			return "", err
		}
	}
	device, err := a.waitAttached(ctx, id)
	if err != nil {
		return "", err
	}
	dev, err := a.waitDevice(ctx, id, device)
	if err != nil {
		return "", err
	}
	if err := etcdvolume.CheckDisk(a.SysDir, fmt.Sprintf("aws volume %s (%s, member %s)", id, a.etcdTag(), a.Member), dev, a.MountPath); err != nil {
		return "", err
	}
	return dev, nil
}

func (a EBS) etcdTag() string {
	name := a.EtcdCluster
	if name == "" {
		name = defaultEtcdCluster
	}
	return "k8s.io/etcd/" + name
}

func (a EBS) filters() []Filter {
	f := []Filter{{Name: "availability-zone", Values: []string{a.AZ}}}
	if a.Cluster != "" {
		f = append(f, Filter{Name: "tag:kubernetes.io/cluster/" + a.Cluster, Values: []string{"owned"}})
	}
	f = append(f, Filter{Name: "tag-key", Values: []string{a.etcdTag()}})
	for _, k := range slices.Sorted(maps.Keys(a.Tags)) {
		if v := a.Tags[k]; v != "" {
			f = append(f, Filter{Name: "tag:" + k, Values: []string{v}})
		} else {
			f = append(f, Filter{Name: "tag-key", Values: []string{k}})
		}
	}
	return f
}

// find selects this member's volume.
func (a EBS) find(ctx context.Context) (Volume, error) {
	vols, err := a.describe(ctx, nil, a.filters())
	if err != nil {
		return Volume{}, fmt.Errorf("aws volume: %w", err)
	}
	key := a.etcdTag()
	var mine []Volume
	for _, v := range vols {
		for _, t := range v.Tags {
			member, _, _ := strings.Cut(t.Value, "/")
			if t.Key == key && member == a.Member {
				mine = append(mine, v)
			}
		}
	}
	switch len(mine) {
	case 0:
		return Volume{}, fmt.Errorf("aws volume: %w for member %s in %s (tag %s=%s/…, %d volumes match the other filters)", etcdvolume.ErrNotFound, a.Member, a.AZ, key, a.Member, len(vols))
	case 1:
		return mine[0], nil
	}
	var ids []string
	for _, v := range mine {
		ids = append(ids, v.ID)
	}
	return Volume{}, fmt.Errorf("aws volume: %d volumes are tagged for member %s (%s); expected one", len(mine), a.Member, strings.Join(ids, ", "))
}

func (a EBS) describe(ctx context.Context, ids []string, filters []Filter) ([]Volume, error) {
	vols, err := a.Client.DescribeVolumes(ctx, ids, filters)
	if err != nil {
		return nil, fmt.Errorf("describe volumes: %w", err)
	}
	return vols, nil
}

// attachment returns vol's live attachment to this instance, nil when it has none, or
// etcdvolume.ErrAttachedElsewhere when another instance holds it.
func (a EBS) attachment(vol Volume) (*VolumeAttachment, error) {
	for i, att := range vol.Attachments {
		if att.State == attachmentDetached {
			continue
		}
		if other := att.InstanceID; other != a.InstanceID {
			return nil, fmt.Errorf("aws volume %s: %w (%s, %s)", vol.ID, etcdvolume.ErrAttachedElsewhere, other, att.State)
		}
		return &vol.Attachments[i], nil
	}
	return nil, nil
}

// attach attaches volume id to this instance under the first free device name.
func (a EBS) attach(ctx context.Context, id string) error {
	// Device names this instance's volumes already use.
	attached, err := a.describe(ctx, nil, []Filter{{Name: "attachment.instance-id", Values: []string{a.InstanceID}}})
	if err != nil {
		return fmt.Errorf("aws volume %s: %w", id, err)
	}
	used := map[string]bool{}
	for _, v := range attached {
		for _, att := range v.Attachments {
			used[att.Device] = true
		}
	}
	devices := a.Devices
	if len(devices) == 0 {
		devices = []string{"/dev/xvdu", "/dev/xvdv", "/dev/xvdw", "/dev/xvdx", "/dev/xvdy", "/dev/xvdz"}
	}
	for _, dev := range devices {
		if used[dev] {
			continue
		}
		err := a.Client.AttachVolume(ctx, id, a.InstanceID, dev)
		if err == nil {
			a.logger().InfoContext(ctx, "attaching etcd volume", "volume", id, "instance", a.InstanceID, "device", dev)
			return nil
		}
		var ae *APIError
		if !errors.As(err, &ae) {
			return fmt.Errorf("aws volume %s: attach as %s: %w", id, dev, err)
		}
		switch ae.Code {
		case "InvalidParameterValue":
			if strings.Contains(ae.Message, "in use") {
				continue // the device name is taken after all
			}
		case "IncorrectState", "VolumeInUse":
			// Lost the race: see who holds it now.
			vols, derr := a.describe(ctx, []string{id}, nil)
			if derr == nil && len(vols) == 1 {
				if _, aerr := a.attachment(vols[0]); aerr != nil {
					return aerr
				}
			}
			return fmt.Errorf("aws volume %s: %w (attach refused: %s)", id, etcdvolume.ErrAttachedElsewhere, ae.Message)
		}
		return fmt.Errorf("aws volume %s: attach as %s: %w", id, dev, err)
	}
	return fmt.Errorf("aws volume %s: no free device name among %s", id, strings.Join(devices, " "))
}

// waitAttached waits until volume id is attached to this instance and returns the
// device name it was attached under.
func (a EBS) waitAttached(ctx context.Context, id string) (string, error) {
	var device string
	err := etcdvolume.WaitFor(ctx, a.Timeout, a.Poll, "volume "+id+" to be attached", func() (bool, error) {
		vols, err := a.describe(ctx, []string{id}, nil)
		if err != nil {
			return false, err
		}
		if len(vols) != 1 {
			return false, fmt.Errorf("describe volume %s: %d volumes returned", id, len(vols))
		}
		att, err := a.attachment(vols[0])
		if err != nil {
			return false, err
		}
		if att == nil {
			return false, nil // DescribeVolumes is eventually consistent: the attachment shows up later
		}
		if att.State == attachmentDetaching {
			return false, fmt.Errorf("volume %s is being detached from this instance; retry later", id)
		}
		device = att.Device
		return att.State == attachmentAttached, nil
	})
	if err != nil {
		return "", fmt.Errorf("aws volume %s: %w", id, err)
	}
	return device, nil
}

// waitDevice waits for the volume's device node. On Nitro instances an EBS volume is an NVMe
// controller whose serial is the volume id without its dash; the links tried, first found wins:
//   - aws-ebs-<volume id>: the kiln image's udev rule (overlays/aws), which matches the serial
//     alone, so a QEMU NVMe disk with serial vol… is found as on EC2;
//   - nvme-Amazon_Elastic_Block_Store_vol…: systemd's stock link, which also needs EBS's model
//     string (an image without kiln's rule on EC2);
//   - on Xen instances, the device name the volume was attached under.
func (a EBS) waitDevice(ctx context.Context, id, device string) (string, error) {
	dir := a.DevDir
	if dir == "" {
		dir = blockdev.ByIDDir
	}
	links := []string{
		filepath.Join(dir, "aws-ebs-"+id),
		filepath.Join(dir, "nvme-Amazon_Elastic_Block_Store_"+strings.ReplaceAll(id, "-", "")),
	}
	if device != "" {
		links = append(links, device)
	}
	var found string
	err := etcdvolume.WaitFor(ctx, a.Timeout, a.Poll, links[0], func() (bool, error) {
		for _, p := range links {
			if dev, err := filepath.EvalSymlinks(p); err == nil {
				found = dev
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return "", fmt.Errorf("aws volume %s: %w", id, err)
	}
	return found, nil
}

func (a EBS) logger() *slog.Logger {
	if a.Log != nil {
		return a.Log
	}
	return slog.Default()
}
