package stage1

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/kilnproject/kiln/initd/blockdev"
	"github.com/kilnproject/kiln/initd/etcdvolume"
	"github.com/kilnproject/kiln/initd/source"
	"github.com/kilnproject/kiln/initd/stage1/liveroot"
	"github.com/kilnproject/kiln/initd/stage1/netup"
	"github.com/kilnproject/kiln/internal/nodeimage"
	"github.com/kilnproject/kiln/internal/poll"
)

// liveDir holds a live boot's root image, in the initramfs' own tmpfs or ramfs.
const liveDir = "/live"

// bootLive mounts a live boot's root and /var: it brings the network up (unless the root image
// is on the boot medium and no config URL is given), fetches or copies and verifies the root
// image into RAM, mounts it read-only on /sysroot through a loop device and puts /var
// where chooseVar says.
func bootLive(ctx context.Context, log *slog.Logger, cl Cmdline, modFailures []moduleError) (BootInfo, error) {
	info := BootInfo{Mode: modeLive, RootURL: cl.live.url, RootSHA256: cl.live.sha256}
	_, fromMedium, _ := liveroot.MediumPath(cl.live.url)
	_, configURL := cl.Kiln[strings.TrimPrefix(source.CmdlineURLKey, "kiln.")]
	// A root image on the boot medium needs no network; a config URL still does.
	if !fromMedium || configURL {
		lease, err := netup.Up(ctx, log, netup.Options{Timeout: cl.netTimeout})
		if err != nil {
			return info, withModules(err, modFailures)
		}
		info.Link, info.Address = lease.Link, lease.Address.String()
	}
	dev, mounted, err := mountLiveRoot(ctx, log, liveroot.Fetcher{Dir: liveDir}, liveMedium(cl), cl.live, cl.rootFSType, cl.verity, sysRoot)
	if err != nil {
		if fromMedium { // a missing CD or filesystem driver is the likely cause
			err = withModules(err, modFailures)
		}
		return info, err
	}
	info.RootDevice, info.VerifiedDevice, info.RootHash = dev, verifiedDev(mounted, dev), cl.verity.hex()
	var etcd *etcdvolume.Selection
	if configURL {
		// First boot fetches the config again, as it does on any boot.
		if etcd, err = etcdvolume.FetchSelection(ctx, log, cl.Raw, nil); err != nil {
			return info, fmt.Errorf("live: %w", err)
		}
	}
	choice, err := waitChooseVar(ctx, log, sysBlock, devDir, cl, etcd)
	if err != nil {
		return info, err
	}
	info.VarKind, info.VarWhy = choice.kind, choice.why
	info.VarDevice, err = mountLiveVar(ctx, log, choice)
	return info, err
}

// mediumDir is where a live boot from a CD or USB stick mounts its medium while it copies the
// root image into RAM.
const mediumDir = "/run/kiln-medium"

// liveMedium is where a live boot whose root image is on its boot medium looks for it: the
// volume labelled nodeimage.ISOLabel, waited for up to kiln.rootwait=.
func liveMedium(cl Cmdline) liveroot.Medium {
	return liveroot.Medium{Label: nodeimage.ISOLabel, SysBlock: sysBlock, DevDir: devDir, MountDir: mediumDir, Wait: cl.RootWait}
}

// withModules adds the modules that failed to load to a network error: a missing NIC driver
// is the likely cause.
func withModules(err error, mods []moduleError) error {
	for _, m := range mods {
		err = fmt.Errorf("%w\n%s", err, m.Error())
	}
	return err
}

