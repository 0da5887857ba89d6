package install

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kilnproject/kiln/initd/blockdev"
	"github.com/kilnproject/kiln/initd/etcdvolume"
	"github.com/kilnproject/kiln/initd/stage1/liveroot"
	"github.com/kilnproject/kiln/internal/decompress"
	"github.com/kilnproject/kiln/internal/poll"
)

// Options tune an install. The zero value installs on the running system with the defaults
// below.
type Options struct {
	// host is where disks are looked for.
	host host
	// Cmdline is the raw kernel command line; kiln.config.url= is fetched from it as first
	// boot will (variables, kiln.config.timeout=). "" means a line holding only
	// kiln.config.url= (params.configURL).
	Cmdline string
	// httpClient fetches the image and the config; nil means http.DefaultClient.
	httpClient *http.Client
	// attempts bounds the tries of the image's initial request (default 5); retryPause is
	// the first pause between them, doubling (default 2s). A body cut short is not
	// retried: the install fails and the disk stays unbootable.
	attempts   int
	retryPause time.Duration
	// stallTimeout ends a download during which nothing arrived for so long (default 60s).
	stallTimeout time.Duration
	// progressEvery is how often progress is logged (default 5s).
	progressEvery time.Duration
	// DiskWait bounds the wait for the target disk to appear: the kernel probes disks while
	// stage 1 runs, and udev, which would say when it is done, does not run (default 30s,
	// kiln.rootwait=). Refusals that a later disk cannot change are not waited on.
	DiskWait time.Duration
	// clock times the retries; nil is the wall clock.
	clock poll.Clock
	// Medium is where a kiln.install.image_url=medium:<path> image is looked for: the boot
	// medium's label, the block devices and where to mount it.
	Medium liveroot.Medium
}

func (o Options) withDefaults(p params) Options {
	o.httpClient = cmp.Or(o.httpClient, http.DefaultClient)
	o.attempts = cmp.Or(o.attempts, 5)
	o.retryPause = cmp.Or(o.retryPause, 2*time.Second)
	o.stallTimeout = cmp.Or(o.stallTimeout, time.Minute)
	o.progressEvery = cmp.Or(o.progressEvery, 5*time.Second)
	o.DiskWait = cmp.Or(o.DiskWait, 30*time.Second)
	o.Cmdline = cmp.Or(o.Cmdline, paramKey(paramConfigURL)+"="+p.configURL)
	return o
}

// result is a finished install.
type result struct {
	image  string // the image file's name
	device string
	bytes  int64 // the image's size, decompressed
	// options is the installed boot entry's kernel command line.
	options string
}

// install writes the image p names to the disk p names (or auto's choice) and returns once the
// disk is bootable; see the package comment for the order of the writes. A failed install
// returns an error saying why and, once the disk was touched, that it no longer boots.
func install(ctx context.Context, log *slog.Logger, p params, o Options) (result, error) {
	o = o.withDefaults(p)
	var etcd *etcdvolume.Selection
	if p.configURL != "" {
		var err error
		if etcd, err = etcdvolume.FetchSelection(ctx, log, o.Cmdline, o.httpClient); err != nil {
			return result{}, fmt.Errorf("install: %w", err)
		}
	}
	h := sha256.New()
	var d *download
	var err error
	if p.mediumFile != "" {
		d, err = openMedium(ctx, log, o, p.mediumFile, h)
	} else {
		d, err = openImage(ctx, log, o, p.imageURL, h)
	}
	if err != nil {
		return result{}, fmt.Errorf("install: %w", err)
	}
	defer d.close()
	target, err := waitTarget(ctx, log, o, p, etcd, d.mediumDev, d.minSize)
	if err != nil {
		return result{}, fmt.Errorf("install: %w", err)
	}
	if len(target.holds) > 0 {
		log.Warn("install: wiping the disk (kiln.install.wipe=1)", "disk", target.String(), "held", target.holding())
	}
	log.Info("install: writing", "image", p.imageName(), "compression", d.kind, "served", d.served(), "disk", target.String())
	res, err := write(ctx, log, o, p, d, h, target)
	if err != nil {
		return result{}, fmt.Errorf("install %s to %s: %w", p.imageName(), target.path, err)
	}
	return res, nil
}

// waitTarget chooses the target, looking again while the error says a disk is missing (see
// missing), until o.DiskWait has passed, and logs the disks it kept clear of.
func waitTarget(ctx context.Context, log *slog.Logger, o Options, p params, etcd *etcdvolume.Selection, mediumDev string, minSize int64) (hostDisk, error) {
	var (
		d     hostDisk
		disks []hostDisk
	)
	logged := false
	err := poll.Retry(ctx, poll.Options{
		What:      "the disk to install to",
		Timeout:   o.DiskWait,
		Backoff:   poll.Constant(500 * time.Millisecond),
		Retryable: func(err error) bool { return errors.Is(err, errMissing) },
		OnRetry: func(a poll.Attempt) {
			if !logged {
				log.Info("install: waiting for disks", "for", o.DiskWait, "because", a.Err)
				logged = true
			}
		},
	}, func(context.Context) error {
		var err error
		d, disks, err = pickTarget(o.host, p, etcd, mediumDev, minSize)
		return err
	})
	var pe *poll.Error
	if errors.As(err, &pe) && pe.Last != nil {
		return hostDisk{}, fmt.Errorf("after waiting %s for disks: %w", o.DiskWait, pe.Last)
	}
	if err != nil {
		return hostDisk{}, err
	}
	logSkipped(log, p, etcd, disks, d, minSize)
	return d, nil
}

