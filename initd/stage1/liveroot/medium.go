package liveroot

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kilnproject/kiln/internal/nodeimage"
	"github.com/kilnproject/kiln/internal/poll"
)

// Medium is where a live boot from a CD, a virtual medium or a USB stick finds its root image:
// the ISO 9660 volume labelled Label on one of the block devices.
type Medium struct {
	// Label is the volume identifier looked for (nodeimage.ISOLabel).
	Label string
	// SysBlock lists the block devices (/sys/block), DevDir holds their nodes (/dev).
	SysBlock, DevDir string
	// MountDir is where the volume is mounted read-only while the image is copied.
	MountDir string
	// Wait bounds how long FetchMedium waits for the volume to appear (kiln.rootwait=).
	Wait time.Duration
}

// FindMedium returns the device node of the first block device (in name order) whose ISO 9660
// primary volume descriptor has the volume identifier label, and the devices it looked at
// without finding it. A device that cannot be read (an empty CD drive) is passed over.
func FindMedium(sysBlock, devDir, label string) (dev string, looked []string, err error) {
	entries, err := os.ReadDir(sysBlock)
	if err != nil {
		return "", nil, fmt.Errorf("list block devices: %w", err)
	}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		names = append(names, e.Name())
	}
	slices.Sort(names)
	for _, name := range names {
		p := filepath.Join(devDir, name)
		id, err := nodeimage.ISOVolumeID(p)
		if err != nil {
			continue
		}
		if id == label {
			return p, looked, nil
		}
		looked = append(looked, fmt.Sprintf("%s (ISO 9660 %q)", name, id))
	}
	return "", looked, nil
}

// MediumPath is the file a kiln.live.rootfs_url= of nodeimage.MediumScheme names on the medium,
// and whether url is of that scheme. The path must be absolute and clean.
func MediumPath(url string) (string, bool, error) {
	p, ok := strings.CutPrefix(url, nodeimage.MediumScheme)
	if !ok {
		return "", false, nil
	}
	if !strings.HasPrefix(p, "/") || path.Clean(p) != p || p == "/" {
		return "", true, fmt.Errorf("%q is not an absolute, clean path of a file on the medium (want %s%s)", p, nodeimage.MediumScheme, nodeimage.ISORootFSPath)
	}
	return p, true, nil
}

// FetchMedium waits for the medium m, mounts it read-only (iso9660), copies the file file from
// it into Dir/rootfs.img and checks it has the sha256 want, as Fetch does for a URL; the medium
// is unmounted again before it returns. It returns the image's path; on any error the file is
// gone.
func (f Fetcher) FetchMedium(ctx context.Context, log *slog.Logger, m Medium, file, want string) (string, error) {
	what := nodeimage.MediumScheme + file
	if err := os.MkdirAll(f.Dir, 0o700); err != nil {
		return "", fmt.Errorf("live root: %w", err)
	}
	room, err := f.room()
	if err != nil {
		return "", fmt.Errorf("live root: %w", err)
	}
	dev, unmount, err := MountMedium(ctx, log, m)
	if err != nil {
		return "", fmt.Errorf("live root %s: %w", what, err)
	}
	out, err := f.copyVerified(log, m.MountDir, file, want, room)
	if uerr := unmount(); uerr != nil && err == nil {
		os.Remove(out)
		err = uerr
	}
	if err != nil {
		return "", fmt.Errorf("live root %s on %s: %w", what, dev, err)
	}
	return out, nil
}

// MountMedium waits for the medium m (see FindMedium) and mounts it read-only (iso9660) on
// m.MountDir. It returns the medium's device node, whose disk holds the medium and is no
// place to write to, and the function that unmounts it again.
func MountMedium(ctx context.Context, log *slog.Logger, m Medium) (dev string, unmount func() error, err error) {
	dev, err = waitMedium(ctx, m)
	if err != nil {
		return "", nil, err
	}
	log.Info("boot medium found", "device", dev, "label", m.Label)
	if err := os.MkdirAll(m.MountDir, 0o755); err != nil {
		return "", nil, fmt.Errorf("boot medium: %w", err)
	}
	if err := unix.Mount(dev, m.MountDir, "iso9660", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return "", nil, fmt.Errorf("mount %s (iso9660) read-only on %s: %w (isofs must be among the initramfs modules)", dev, m.MountDir, err)
	}
	return dev, func() error {
		if err := unix.Unmount(m.MountDir, 0); err != nil {
			return fmt.Errorf("unmount the boot medium %s from %s: %w", dev, m.MountDir, err)
		}
		return nil
	}, nil
}

// copyVerified copies the file file of the medium mounted on dir into Dir/rootfs.img, checks it
// has the sha256 want and makes it read-only. On any error the copy is gone.
func (f Fetcher) copyVerified(log *slog.Logger, dir, file, want string, room int64) (string, error) {
	out := filepath.Join(f.Dir, fileName)
	sum, err := f.copyFile(log, filepath.Join(dir, filepath.FromSlash(file)), out, room)
	if err == nil && sum != want {
		err = fmt.Errorf("sha256 mismatch: the image has %s, kiln.live.rootfs_sha256 wants %s: refusing to use it", sum, want)
	}
	if err == nil {
		err = os.Chmod(out, 0o400)
	}
	if err != nil {
		os.Remove(out)
		return "", err
	}
	return out, nil
}

// waitMedium polls for the medium until m.Wait has passed: a CD drive or USB stick may show
// up, or its medium be read, a while after the modules loaded.
func waitMedium(ctx context.Context, m Medium) (string, error) {
	var dev string
	var looked []string
	err := poll.Until(ctx, poll.Options{
		What:    "the ISO 9660 volume labelled " + m.Label,
		Timeout: max(m.Wait, time.Nanosecond),
		Backoff: poll.Constant(250 * time.Millisecond),
	}, func(context.Context) (bool, error) {
		var err error
		dev, looked, err = FindMedium(m.SysBlock, m.DevDir, m.Label)
		return dev != "", err
	})
	if err != nil {
		if errors.Is(err, poll.ErrTimeout) {
			seen := "no ISO 9660 volume at all"
			if len(looked) > 0 {
				seen = "only " + strings.Join(looked, ", ")
			}
			return "", fmt.Errorf("no block device holds the ISO 9660 volume labelled %s after %s (%s; the CD driver sr_mod must be among the initramfs modules)", m.Label, m.Wait, seen)
		}
		return "", err
	}
	return dev, nil
}

// copyFile copies src into dst, refusing one larger than room, and returns its sha256.
func (f Fetcher) copyFile(log *slog.Logger, src, dst string, room int64) (string, error) {
	in, err := os.Open(src)
	if err != nil {
		return "", err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return "", err
	}
	if !fi.Mode().IsRegular() {
		return "", fmt.Errorf("%s is not a regular file", src)
	}
	if fi.Size() > room {
		return "", fmt.Errorf("the image is %s, more than the %s of RAM free for it", size(fi.Size()), size(room))
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return "", fmt.Errorf("create %s: %w", dst, err)
	}
	h := sha256.New()
	p := &progress{log: log, total: fi.Size(), every: defaultProgress, last: time.Now(), verb: "copying"}
	_, err = io.Copy(io.MultiWriter(fileWriter{out, room}, h, p), in)
	if cerr := out.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("write %s: %w", dst, cerr)
	}
	if err != nil {
		return "", fmt.Errorf("copy %s: %w", src, err)
	}
	log.Info("live root copied from the medium", "bytes", p.done)
	return hex.EncodeToString(h.Sum(nil)), nil
}
