package liveroot

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

const (
	loopControl = "/dev/loop-control"
	loopTries   = 5
	nodeWait    = 2 * time.Second
)

// Attach attaches the image file at path read-only to a free loop device and returns the
// device node, e.g. /dev/loop0. The device keeps the file, so the file may be unlinked
// afterwards (freeing the initramfs does) without freeing the image.
func Attach(path string) (string, error) {
	ctl, err := os.OpenFile(loopControl, os.O_RDWR, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("attach %s: no %s: the kernel has no loop driver (loop must be among the initramfs modules)", path, loopControl)
	}
	if err != nil {
		return "", fmt.Errorf("attach %s: %w", path, err)
	}
	defer ctl.Close()
	img, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("attach %s: %w", path, err)
	}
	defer img.Close()
	for range loopTries {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return "", fmt.Errorf("attach %s: find a free loop device: %w", path, err)
		}
		dev := fmt.Sprintf("/dev/loop%d", n)
		err = configure(dev, img, path)
		if errors.Is(err, unix.EBUSY) {
			continue // another process took it between the two calls
		}
		if err != nil {
			return "", fmt.Errorf("attach %s to %s: %w", path, dev, err)
		}
		return dev, nil
	}
	return "", fmt.Errorf("attach %s: every free loop device was taken before it could be used (%d tries)", path, loopTries)
}

// configure binds img to the loop device dev, read-only: LOOP_CONFIGURE, or LOOP_SET_FD and
// LOOP_SET_STATUS64 on kernels before 5.8.
func configure(dev string, img *os.File, path string) error {
	l, err := openNode(dev)
	if err != nil {
		return err
	}
	defer l.Close()
	cfg := unix.LoopConfig{Fd: uint32(img.Fd()), Info: unix.LoopInfo64{Flags: unix.LO_FLAGS_READ_ONLY}}
	copy(cfg.Info.File_name[:len(cfg.Info.File_name)-1], path)
	err = unix.IoctlLoopConfigure(int(l.Fd()), &cfg)
	if !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOTTY) {
		return err
	}
	if err := unix.IoctlSetInt(int(l.Fd()), unix.LOOP_SET_FD, int(img.Fd())); err != nil {
		return err
	}
	if err := unix.IoctlLoopSetStatus64(int(l.Fd()), &cfg.Info); err != nil {
		_ = unix.IoctlSetInt(int(l.Fd()), unix.LOOP_CLR_FD, 0)
		return err
	}
	return nil
}

// openNode opens a device node devtmpfs may not have made yet.
func openNode(dev string) (*os.File, error) {
	deadline := time.Now().Add(nodeWait)
	for {
		f, err := os.OpenFile(dev, os.O_RDWR, 0)
		if err == nil || !errors.Is(err, fs.ErrNotExist) || time.Now().After(deadline) {
			return f, err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Detach releases the loop device dev (once nothing has it mounted).
func Detach(dev string) error {
	l, err := os.OpenFile(dev, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("detach %s: %w", dev, err)
	}
	defer l.Close()
	if err := unix.IoctlSetInt(int(l.Fd()), unix.LOOP_CLR_FD, 0); err != nil {
		return fmt.Errorf("detach %s: %w", dev, err)
	}
	return nil
}
