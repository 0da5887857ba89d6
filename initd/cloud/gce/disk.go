package gce

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/kilnproject/kiln/initd/blockdev"
	"github.com/kilnproject/kiln/initd/etcdvolume"
)

// Disk finds a zonal persistent disk by name, or by its labels, and attaches it to this
// instance (read-write, under DeviceName) when it is not attached yet. A disk attached to another
// instance, or taken by another instance while this one tries, gives
// etcdvolume.ErrAttachedElsewhere. The disk appears as /dev/disk/by-id/google-<device name>.
type Disk struct {
	Service  *ComputeService
	Project  string
	Zone     string
	Instance string
	DiskName string
	// Labels, when DiskName is empty, select the disk: the one disk in Zone that carries
	// every label ("" matches any value). None or several is an error.
	Labels map[string]string
	// DeviceName is the name the disk is attached under; empty means the disk's name.
	DeviceName string
	// MountPath is the volume's mount point: a disk mounted there and nowhere else is
	// the volume, mounted by an earlier run, and is accepted. Any other use of the disk
	// found (see etcdvolume.CheckDisk) is refused.
	MountPath string
	// DevDir is the by-id directory; empty means blockdev.ByIDDir.
	DevDir string
	// SysDir is where sysfs is mounted, which the disk checks read; empty means
	// /sys.
	SysDir string
	// Timeout bounds each wait (the attach operation, the device node); Poll is how
	// often to look.
	Timeout, Poll time.Duration
	// Log reports attachments; nil means slog.Default().
	Log *slog.Logger
}

// Find returns the device node of the disk, attaching it first if needed. A device that
// is not a whole disk free for the volume is an error matching etcdvolume.ErrUnsafeDisk.
func (g Disk) Find(ctx context.Context) (string, error) {
	switch {
	case g.Service == nil:
		return "", errors.New("gce disk: no compute service")
	case g.Project == "" || g.Zone == "" || g.Instance == "" || (g.DiskName == "") == (len(g.Labels) == 0):
		return "", errors.New("gce disk: project, zone, instance and either a disk name or labels are required")
	}
	if g.DiskName == "" {
		name, err := g.byLabels(ctx)
		if err != nil {
			return "", err
		}
		g.DiskName = name
	}
	fail := func(err error) (string, error) {
		return "", fmt.Errorf("gce disk %s: %w", g.DiskName, err)
	}
	disk, err := g.Service.getDisk(ctx, g.Project, g.Zone, g.DiskName)
	if err != nil {
		if isNotFound(err) {
			return fail(fmt.Errorf("%w in project %s, zone %s", etcdvolume.ErrNotFound, g.Project, g.Zone))
		}
		return fail(fmt.Errorf("get: %w", err))
	}
	self := fmt.Sprintf("/projects/%s/zones/%s/instances/%s", g.Project, g.Zone, g.Instance)
	mine := false
	for _, u := range disk.Users {
		if strings.HasSuffix(u, self) {
			mine = true
		} else {
			return fail(fmt.Errorf("%w (%s)", etcdvolume.ErrAttachedElsewhere, u))
		}
	}
	device := g.DeviceName
	if device == "" {
		device = g.DiskName
	}
	if mine {
		// Attached already, maybe under another device name.
		inst, err := g.Service.getInstance(ctx, g.Project, g.Zone, g.Instance)
		if err != nil {
			return fail(fmt.Errorf("get instance %s: %w", g.Instance, err))
		}
		for _, d := range inst.Disks {
			if sameResource(d.Source, disk.SelfLink) && d.DeviceName != "" {
				device = d.DeviceName
			}
		}
	} else if err := g.attach(ctx, disk, device); err != nil {
		return fail(err)
	}
	dev, err := g.waitDevice(ctx, device)
	if err != nil {
		return fail(err)
	}
	if err := etcdvolume.CheckDisk(g.SysDir, "gce disk "+g.DiskName, dev, g.MountPath); err != nil {
		return "", err
	}
	return dev, nil
}