// pickTarget scans the disks, marks the etcd volume and chooses the target; it returns the
// disks seen too. The etcd volume's selector must select a disk, so that the installer can
// keep clear of it, wherever the installer could write over the etcd disk's data: with
// kiln.install.dev=auto, and when the disk named holds data (kiln.install.wipe=1). A disk
// named that is empty holds no etcd data, and a disk image (a regular file) is no etcd disk.
// The disk whose device node is mediumDev holds the boot medium the image is read from and is
// never chosen.
func pickTarget(host host, p params, etcd *etcdvolume.Selection, mediumDev string, minSize int64) (hostDisk, []hostDisk, error) {
	disks, err := host.scan()
	if err != nil {
		return hostDisk{}, nil, err
	}
	markMedium(disks, mediumDev)
	etcdErr := markEtcd(disks, etcd)
	if etcdErr != nil && p.dev == auto {
		return hostDisk{}, nil, fmt.Errorf("kiln.%s=%s: %w", paramDev, auto, etcdErr)
	}
	d, err := choose(disks, p, minSize)
	if err != nil {
		return hostDisk{}, nil, err
	}
	if mediumDev != "" && !d.medium && sameFile(d.path, mediumDev) {
		return hostDisk{}, nil, fmt.Errorf("kiln.%s=%s: %s holds the boot medium the image is read from: %w; the installer never writes it", paramDev, p.dev, d, errNoTarget)
	}
	if etcdErr != nil && len(d.holds) > 0 && isScanned(disks, d) {
		return hostDisk{}, nil, fmt.Errorf("kiln.%s=%s with kiln.%s=1: %s %s, and %w", paramDev, p.dev, paramWipe, d, d.holding(), etcdErr)
	}
	if d.sectorSize != imageSectorSize {
		return hostDisk{}, nil, fmt.Errorf("kiln.%s=%s: %s has %d-byte sectors; kiln images are laid out for %d", paramDev, p.dev, d, d.sectorSize, imageSectorSize)
	}
	return d, disks, nil
}

// sameFile reports whether the paths a and b name the same file or device node.
func sameFile(a, b string) bool {
	sa, err := os.Stat(a)
	if err != nil {
		return false
	}
	sb, err := os.Stat(b)
	return err == nil && os.SameFile(sa, sb)
}

// isScanned reports whether d is one of the disks host.scan found, not a disk image.
func isScanned(disks []hostDisk, d hostDisk) bool {
	return slices.ContainsFunc(disks, func(s hostDisk) bool { return s.path == d.path })
}

// logSkipped says on the console which disks the installer passed over for target and why:
// the etcd volume always, and with auto every disk it may not or would not take. An etcd
// volume selector that selects none of the disks is a warning.
func logSkipped(log *slog.Logger, p params, etcd *etcdvolume.Selection, disks []hostDisk, target hostDisk, minSize int64) {
	if etcd != nil && !slices.ContainsFunc(disks, func(d hostDisk) bool { return d.etcd != "" }) {
		why := "it is empty, so it holds no etcd data either way"
		if !isScanned(disks, target) {
			why = "it is a disk image, not a disk, so it is not the etcd volume"
		}
		log.Warn(fmt.Sprintf("install: the node config's %s selects none of the disks seen; kiln.%s=%s: %s", etcd, paramDev, p.dev, why),
			"disk", target.String())
	}
	for _, d := range disks {
		if d.path == target.path {
			continue
		}
		why := d.exclusion(minSize)
		switch {
		case d.etcd != "":
			log.Info("install: skipped the etcd volume", "disk", d.String(), "selector", d.etcd)
		case d.medium:
			log.Info("install: skipped the boot medium", "disk", d.String())
		case p.dev != auto:
		case why != "":
			log.Info("install: skipped", "disk", d.String(), "why", why)
		case len(d.holds) > 0:
			log.Info("install: skipped", "disk", d.String(), "why", d.holding())
		}
	}
}

