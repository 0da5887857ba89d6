// Package stage1 is kiln-init's initramfs PID 1: it mounts the kernel filesystems, loads the
// modules listed in /etc/kiln/modules.load and, as the kernel command line says (Cmdline.mode):
//
//   - disk boot (root=PARTUUID=…): finds the root partition (root-a, or root-b after an update)
//     by its PARTUUID, creates the data partition on first boot, mounts the read-only root at
//     /sysroot through dm-verity and makes (first boot), checks and mounts the ext4 data
//     filesystem on /sysroot/var;
//   - live boot (kiln.live.rootfs_url=…): brings the network up (package netup), fetches the root
//     image into RAM and verifies its sha256 before mounting it read-only at /sysroot through a
//     loop device (package liveroot), and mounts /var from the disk kiln.data.dev= names, a data
//     disk an earlier live boot made, the first blank disk (which it partitions) or tmpfs.
//
// Either way /var is seeded from the root's /var on its first boot, persistent overlays go on
// /sysroot/etc, /usr/local and /opt, how it booted is recorded at BootInfoPath, and it switches root to systemd.
// Every step checks before it acts, so a later boot, or a boot after a power cut half-way, ends in
// the same state.
package stage1

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kilnproject/kiln/initd/blockdev"
	"github.com/kilnproject/kiln/internal/cmdline"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

// Paths and names from the boot contract.
const (
	sysRoot      = "/sysroot"
	initPath     = "/sbin/init"
	dataTmp      = "/tmp/kiln-data"
	sysBlock     = "/sys/block"
	devDir       = "/dev"
	partWait     = 10 * time.Second
	toolPathList = "/usr/sbin:/usr/bin:/sbin:/bin"
)

// Run performs stage 1 and never returns on success (it execs systemd). It returns an error only
// when it cannot go on; the caller prints it and waits. console is where an install boot
// prints its result line. An install boot is handed to package install once the modules are
// loaded and the network is up.
func Run(ctx context.Context, log *slog.Logger, console io.Writer) error {
	start := time.Now()
	if err := mountKernelFS(log); err != nil {
		return err
	}
	// The modules load before the command line is read: a stage 1 that fails on its command
	// line still needs efivarfs to tell whether it is an update's try (TrialEntry).
	modFailures, err := loadModuleList(ctx, log, nodeimage.ModulesLoadPath)
	if err != nil {
		return err
	}
	cl, err := readCmdline(log)
	if err != nil {
		return err
	}
	var info BootInfo
	switch cl.mode() {
	case modeDisk:
		info, err = bootDisk(ctx, log, cl, modFailures)
	case modeLive:
		info, err = bootLive(ctx, log, cl, modFailures)
	case modeInstall:
		return runInstall(ctx, log, console, cl, modFailures)
	default:
		err = fmt.Errorf("kernel cmdline: a %s boot is not supported by this kiln-init", cl.mode())
	}
	if err != nil {
		return err
	}
	if err := mountOverlays(log); err != nil {
		return err
	}
	if err := writeBootInfo("/", info); err != nil {
		return err
	}
	for _, d := range []string{"/dev", "/proc", "/sys", "/run"} {
		if err := moveMount(d, filepath.Join(sysRoot, d)); err != nil {
			return err
		}
	}
	log.Info("switching root", "mode", info.Mode, "init", initPath, "took", time.Since(start).Round(time.Millisecond))
	freeInitramfs(log)
	return switchRoot(sysRoot, initPath, os.Args[1:])
}

// bootDisk mounts a disk boot's root (root-a, or root-b after an update) and its data
// partition on /var.
func bootDisk(ctx context.Context, log *slog.Logger, cl Cmdline, modFailures []moduleError) (BootInfo, error) {
	rootName, rootDev, dataDev, err := findPartitions(ctx, log, cl, modFailures)
	if err != nil {
		return BootInfo{}, err
	}
	mounted, err := mountVerified(log, rootName, rootDev, sysRoot, cl.rootFSType, cl.verity)
	if err != nil {
		return BootInfo{}, err
	}
	if err := mountVar(ctx, log, dataDev); err != nil {
		return BootInfo{}, err
	}
	return BootInfo{Mode: modeDisk, RootDevice: rootDev, VerifiedDevice: verifiedDev(mounted, rootDev), RootHash: cl.verity.hex(),
		VarDevice: dataDev, VarKind: varKindDisk}, nil
}

