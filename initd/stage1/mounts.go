package stage1

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/kilnproject/kiln/initd/blockdev"
)

// isMountPoint reports whether path is the root of a mount: its device differs from its parent's.
// It cannot see a bind mount of a directory onto the same filesystem, which stage 1 never makes.
func isMountPoint(path string) (bool, error) {
	var st, pst unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return false, err
	}
	if err := unix.Lstat(filepath.Join(path, ".."), &pst); err != nil {
		return false, err
	}
	return st.Dev != pst.Dev || st.Ino == pst.Ino, nil
}

// mount mounts source on target (creating target when it is missing and writable) unless target
// is already a mount point, which makes each step safe to repeat.
func mount(log *slog.Logger, source, target, fstype string, flags uintptr, data string) error {
	if err := os.MkdirAll(target, 0o755); err != nil {
		return fmt.Errorf("mount %s on %s: %w", source, target, err)
	}
	if mp, err := isMountPoint(target); err == nil && mp {
		log.Debug("already mounted", "target", target)
		return nil
	}
	if err := unix.Mount(source, target, fstype, flags, data); err != nil {
		return fmt.Errorf("mount %s (%s) on %s: %w", source, fstype, target, err)
	}
	log.Debug("mounted", "source", source, "target", target, "fstype", fstype)
	return nil
}

// moveMount moves the mount at from onto to.
func moveMount(from, to string) error {
	if err := unix.Mount(from, to, "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("move mount %s to %s: %w", from, to, err)
	}
	return nil
}

// rereadPartitions asks the kernel to read the partition table of disk again. When a partition of
// the disk is busy (BLKRRPART gives EBUSY) it adds p alone with BLKPG.
func rereadPartitions(log *slog.Logger, disk string, p blockdev.Partition, sectorSize int) error {
	f, err := os.Open(disk)
	if err != nil {
		return fmt.Errorf("re-read partition table: %w", err)
	}
	defer f.Close()
	fd := int(f.Fd())
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.BLKRRPART, 0)
	if errno == 0 {
		return nil
	}
	if errno != unix.EBUSY {
		return fmt.Errorf("re-read partition table of %s (BLKRRPART): %w", disk, errno)
	}
	log.Warn("partition table busy, adding the partition with BLKPG", "disk", disk, "partition", p.Index)
	bp := unix.BlkpgPartition{
		Start:  int64(p.Start) * int64(sectorSize),
		Length: int64(p.End-p.Start+1) * int64(sectorSize),
		Pno:    int32(p.Index),
	}
	arg := unix.BlkpgIoctlArg{Op: unix.BLKPG_ADD_PARTITION, Datalen: int32(unsafe.Sizeof(bp)), Data: (*byte)(unsafe.Pointer(&bp))}
	_, _, errno = unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.BLKPG, uintptr(unsafe.Pointer(&arg)))
	if errno != 0 && errno != unix.EBUSY { // EBUSY: the kernel already has that partition
		return fmt.Errorf("add partition %d to %s (BLKPG): %w", p.Index, disk, errno)
	}
	return nil
}

// freeInitramfs deletes the initramfs files (they live in RAM) without crossing into mounts. It
// refuses to run unless it is PID 1 and / is a ramfs or tmpfs.
func freeInitramfs(log *slog.Logger) {
	if os.Getpid() != 1 {
		return
	}
	var sfs unix.Statfs_t
	if err := unix.Statfs("/", &sfs); err != nil || (sfs.Type != unix.RAMFS_MAGIC && sfs.Type != unix.TMPFS_MAGIC) {
		log.Debug("not freeing initramfs: / is not ramfs/tmpfs")
		return
	}
	var root unix.Stat_t
	if err := unix.Lstat("/", &root); err != nil {
		return
	}
	var walk func(dir string)
	walk = func(dir string) {
		ents, err := os.ReadDir(dir)
		if err != nil {
			return
		}
		for _, e := range ents {
			p := filepath.Join(dir, e.Name())
			var st unix.Stat_t
			if unix.Lstat(p, &st) != nil || st.Dev != root.Dev {
				continue
			}
			if e.IsDir() {
				walk(p)
				if err := unix.Rmdir(p); err != nil && !errors.Is(err, unix.ENOTEMPTY) && !errors.Is(err, unix.EBUSY) {
					log.Debug("free initramfs", "path", p, "err", err)
				}
				continue
			}
			_ = unix.Unlink(p)
		}
	}
	walk("/")
}

// switchRoot makes newRoot the root directory and execs init in it, like util-linux switch_root.
func switchRoot(newRoot, init string, args []string) error {
	if _, err := os.Lstat(filepath.Join(newRoot, init)); err != nil {
		return fmt.Errorf("switch root: no %s in %s: %w", init, newRoot, err)
	}
	if err := unix.Chdir(newRoot); err != nil {
		return fmt.Errorf("switch root: %w", err)
	}
	if err := unix.Mount(newRoot, "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("switch root: move %s to /: %w", newRoot, err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("switch root: chroot: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return fmt.Errorf("switch root: %w", err)
	}
	argv := append([]string{init}, args...)
	if err := syscall.Exec(init, argv, os.Environ()); err != nil {
		return fmt.Errorf("exec %s: %w", init, err)
	}
	return nil
}