// write destroys the target's partition tables, streams the image to it and commits it.
func write(ctx context.Context, log *slog.Logger, o Options, p params, d *download, h hash.Hash, target hostDisk) (result, error) {
	f, block, err := openTarget(target.path)
	if err != nil {
		return result{}, err
	}
	defer f.Close()
	size, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return result{}, fmt.Errorf("size: %w", err)
	}
	unbootable := func(err error) error {
		return fmt.Errorf("%w; %s has no partition table now and does not boot (a network boot first retries the install)", err, target.path)
	}
	if err := destroyTables(f, size); err != nil {
		return result{}, unbootable(err)
	}
	start := time.Now()
	st := newStaging(f, size, log, o.progressEvery)
	if err := stream(ctx, d, st, h, p.sha256); err != nil {
		return result{}, unbootable(err)
	}
	v := st.view()
	esp, err := checkImage(v)
	if err != nil {
		return result{}, unbootable(err)
	}
	res := result{image: p.imageName(), device: target.path, bytes: st.n}
	if p.configURL == "" {
		log.Info("install: no kiln.config.url= to hand over; the image's boot entry is kept as it is")
	} else if res.options, err = addConfigURL(v, esp, p.configURL); err != nil {
		return result{}, unbootable(err)
	}
	if err := st.commit(); err != nil {
		return result{}, unbootable(err)
	}
	if _, err := blockdev.ReadGPT(target.path, imageSectorSize); err != nil {
		return result{}, fmt.Errorf("the written GPT does not read back: %w", err)
	}
	if block {
		// The reboot reads the table anyway: a kernel that keeps the old one is no failure.
		if err := rereadPartitions(ctx, f); err != nil {
			log.Warn("install: "+err.Error(), "disk", target.path)
		}
	}
	el := time.Since(start)
	log.Info("install: written", "MiB", st.n>>20, "took", el.Round(time.Millisecond),
		"MiB/s", fmt.Sprintf("%.1f", float64(st.n)/(1<<20)/max(el.Seconds(), 1e-3)), "options", res.options)
	return res, nil
}

// stream copies the decompressed image into st and checks the sha256 of every byte served.
func stream(ctx context.Context, d *download, st *staging, h hash.Hash, want string) error {
	img, err := d.image()
	if err != nil {
		return err
	}
	_, err = io.CopyBuffer(st, img, make([]byte, 1<<20))
	img.Close()
	if err == nil {
		err = d.finish()
	}
	if errors.Is(err, errTooLarge) || errors.Is(err, decompress.ErrMemoryLimit) {
		return err
	}
	if err != nil {
		if cause := context.Cause(d.ctx); cause != nil && !errors.Is(err, cause) && !strings.Contains(err.Error(), cause.Error()) {
			err = fmt.Errorf("%w (%v)", err, cause)
		}
		return fmt.Errorf("download cut short after %d MiB of the image: %w", st.n>>20, err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != want {
		return fmt.Errorf("sha256 mismatch: the image file (%s) has sha256 %s, kiln.%s=%s", d.served(), got, paramImageHash, want)
	}
	if st.n <= headSize {
		return fmt.Errorf("the image is only %d bytes: not a kiln disk image", st.n)
	}
	return ctx.Err()
}

// openTarget opens the disk for writing, exclusively when it is a block device (the open
// fails while anything has it mounted).
func openTarget(path string) (*os.File, bool, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, false, err
	}
	block := st.Mode()&os.ModeDevice != 0 && st.Mode()&os.ModeCharDevice == 0
	flags := os.O_RDWR
	if block {
		flags |= unix.O_EXCL
	}
	f, err := os.OpenFile(path, flags, 0)
	if err != nil {
		return nil, false, fmt.Errorf("open for writing: %w", err)
	}
	return f, block, nil
}

// destroyTables zeroes the first and the last MiB of the disk (protective MBR, primary and
// backup GPT, and the signatures kept there) and the backup GPT an old primary header points
// to (an image smaller than the disk had its backup inside the disk), and syncs.
func destroyTables(f *os.File, size int64) error {
	zero := make([]byte, min(size, headSize))
	offs := []int64{0, max(0, size-int64(len(zero)))}
	hdr := make([]byte, 92)
	if _, err := f.ReadAt(hdr, imageSectorSize); err == nil && string(hdr[:8]) == "EFI PART" {
		// The backup header's sector, and the 32 sectors of entries before it.
		alt := int64(binary.LittleEndian.Uint64(hdr[32:40])) * imageSectorSize
		if alt > 32*imageSectorSize && alt < size {
			offs = append(offs, max(0, min(alt+imageSectorSize, size)-int64(len(zero))))
		}
	}
	for _, off := range offs {
		if _, err := f.WriteAt(zero, off); err != nil {
			return fmt.Errorf("destroy the partition tables: %w", err)
		}
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("destroy the partition tables: sync: %w", err)
	}
	return nil
}

// rereadPartitions asks the kernel to read the new partition table, retrying while it
// answers EBUSY.
func rereadPartitions(ctx context.Context, f *os.File) error {
	err := poll.Retry(ctx, poll.Options{
		What:      "the kernel to re-read the partition table",
		Timeout:   10 * time.Second,
		Backoff:   poll.Constant(250 * time.Millisecond),
		Retryable: func(err error) bool { return errors.Is(err, unix.EBUSY) },
	}, func(context.Context) error {
		_, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.BLKRRPART, 0)
		if errno != 0 {
			return errno
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("re-read partition table (BLKRRPART): %w", err)
	}
	return nil
}
