package blockdev

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"path"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kilnproject/kiln/initd/systemd"
	"github.com/kilnproject/kiln/internal/atomicfile"
)

// mountInfoPath is the kernel's list of the calling process's mounts.
const mountInfoPath = "/proc/self/mountinfo"

// unitName is the systemd mount unit name for mount point where, as
// `systemd-escape --path --suffix=mount` makes it: /var/lib/etcd/my-cluster gives
// var-lib-etcd-my\x2dcluster.mount. where must be absolute.
func unitName(where string) (string, error) { return UnitName(where, "mount") }

// UnitName is the name of the systemd unit of type suffix ("mount", "swap") for the path
// p, as `systemd-escape --path --suffix=SUFFIX` makes it. p must be absolute and
// normalized (no . or .. components).
func UnitName(p, suffix string) (string, error) {
	where := p
	if !path.IsAbs(where) {
		return "", fmt.Errorf("mount point %q is not an absolute path", where)
	}
	for _, c := range strings.Split(where, "/") {
		if c == "." || c == ".." {
			return "", fmt.Errorf("mount point %q is not a normalized path (it has a %q component)", where, c)
		}
	}
	p = strings.Trim(path.Clean(where), "/")
	if p == "" {
		return "-." + suffix, nil
	}
	var b strings.Builder
	for i := 0; i < len(p); i++ {
		c := p[i]
		switch {
		case c == '/':
			b.WriteByte('-')
		case c == '.' && i == 0:
			// A leading dot would make a hidden file name.
			fmt.Fprintf(&b, `\x%02x`, c)
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == ':', c == '_', c == '.':
			b.WriteByte(c)
		default:
			fmt.Fprintf(&b, `\x%02x`, c)
		}
	}
	return b.String() + "." + suffix, nil
}

// ByUUIDPath is the stable /dev/disk/by-uuid name of the filesystem with uuid.
func ByUUIDPath(uuid string) string { return "/dev/disk/by-uuid/" + uuid }

// MountUnit writes /etc/systemd/system/<escaped where>.mount in root, mounting what on
// where with type fstype and options noatime,nofail, ordered before containerd.service
// and kubelet.service, and enables it (WantedBy=local-fs.target). It reports whether
// anything changed; an identical unit that is already enabled is left alone.
//
// what must be a stable device name under /dev/disk/ (ByUUIDPath of Result.UUID, or a
// /dev/disk/by-id link): kernel names such as /dev/nvme1n1 may differ at the next boot.
// nofail keeps a node whose disk went missing bootable and reachable; etcd then does not
// start, because its manifest lives on the volume (see LinkManifest).
func MountUnit(root, what, where, fstype string) (changed bool, err error) {
	name, err := unitName(where)
	if err != nil {
		return false, fmt.Errorf("mount unit: %w", err)
	}
	if !strings.HasPrefix(what, "/dev/disk/") || path.Clean(what) != what {
		return false, fmt.Errorf("mount unit %s: device %q is not a stable name under /dev/disk/ (use /dev/disk/by-uuid/<uuid> or a /dev/disk/by-id link)", name, what)
	}
	if fstype == "" || strings.ContainsAny(fstype, " \t\n/") {
		return false, fmt.Errorf("mount unit %s: filesystem type %q is not valid", name, fstype)
	}
	unit := fmt.Sprintf(`# Written by kiln-init: the etcd data volume. etcd's manifest lives on it.
[Unit]
Description=etcd data volume on %[3]s
Before=containerd.service kubelet.service

[Mount]
What=%[1]s
Where=%[2]s
Type=%[3]s
Options=noatime,nofail

[Install]
WantedBy=local-fs.target
`, what, path.Clean(where), fstype)
	changed, err = WriteUnit(root, name, []byte(unit))
	if err != nil {
		return changed, fmt.Errorf("mount unit %s: %w", name, err)
	}
	return changed, nil
}