// readCmdline parses the running kernel's command line and logs what stage 1 acts on.
func readCmdline(log *slog.Logger) (Cmdline, error) {
	raw, err := os.ReadFile(cmdline.ProcPath)
	if err != nil {
		return Cmdline{}, fmt.Errorf("read kernel cmdline: %w", err)
	}
	cl, err := parseCmdline(string(raw))
	if err != nil {
		return Cmdline{}, err
	}
	switch cl.mode() {
	case modeLive:
		log.Info("stage 1", "mode", cl.mode(), "rootfs_url", cl.live.url, "rootfstype", cl.rootFSType, "platform", cl.platform())
	case modeInstall:
		log.Info("stage 1", "mode", cl.mode(), "image_url", cl.Kiln["install.image_url"], "dev", cl.Kiln["install.dev"], "platform", cl.platform())
	default:
		log.Info("stage 1", "mode", cl.mode(), "root", "PARTUUID="+cl.rootPARTUUID, "rootfstype", cl.rootFSType, "platform", cl.platform())
	}
	if cl.dataDev != "" && cl.mode() == modeDisk {
		log.Warn("kiln.data.dev= applies to live boots only; a disk boot keeps /var on its own data partition", "kiln.data.dev", cl.dataDev)
	}
	if cl.readWrite {
		log.Warn("rw on the kernel cmdline is ignored: the root is mounted read-only")
	}
	return cl, nil
}

// findPartitions waits for the root partition, creates the data partition beside it when
// the disk has none yet, and returns the root's GPT name (root-a, or root-b after an update)
// and both device nodes. A root that does not show up is a
// *rootNotFoundError that also lists the command line and the modules that failed to load.
func findPartitions(ctx context.Context, log *slog.Logger, cl Cmdline, modFailures []moduleError) (rootName, rootDev, dataDev string, err error) {
	disk, rootPart, _, err := waitForRoot(ctx, log, sysBlock, devDir, cl.rootPARTUUID, cl.RootWait)
	if err != nil {
		var nf *rootNotFoundError
		if errors.As(err, &nf) {
			nf.cmdline = cl.Raw
			nf.modules = modFailures
		}
		return "", "", "", err
	}
	data, created, err := ensureDataPartition(disk.Path, disk.SectorSize)
	if err != nil {
		return "", "", "", fmt.Errorf("data partition on %s: %w", disk.Path, err)
	}
	if created {
		log.Info("created data partition", "disk", disk.Path, "partition", data.Index, "partuuid", data.GUID,
			"bytes", int64(data.End-data.Start+1)*int64(disk.SectorSize))
	}
	// Re-read whenever the kernel does not know the partition, not only right after creating it:
	// a power cut between the GPT write and the re-read must converge too.
	if _, ok := blockdev.PartitionDevice(sysBlock, devDir, disk.Name, data.Index); !ok {
		if err := rereadPartitions(log, disk.Path, data, disk.SectorSize); err != nil {
			return "", "", "", err
		}
	}
	if rootDev, err = waitForPartition(ctx, sysBlock, devDir, disk.Name, rootPart.Index, partWait); err != nil {
		return "", "", "", fmt.Errorf("root partition: %w", err)
	}
	if dataDev, err = waitForPartition(ctx, sysBlock, devDir, disk.Name, data.Index, partWait); err != nil {
		return "", "", "", fmt.Errorf("data partition: %w", err)
	}
	return rootPart.Name, rootDev, dataDev, nil
}

// mountVar prepares the data filesystem on dataDev, seeds it from the root's /var on its
// first boot and mounts it on the new root's /var.
func mountVar(ctx context.Context, log *slog.Logger, dataDev string) error {
	if err := prepareData(ctx, log, dataDev); err != nil {
		return err
	}
	if err := mount(log, dataDev, dataTmp, "ext4", 0, ""); err != nil {
		return fmt.Errorf("data filesystem: %w", err)
	}
	return seedVar(log, dataDev)
}

// mountVarTmpfs puts /var in RAM, seeded from the root's /var.
func mountVarTmpfs(log *slog.Logger) error {
	if err := mount(log, "tmpfs", dataTmp, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755"); err != nil {
		return fmt.Errorf("/var in RAM: %w", err)
	}
	return seedVar(log, "tmpfs")
}