// byLabels returns the name of the one disk in the zone that carries every label.
func (g Disk) byLabels(ctx context.Context) (string, error) {
	var exprs, want []string
	for _, k := range slices.Sorted(maps.Keys(g.Labels)) {
		if v := g.Labels[k]; v != "" {
			exprs = append(exprs, fmt.Sprintf("(labels.%s = %q)", k, v))
			want = append(want, k+"="+v)
		} else {
			exprs = append(exprs, fmt.Sprintf("(labels.%s:*)", k))
			want = append(want, k)
		}
	}
	var names []string
	err := g.Service.listDisks(ctx, g.Project, g.Zone, strings.Join(exprs, " "), func(disks []computeDisk) {
		for _, d := range disks {
			if hasLabels(d.Labels, g.Labels) { // the filter is the server's; check what it answered
				names = append(names, d.Name)
			}
		}
	})
	if err != nil {
		return "", fmt.Errorf("gce disk with labels %s: list: %w", strings.Join(want, ","), err)
	}
	switch len(names) {
	case 0:
		return "", fmt.Errorf("gce disk with labels %s: %w in project %s, zone %s", strings.Join(want, ","), etcdvolume.ErrNotFound, g.Project, g.Zone)
	case 1:
		return names[0], nil
	}
	return "", fmt.Errorf("gce disk with labels %s: %d disks match (%s); expected one", strings.Join(want, ","), len(names), strings.Join(names, ", "))
}

func hasLabels(have, want map[string]string) bool {
	for k, v := range want {
		got, ok := have[k]
		if !ok || v != "" && got != v {
			return false
		}
	}
	return true
}

func (g Disk) attach(ctx context.Context, disk *computeDisk, device string) error {
	op, err := g.Service.attachDisk(ctx, g.Project, g.Zone, g.Instance, newRequestID(), computeAttachedDisk{
		Source: disk.SelfLink, DeviceName: device, Mode: "READ_WRITE", Type: "PERSISTENT",
	})
	if err != nil {
		if inUse(err) {
			return fmt.Errorf("%w (attach refused: %v)", etcdvolume.ErrAttachedElsewhere, err)
		}
		return fmt.Errorf("attach to %s: %w", g.Instance, err)
	}
	g.logger().InfoContext(ctx, "attaching etcd disk", "disk", g.DiskName, "instance", g.Instance, "device", device, "operation", op.Name)
	err = etcdvolume.WaitFor(ctx, g.Timeout, g.Poll, "attach operation "+op.Name, func() (bool, error) {
		if op.Status == "DONE" {
			return true, nil
		}
		// Wait returns when the operation is done or after up to two minutes.
		op, err = g.Service.waitOperation(ctx, g.Project, g.Zone, op.Name)
		if err != nil {
			return false, fmt.Errorf("wait for operation: %w", err)
		}
		return op.Status == "DONE", nil
	})
	if err != nil {
		return fmt.Errorf("attach to %s: %w", g.Instance, err)
	}
	if op.Error != nil && len(op.Error.Errors) > 0 {
		var msgs []string
		elsewhere := false
		for _, e := range op.Error.Errors {
			msgs = append(msgs, e.Code+": "+e.Message)
			elsewhere = elsewhere || e.Code == "RESOURCE_IN_USE_BY_ANOTHER_RESOURCE"
		}
		if elsewhere {
			return fmt.Errorf("%w (%s)", etcdvolume.ErrAttachedElsewhere, strings.Join(msgs, "; "))
		}
		return fmt.Errorf("attach to %s failed: %s", g.Instance, strings.Join(msgs, "; "))
	}
	return nil
}

func (g Disk) waitDevice(ctx context.Context, device string) (string, error) {
	dir := g.DevDir
	if dir == "" {
		dir = blockdev.ByIDDir
	}
	link := filepath.Join(dir, "google-"+device)
	var dev string
	err := etcdvolume.WaitFor(ctx, g.Timeout, g.Poll, link, func() (bool, error) {
		d, err := filepath.EvalSymlinks(link)
		if err != nil {
			return false, nil
		}
		dev = d
		return true, nil
	})
	return dev, err
}

func (g Disk) logger() *slog.Logger {
	if g.Log != nil {
		return g.Log
	}
	return slog.Default()
}

// sameResource compares two resource URLs by their path from /projects/ on, so that
// www.googleapis.com and compute.googleapis.com links match.
func sameResource(a, b string) bool {
	tail := func(s string) string {
		if i := strings.Index(s, "/projects/"); i >= 0 {
			return s[i:]
		}
		return s
	}
	return a != "" && tail(a) == tail(b)
}

func isNotFound(err error) bool {
	var ae *APIError
	return errors.As(err, &ae) && ae.Code == http.StatusNotFound
}

// inUse reports whether an API error says the disk is used by another instance.
func inUse(err error) bool {
	var ae *APIError
	if !errors.As(err, &ae) {
		return false
	}
	return ae.HasReason("resourceInUseByAnotherResource") || strings.Contains(ae.Message, "already being used by")
}