// mountLiveRoot fetches the root image, verifies it, attaches it to a loop device and mounts
// it read-only on target, through dm-verity when v is set; it returns the loop device and the
// device mounted. Nothing is attached or mounted unless the image's sha256 matched.
func mountLiveRoot(ctx context.Context, log *slog.Logger, f liveroot.Fetcher, m liveroot.Medium, live liveRoot, fstype string, v *verityArgs, target string) (loop, mounted string, err error) {
	start := time.Now()
	var path string
	if file, ok, perr := liveroot.MediumPath(live.url); ok && perr == nil {
		path, err = f.FetchMedium(ctx, log, m, file, live.sha256)
	} else {
		path, err = f.Fetch(ctx, log, live.url, live.sha256)
	}
	if err != nil {
		return "", "", err
	}
	log.Info("live root verified", "sha256", live.sha256, "took", time.Since(start).Round(time.Millisecond))
	dev, err := liveroot.Attach(path)
	if err != nil {
		return "", "", fmt.Errorf("live root: %w", err)
	}
	mounted, err = mountVerified(log, "live root", dev, target, fstype, v)
	if err != nil {
		if derr := liveroot.Detach(dev); derr != nil {
			err = errors.Join(err, derr)
		}
		return "", "", fmt.Errorf("live root %s: %w", live.url, err)
	}
	return dev, mounted, nil
}

// waitChooseVar runs chooseVar, waiting up to kiln.rootwait= for a disk kiln.data.dev= names,
// or the etcd volume (etcd) while blank disks are passed over for want of it, to appear, and
// says on the console where /var goes and which disks it passed over.
func waitChooseVar(ctx context.Context, log *slog.Logger, sysBlock, devDir string, cl Cmdline, etcd *etcdvolume.Selection) (varChoice, error) {
	var (
		choice varChoice
		chosen bool // choice is the last attempt's
	)
	what := "kiln.data.dev=" + cl.dataDev
	if cl.dataDev == "" && etcd != nil {
		what = "the etcd volume (" + etcd.String() + ")"
	}
	err := poll.Until(ctx, poll.Options{
		What:      what,
		Timeout:   max(cl.RootWait, time.Nanosecond),
		Backoff:   poll.Constant(250 * time.Millisecond),
		Retryable: func(err error) bool { return errors.Is(err, errNotFound) },
	}, func(context.Context) (bool, error) {
		var err error
		choice, err = chooseVar(sysBlock, devDir, cl.dataDev, etcd)
		chosen = err == nil
		return chosen && choice.etcdUnseen == "", err
	})
	var pe *poll.Error
	switch {
	case errors.As(err, &pe) && pe.Last != nil:
		return varChoice{}, fmt.Errorf("%w (waited %s)", pe.Last, cl.RootWait)
	case errors.Is(err, poll.ErrTimeout) && chosen:
		// The etcd volume did not appear: the choice made without it stands.
	case err != nil:
		return varChoice{}, err
	}
	for _, s := range choice.skipped {
		log.Info("not for /var: " + s)
	}
	if choice.kind == varTmpfs {
		log.Warn(choice.why)
	} else {
		log.Info("/var: " + choice.why)
	}
	return choice, nil
}

// mountLiveVar mounts /var as choice says (making the data partition on a blank disk) and
// returns the device it is on, "tmpfs" for RAM.
func mountLiveVar(ctx context.Context, log *slog.Logger, choice varChoice) (string, error) {
	dev := choice.partition
	switch {
	case choice.kind == varTmpfs:
		return "tmpfs", mountVarTmpfs(log)
	case dev != "":
	case choice.blank:
		d := choice.disk
		p, err := newDataDisk(d.Path, d.SectorSize)
		if err != nil {
			return "", err
		}
		log.Info("created data partition", "disk", d.Path, "partition", p.Index, "partuuid", p.GUID)
		if err := rereadPartitions(log, d.Path, p, d.SectorSize); err != nil {
			return "", err
		}
		if dev, err = waitForPartition(ctx, sysBlock, devDir, d.Name, p.Index, partWait); err != nil {
			return "", fmt.Errorf("data partition: %w", err)
		}
	default:
		d := choice.disk
		var err error
		if _, ok := blockdev.PartitionDevice(sysBlock, devDir, d.Name, d.Partitions[0].Index); !ok {
			if err := rereadPartitions(log, d.Path, d.Partitions[0], d.SectorSize); err != nil {
				return "", err
			}
		}
		if dev, err = waitForPartition(ctx, sysBlock, devDir, d.Name, d.Partitions[0].Index, partWait); err != nil {
			return "", fmt.Errorf("data partition: %w", err)
		}
	}
	return dev, mountVar(ctx, log, dev)
}