// seedVar seeds the filesystem mounted on dataTmp (from what) from the root's /var on its first
// boot and moves it to the new root's /var.
func seedVar(log *slog.Logger, what string) error {
	seedStart := time.Now()
	seeded, err := seedOnce(filepath.Join(sysRoot, "var"), dataTmp)
	if err != nil {
		return fmt.Errorf("seed %s from the root's /var: %w", what, err)
	}
	if seeded {
		log.Info("seeded data filesystem from /var", "device", what, "took", time.Since(seedStart).Round(time.Millisecond))
	}
	return moveMount(dataTmp, filepath.Join(sysRoot, "var"))
}

func mountKernelFS(log *slog.Logger) error {
	const nsnd = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC
	mounts := []struct {
		src, target, fstype string
		flags               uintptr
		data                string
	}{
		{"devtmpfs", "/dev", "devtmpfs", unix.MS_NOSUID, "mode=0755"},
		{"proc", "/proc", "proc", nsnd, ""},
		{"sysfs", "/sys", "sysfs", nsnd, ""},
		{"tmpfs", "/run", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=0755,size=20%"},
	}
	for _, m := range mounts {
		if err := mount(log, m.src, m.target, m.fstype, m.flags, m.data); err != nil {
			return err
		}
	}
	return nil
}

func loadModuleList(ctx context.Context, log *slog.Logger, path string) ([]moduleError, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		log.Warn("no module list, loading no modules", "path", path)
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("module list: %w", err)
	}
	defer f.Close()
	mods, err := parseModulesLoad(f, path)
	if err != nil {
		return nil, err
	}
	rep := loadModules(ctx, log, mods)
	log.Info("modules loaded", "count", rep.loaded, "of", len(mods), "unused", len(rep.unused), "failed", len(rep.failed),
		"took", rep.elapsed.Round(time.Millisecond))
	if len(rep.failed) > 0 {
		names := make([]string, len(rep.failed))
		for i, f := range rep.failed {
			names[i] = moduleName(f.path)
		}
		log.Error("modules failed to load; the root or data filesystem may not mount", "modules", strings.Join(names, ","))
	}
	return rep.failed, nil
}

// mountRootAt mounts dev read-only on target (/sysroot) as fstype, or as squashfs then erofs
// when fstype is empty.
func mountRootAt(log *slog.Logger, dev, target, fstype string) error {
	types := []string{"squashfs", "erofs"}
	if fstype != "" {
		types = []string{fstype}
	}
	var errs []error
	for _, t := range types {
		err := mount(log, dev, target, t, unix.MS_RDONLY, "")
		if err == nil {
			log.Info("root mounted", "device", dev, "fstype", t)
			return nil
		}
		errs = append(errs, err)
	}
	return fmt.Errorf("mount root %s read-only: %w", dev, errors.Join(errs...))
}

// prepareData makes the data filesystem if the partition is blank, refuses anything that is not
// ext4, and checks it. The tools are the root's own, run chrooted into /sysroot with /dev, /proc
// and /sys bound in.
func prepareData(ctx context.Context, log *slog.Logger, dev string) (err error) {
	fs, err := checkDataFilesystem(dev)
	if err != nil {
		return err
	}
	var bound []string
	defer func() {
		for i := len(bound) - 1; i >= 0; i-- {
			if uerr := unix.Unmount(bound[i], unix.MNT_DETACH); uerr != nil && err == nil {
				err = fmt.Errorf("unmount %s: %w", bound[i], uerr)
			}
		}
	}()
	for _, d := range []string{"/dev", "/proc", "/sys"} {
		target := filepath.Join(sysRoot, d)
		if mp, _ := isMountPoint(target); mp {
			continue
		}
		if err := unix.Mount(d, target, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind %s into %s for the root's tools: %w", d, sysRoot, err)
		}
		bound = append(bound, target)
	}
	if fs == blockdev.FSNone {
		log.Info("making data filesystem", "device", dev, "label", nodeimage.DataLabel)
		out, err := runInRoot(ctx, []string{"/usr/sbin/mkfs.ext4", "/sbin/mkfs.ext4"}, "-q", "-L", nodeimage.DataLabel, dev)
		if err != nil {
			return fmt.Errorf("mkfs.ext4 %s: %w: %s", dev, err, out)
		}
		if fs, err = blockdev.ProbeFilesystem(dev); err != nil || fs != blockdev.FSExt4 {
			return fmt.Errorf("mkfs.ext4 %s: afterwards the device holds %q (%v)", dev, fs, err)
		}
		return nil
	}
	out, err := runInRoot(ctx, []string{"/usr/sbin/e2fsck", "/sbin/e2fsck"}, "-p", dev)
	var ee *exec.ExitError
	switch {
	case err == nil:
		log.Debug("data filesystem checked", "device", dev, "output", out)
	case errors.As(err, &ee) && ee.ExitCode() < 4:
		log.Info("e2fsck repaired the data filesystem", "device", dev, "exit", ee.ExitCode(), "output", out)
	default:
		// Mounting may still work; if it does not, that error stops the boot.
		log.Warn("e2fsck could not check the data filesystem", "device", dev, "err", err, "output", out)
	}
	return nil
}

