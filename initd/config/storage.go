package config

import (
	"errors"
	"fmt"
	"os"
	"path"
	"regexp"
	"slices"
	"strings"

	"github.com/coreos/ignition/v2/config/v3_6/types"

	"github.com/kilnproject/kiln/initd/rootpath"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

// The checks below cover storage.disks, raid, luks and filesystems: what kiln can honour
// beyond what Ignition's own validation (run by Parse) checked — absolute device paths,
// partition numbers and labels, known RAID levels and filesystem formats, unique names.
// Package initd/firstboot/storage applies them.

// RaidLevels are the md levels kiln creates.
var RaidLevels = []string{"raid0", "raid1", "raid10"}

// raidAliases are the other names Ignition and mdadm take for them.
var raidAliases = map[string]string{"0": "raid0", "stripe": "raid0", "1": "raid1", "mirror": "raid1", "10": "raid10"}

// RaidLevel is the md level a storage.raid[].level names, "stripe" and "0" as raid0,
// "mirror" and "1" as raid1, "10" as raid10; false when kiln does not create it.
func RaidLevel(level string) (string, bool) {
	if l, ok := raidAliases[level]; ok {
		return l, true
	}
	return level, containsString(RaidLevels, level)
}

// FilesystemFormats are the formats kiln makes.
var FilesystemFormats = []string{"ext4", "xfs", "vfat", "swap"}

// LuksOpenOptions are the cryptsetup open options kiln takes in storage.luks[].openOptions,
// each with the /etc/crypttab option that gives it on later boots.
var LuksOpenOptions = map[string]string{
	"--allow-discards":              "discard",
	"--perf-no_read_workqueue":      "no-read-workqueue",
	"--perf-no_write_workqueue":     "no-write-workqueue",
	"--perf-same_cpu_crypt":         "same-cpu-crypt",
	"--perf-submit_from_crypt_cpus": "submit-from-crypt-cpus",
}

// reservedMounts are mount points a storage.filesystems path may not be: the node's own
// filesystems, which stage 1 mounted before first boot ran (the overlays of
// nodeimage.Overlays too), and /var/run, the base's link to /run.
var reservedMounts = []string{"/", "/etc", "/var", "/run", "/tmp", "/var/run", "/opt"}

// reservedTrees are the trees no storage.filesystems path may be in: the kernel's filesystems,
// the image's read-only root, where /bin, /sbin and /lib… are links into /usr on a merged-/usr
// base (CheckMountPaths follows the links an image has), its boot files and kiln's own state.
var reservedTrees = []struct{ dir, what string }{
	{"/proc", "the kernel's process filesystem"},
	{"/sys", "the kernel's sysfs"},
	{"/dev", "the kernel's device filesystem"},
	{"/usr", "the image's read-only root"},
	{"/bin", "the image's read-only root"},
	{"/sbin", "the image's read-only root"},
	{"/lib", "the image's read-only root"},
	{"/lib32", "the image's read-only root"},
	{"/lib64", "the image's read-only root"},
	{"/libx32", "the image's read-only root"},
	{"/boot", "the image's boot files"},
	{"/efi", "the image's boot files"},
	{nodeimage.StateDir, "kiln's own state (the overlays' upper directories)"},
}

// mountProblem says why no filesystem may be mounted at the clean absolute path p; "" when
// one may.
func mountProblem(p string) string {
	if slices.Contains(reservedMounts, p) || slices.ContainsFunc(nodeimage.Overlays(), func(o nodeimage.Overlay) bool { return o.Dir == p }) {
		return p + " is one of the node's own filesystems, mounted before first boot runs"
	}
	for _, t := range reservedTrees {
		switch {
		case p == t.dir:
			return p + " is " + t.what
		case strings.HasPrefix(p, t.dir+"/"):
			return fmt.Sprintf("%s is in %s, %s", p, t.dir, t.what)
		}
	}
	return ""
}

// notBlockDevices are names directly under /dev that are never a disk, partition, array or
// volume: the calling process's files, terminals, memory, the kernel's other character
// devices and sockets, and the directories of such (fd, pts, shm, input…). Names starting
// with tty are terminals too.
var notBlockDevices = []string{"fd", "stdin", "stdout", "stderr", "pts", "shm", "mqueue", "hugepages", "null", "zero",
	"full", "random", "urandom", "console", "kmsg", "mem", "kmem", "port", "ptmx", "log", "initctl", "kvm", "fuse", "cuse",
	"rtc", "rtc0", "watchdog", "watchdog0", "hwrng", "net", "snd", "input", "dri", "cpu", "vfio", "vsock", "vhost-net",
	"vhost-vsock", "uinput", "autofs", "loop-control", "btrfs-control", "bus", "char", "block"}

// vfatUUID is a FAT volume id as blkid shows it (and Ignition takes it).
var vfatUUID = regexp.MustCompile(`^[0-9A-Fa-f]{4}-?[0-9A-Fa-f]{4}$`)

func checkDisk(field string, d types.Disk) []error {
	var errs []error
	errs = append(errs, checkDevice(field+".device", d.Device)...)
	for i, p := range d.Partitions {
		pf := fmt.Sprintf("%s.partitions[%d]", field, i)
		if p.ShouldExist != nil && !*p.ShouldExist && p.Number == 0 {
			errs = append(errs, &FieldError{Path: pf + ".number", Err: errors.New("required when shouldExist is false")})
		}
	}
	return errs
}

func checkRaid(field string, r types.Raid) []error {
	var errs []error
	level, ok := RaidLevel(deref(r.Level))
	if !ok {
		errs = append(errs, &FieldError{Path: field + ".level",
			Err: unsupported(fmt.Sprintf("level %q is not supported (%s are, and their other names stripe, mirror, 0, 1 and 10)", level, strings.Join(RaidLevels, ", ")))})
	}
	for i, d := range r.Devices {
		errs = append(errs, checkDevice(fmt.Sprintf("%s.devices[%d]", field, i), string(d))...)
	}
	if r.Spares != nil && *r.Spares > 0 && level == "raid0" {
		errs = append(errs, &FieldError{Path: field + ".spares", Err: errors.New("raid0 has no redundancy and takes no spares")})
	}
	return errs
}

func checkLuks(field string, l types.Luks) []error {
	var errs []error
	if l.Device == nil || *l.Device == "" {
		errs = append(errs, &FieldError{Path: field + ".device", Err: errors.New("is required")})
	} else {
		errs = append(errs, checkDevice(field+".device", *l.Device)...)
	}
	if src := deref(l.KeyFile.Source); src != "" {
		lower := strings.ToLower(src)
		switch {
		case strings.HasPrefix(lower, "data:"):
		case strings.HasPrefix(lower, "http://"), strings.HasPrefix(lower, "https://"):
			if deref(l.KeyFile.Verification.Hash) == "" {
				errs = append(errs, &FieldError{Path: field + ".keyFile.verification.hash",
					Err: errors.New("required for an http(s) source: kiln verifies every downloaded byte (give sha256-<hex> or sha512-<hex>)")})
			}
		default:
			errs = append(errs, &FieldError{Path: field + ".keyFile.source", Err: unsupported("only data:, http: and https: URLs are supported")})
		}
	}
	for i, o := range l.OpenOptions {
		if _, ok := LuksOpenOptions[string(o)]; !ok {
			errs = append(errs, &FieldError{Path: fmt.Sprintf("%s.openOptions[%d]", field, i),
				Err: unsupported(fmt.Sprintf("%q is not supported: later boots open the volume through /etc/crypttab, which takes %s", o, openOptionList()))})
		}
	}
	return errs
}

func openOptionList() string {
	names := make([]string, 0, len(LuksOpenOptions))
	for o := range LuksOpenOptions {
		names = append(names, o)
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}

func checkFilesystem(field string, f types.Filesystem) []error {
	var errs []error
	errs = append(errs, checkDevice(field+".device", f.Device)...)
	format := deref(f.Format)
	if !containsString(FilesystemFormats, format) {
		errs = append(errs, &FieldError{Path: field + ".format",
			Err: unsupported(fmt.Sprintf("format %q is not supported (%s are)", format, strings.Join(FilesystemFormats, ", ")))})
	}
	if u := deref(f.UUID); u != "" && format == "vfat" && !vfatUUID.MatchString(u) {
		errs = append(errs, &FieldError{Path: field + ".uuid", Err: fmt.Errorf("%q is not a FAT volume id (XXXX-XXXX, hexadecimal)", u)})
	}
	if p := deref(f.Path); p != "" {
		clean := path.Clean(p)
		switch {
		case format == "swap":
			errs = append(errs, &FieldError{Path: field + ".path", Err: errors.New("a swap area is not mounted: leave path out")})
		case !path.IsAbs(p):
			errs = append(errs, &FieldError{Path: field + ".path", Err: fmt.Errorf("%q is not an absolute path", p)})
		default:
			if why := mountProblem(clean); why != "" {
				errs = append(errs, &FieldError{Path: field + ".path", Err: fmt.Errorf("%s; mount below /var or elsewhere", why)})
			}
		}
	}
	for i, o := range f.MountOptions {
		if strings.ContainsAny(string(o), " \t\n,\\") || o == "" {
			errs = append(errs, &FieldError{Path: fmt.Sprintf("%s.mountOptions[%d]", field, i),
				Err: fmt.Errorf("%q: one option per entry, without blanks, commas or backslashes", o)})
		}
	}
	return errs
}

// checkDevice checks a device path: absolute, under /dev, and not a name that is never a
// block device (/dev/fd/0, /dev/null, /dev/mapper/control). Whether it is one is checked on
// the node, where it is (blockdev.OnBootDisk stats it).
func checkDevice(field, dev string) []error {
	name, ok := strings.CutPrefix(path.Clean(dev), "/dev/")
	if !ok {
		return []error{&FieldError{Path: field, Err: fmt.Errorf("%q is not a device under /dev", dev)}}
	}
	top, _, _ := strings.Cut(name, "/")
	if slices.Contains(notBlockDevices, top) || strings.HasPrefix(top, "tty") || name == "mapper/control" {
		return []error{&FieldError{Path: field, Err: fmt.Errorf("%q is not a block device: give a disk, a partition, a RAID array or a LUKS volume", dev)}}
	}
	return nil
}

// CheckMountPaths refuses each path in filesystems that leads, through the links of the
// image's root tree at root (the node's "/" on the node), to where Validate refuses a mount:
// /var/run is /run in a Debian base, /bin is /usr/bin in a merged-/usr one, and an image may
// have links of its own. Links are resolved inside root, as the node sees its own tree
// (rootpath.Resolve), never on the host running the check; a path that does not exist yet
// is taken as it is written from there on. A path Validate refuses as it is written is left
// to Validate. Each problem is a *FieldError naming the JSON path storage.filesystems[N].path.
func CheckMountPaths(root string, filesystems []types.Filesystem) error {
	r, err := os.OpenRoot(root)
	if err != nil {
		return fmt.Errorf("storage.filesystems: %w", err)
	}
	defer r.Close()
	var errs []error
	for i, f := range filesystems {
		p := deref(f.Path)
		clean := path.Clean(p)
		if !path.IsAbs(p) || deref(f.Format) == "swap" || mountProblem(clean) != "" {
			continue // Validate refuses these
		}
		field := fmt.Sprintf("storage.filesystems[%d].path", i)
		rel, err := rootpath.Resolve(r, clean[1:], func(string) error { return nil })
		if err != nil {
			errs = append(errs, &FieldError{Path: field, Err: err})
			continue
		}
		resolved := path.Join("/", rel)
		if why := mountProblem(resolved); why != "" {
			errs = append(errs, &FieldError{Path: field, Err: fmt.Errorf("%s leads to %s in the image: %s; mount below /var or elsewhere", clean, resolved, why)})
		}
	}
	return errors.Join(errs...)
}

func containsString(list []string, s string) bool { return slices.Contains(list, s) }

// CheckRole refuses what the config asks that a node of role cannot have: a swap area on a
// node that runs kubelet (every Kubernetes role: worker, control-plane, etcd, whose etcd
// kubelet runs as a static pod), since kubelet refuses to start while swap is on unless
// told otherwise (failSwapOn). Each problem is a *FieldError naming its JSON path.
func (c *Config) CheckRole(role Role) error {
	if !role.Known() {
		return nil
	}
	var errs []error
	for i, f := range c.Ignition.Storage.Filesystems {
		if deref(f.Format) == "swap" {
			errs = append(errs, &FieldError{Path: fmt.Sprintf("storage.filesystems[%d].format", i),
				Err: fmt.Errorf("swap is refused on this %s node: kubelet runs there and refuses to start while swap is on (failSwapOn)", role)})
		}
	}
	return errors.Join(errs...)
}