// WriteUnit writes unit (a complete unit file) to /etc/systemd/system/<name> in root,
// unless it holds exactly that already, and enables it. It reports whether anything
// changed.
func WriteUnit(root, name string, unit []byte) (changed bool, err error) {
	r, err := os.OpenRoot(root)
	if err != nil {
		return false, err
	}
	defer r.Close()
	rel := path.Join(systemd.ConfigDir, name)
	changed, err = atomicfile.UpdateIn(r, rel, unit, atomicfile.Options{Mode: 0o644})
	if err != nil {
		return false, err
	}
	enabled, err := systemd.Enable(root, name)
	if err != nil {
		return changed, err
	}
	return changed || enabled, nil
}

// Mount mounts dev on where (creating the directory) with type fstype and noatime, on
// the live system. It does nothing when dev is already mounted there, and fails when
// something else is.
func Mount(dev, where, fstype string) error {
	return MountOptions(context.Background(), dev, where, fstype, "")
}

// MountOptions is Mount with mount(8) options (e.g. "noatime,discard"); empty options
// mean noatime. Options are handed to mount(8), which knows which of them are flags and
// which the filesystem's.
func MountOptions(ctx context.Context, dev, where, fstype, options string) error {
	var st unix.Stat_t
	if err := unix.Stat(dev, &st); err != nil {
		return fmt.Errorf("mount %s on %s: %w", dev, where, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFBLK {
		return fmt.Errorf("mount %s on %s: not a block device", dev, where)
	}
	mounts, err := readMountInfo(mountInfoPath)
	if err != nil {
		return fmt.Errorf("mount %s on %s: %w", dev, where, err)
	}
	where = path.Clean(where)
	devID := fmt.Sprintf("%d:%d", unix.Major(st.Rdev), unix.Minor(st.Rdev))
	if m, ok := mountedAt(mounts, where); ok {
		if m.majMin == devID {
			return nil
		}
		return fmt.Errorf("mount %s on %s: %s (%s) is mounted there already", dev, where, m.source, m.fstype)
	}
	if err := os.MkdirAll(where, 0o700); err != nil {
		return fmt.Errorf("mount %s on %s: %w", dev, where, err)
	}
	if options != "" {
		if _, err := RunTool(ctx, "mount", "-t", fstype, "-o", options, "--", dev, where); err != nil {
			return fmt.Errorf("mount %s on %s (%s): %w", dev, where, fstype, err)
		}
		return nil
	}
	if err := unix.Mount(dev, where, fstype, unix.MS_NOATIME, ""); err != nil {
		return fmt.Errorf("mount %s on %s (%s): %w", dev, where, fstype, err)
	}
	return nil
}

// mountEntry is one line of /proc/self/mountinfo.
type mountEntry struct {
	majMin, mountPoint, fstype, source string
}

// readMountInfo parses a mountinfo file (proc(5)).
func readMountInfo(file string) ([]mountEntry, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("read mounts: %w", err)
	}
	return parseMountInfo(data, file)
}

func parseMountInfo(data []byte, file string) ([]mountEntry, error) {
	var out []mountEntry
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if !ok || len(f) < 5 || len(g) < 2 {
			return nil, fmt.Errorf("%s:%d: not a mountinfo line", file, n)
		}
		out = append(out, mountEntry{majMin: f[2], mountPoint: unescapeOctal(f[4]), fstype: g[0], source: unescapeOctal(g[1])})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", file, err)
	}
	return out, nil
}

// mountedAt returns the mount visible at where: the last one listed for it.
func mountedAt(mounts []mountEntry, where string) (mountEntry, bool) {
	for i := len(mounts) - 1; i >= 0; i-- {
		if mounts[i].mountPoint == where {
			return mounts[i], true
		}
	}
	return mountEntry{}, false
}

// unescapeOctal undoes the kernel's \ooo escapes of space, tab, newline and backslash.
func unescapeOctal(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// Mounted reports whether block device dev is mounted anywhere (looked up by its
// major:minor in /proc/self/mountinfo). A regular file is never reported mounted.
func Mounted(dev string) (bool, error) {
	var st unix.Stat_t
	if err := unix.Stat(dev, &st); err != nil {
		return false, fmt.Errorf("stat %s: %w", dev, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFBLK {
		return false, nil
	}
	mounts, err := readMountInfo(mountInfoPath)
	if err != nil {
		return false, err
	}
	want := majMin(st.Rdev)
	for _, m := range mounts {
		if m.majMin == want {
			return true, nil
		}
	}
	return false, nil
}