// checkDataFilesystem probes the data partition dev: FSExt4 (use it), FSNone (blank: make it), or an
// error for anything else, which stage 1 never formats.
func checkDataFilesystem(dev string) (string, error) {
	fs, err := blockdev.ProbeFilesystem(dev)
	if err != nil {
		return "", err
	}
	if fs != blockdev.FSNone && fs != blockdev.FSExt4 {
		return "", fmt.Errorf("data partition %s holds %s, not ext4: refusing to format it (wipe it to start afresh)", dev, fs)
	}
	return fs, nil
}

// runInRoot runs the first existing candidate program chrooted into /sysroot.
func runInRoot(ctx context.Context, candidates []string, args ...string) (string, error) {
	prog := ""
	for _, c := range candidates {
		if _, err := os.Stat(filepath.Join(sysRoot, c)); err == nil {
			prog = c
			break
		}
	}
	if prog == "" {
		return "", fmt.Errorf("the root has none of %s", strings.Join(candidates, ", "))
	}
	cmd := exec.CommandContext(ctx, prog, args...)
	cmd.SysProcAttr = &unix.SysProcAttr{Chroot: sysRoot}
	cmd.Dir = "/"
	cmd.Env = []string{"PATH=" + toolPathList}
	out, err := cmd.CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// The read-only root's directories a node may write are nodeimage.Overlays: each gets a
// persistent overlay whose upper and work directories are on the data filesystem, below its
// State. /etc must exist; /usr/local and /opt are writable as on Fedora CoreOS (persistent,
// under /var), but as overlays, so what the bake put there (CNI plugins in /opt/cni/bin, say)
// stays visible and is replaced by the next image, unless the node wrote over a file.

// mountOverlays puts each of nodeimage.Overlays on /sysroot; a directory the root does
// not have (or has as a link) gets none, unless it is required.
func mountOverlays(log *slog.Logger) error {
	for _, o := range nodeimage.Overlays() {
		lower := filepath.Join(sysRoot, o.Dir)
		if fi, err := os.Lstat(lower); err != nil || !fi.IsDir() {
			if o.Required {
				return fmt.Errorf("%s overlay: the root has no directory %s", o.Dir, o.Dir)
			}
			log.Debug("no overlay: not a directory in the root", "dir", o.Dir)
			continue
		}
		upper, work := filepath.Join(sysRoot, o.State, "upper"), filepath.Join(sysRoot, o.State, "work")
		for _, d := range []string{upper, work} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				return fmt.Errorf("%s overlay: %w", o.Dir, err)
			}
		}
		opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", lower, upper, work)
		if err := mount(log, "overlay", lower, "overlay", 0, opts); err != nil {
			return fmt.Errorf("%s overlay: %w", o.Dir, err)
		}
	}
	return nil
}

// IsInitramfsInit reports whether the process is an initramfs' /init: PID 1 started as /init
// (the kernel's argv[0]), whatever the other arguments (the kernel passes unknown command-line
// words on). PID 1 alone is not enough: a container runs kiln-init as its PID 1 too, as the
// controller-manager's init container does with "kube wait-api".
func IsInitramfsInit(pid int, argv0 string) bool {
	return pid == 1 && filepath.Base(argv0) == "init"
}
