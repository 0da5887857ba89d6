package stage1

import (
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/kilnproject/kiln/initd/stage1/liveroot"
	"github.com/kilnproject/kiln/internal/cmdline"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

// defaultRootWait bounds how long stage 1 waits for the root disk to appear when the command line
// does not set kiln.rootwait=.
const defaultRootWait = 30 * time.Second

// defaultNetTimeout bounds how long a network boot (live, install) waits for a link and a DHCP
// lease when the command line does not set kiln.net.timeout=.
const defaultNetTimeout = 60 * time.Second

// Mode is how the node runs, decided by the kernel command line: "disk", "live" or "install".
type Mode string

const (
	// modeDisk boots the root slot named by root=PARTUUID=… (the default).
	modeDisk Mode = "disk"
	// modeLive runs from a root image fetched into RAM (kiln.live.*); /var goes on a data disk or
	// in RAM.
	modeLive Mode = "live"
	// modeInstall writes a disk image to a disk and reboots into it (kiln.install.*).
	modeInstall Mode = "install"
)

// Cmdline is the part of the kernel command line stage 1 acts on.
type Cmdline struct {
	// Raw is the command line as read from /proc/cmdline, trimmed.
	Raw string
	// rootPARTUUID is the lowercase partition GUID from root=PARTUUID=…; empty when a network
	// boot (live, install) has no root=.
	rootPARTUUID string
	// rootFSType is the value of rootfstype=, empty when absent (stage 1 then probes squashfs, erofs).
	rootFSType string
	// readWrite is true when the last of ro/rw on the line is rw. The root is mounted read-only
	// regardless; the flag only lets stage 1 warn.
	readWrite bool
	// RootWait is kiln.rootwait= (a Go duration or whole seconds), defaultRootWait (30 s) when
	// absent.
	RootWait time.Duration
	// netTimeout is kiln.net.timeout= (a Go duration or whole seconds), defaultNetTimeout when
	// absent. It bounds the wait for a link and a DHCP lease on a network boot.
	netTimeout time.Duration
	// live is the root image of a live boot (kiln.live.rootfs_url, kiln.live.rootfs_sha256),
	// zero unless mode() is modeLive.
	live liveRoot
	// verity is kiln.verity.*: the root hash of the root image's dm-verity tree and where the
	// tree's superblock is; nil when the line has none.
	verity *verityArgs
	// dataDev is kiln.data.dev=: the disk a live boot puts /var on, a /dev path or a
	// /dev/disk/by-id name. Empty lets stage 1 choose.
	dataDev string
	// Kiln holds every kiln.* parameter, keyed without the "kiln." prefix (kiln.platform=qemu is
	// Kiln["platform"] == "qemu"). A key without a value maps to "".
	Kiln map[string]string
}

// liveRoot is where a live boot fetches its root image and the sha256 it must have.
type liveRoot struct {
	url    string // http or https, or medium:<path> (a file on the boot medium)
	sha256 string // 64 lowercase hex digits
}

// platform returns kiln.platform= (qemu, aws, gce, metal), empty when absent.
func (c Cmdline) platform() string { return c.Kiln["platform"] }

// mode says how the node runs: modeInstall when any kiln.install.* parameter is present,
// modeLive when any kiln.live.* parameter is, modeDisk otherwise. parseCmdline refuses a line
// with both.
func (c Cmdline) mode() Mode {
	install, live := c.hasPrefix("install."), c.hasPrefix("live.")
	switch {
	case install:
		return modeInstall
	case live:
		return modeLive
	}
	return modeDisk
}

func (c Cmdline) hasPrefix(prefix string) bool {
	for k := range c.Kiln {
		if strings.HasPrefix(k, prefix) {
			return true
		}
	}
	return false
}

// parseCmdline parses a kernel command line (see package cmdline for how it is split; what
// follows "--" is for init). A disk boot requires root=PARTUUID=<guid>; a live boot requires
// kiln.live.rootfs_url= and kiln.live.rootfs_sha256=; an install boot (any kiln.install.*) needs
// no root= here, its own parameters are checked by the installer.
func parseCmdline(s string) (Cmdline, error) {
	line := cmdline.Parse(s)
	c := Cmdline{Raw: line.Raw, RootWait: defaultRootWait, netTimeout: defaultNetTimeout, Kiln: map[string]string{}}
	var root string
	for _, p := range line.Params {
		switch {
		case p.Key == "root":
			root = p.Value
		case p.Key == "rootfstype":
			c.rootFSType = p.Value
		case p.Key == "ro" && !p.HasValue:
			c.readWrite = false
		case p.Key == "rw" && !p.HasValue:
			c.readWrite = true
		case strings.HasPrefix(p.Key, "kiln."):
			name := strings.TrimPrefix(p.Key, "kiln.")
			if name == "" {
				return Cmdline{}, fmt.Errorf("kernel cmdline: parameter %q has an empty kiln.* key", p)
			}
			c.Kiln[name] = p.Value
		}
	}
	if c.hasPrefix("install.") && c.hasPrefix("live.") {
		return Cmdline{}, errors.New("kernel cmdline: kiln.live.* and kiln.install.* are both set: a boot either runs live or installs to disk, not both")
	}
	if err := c.parseRoot(root); err != nil {
		return Cmdline{}, err
	}
	for _, d := range []struct {
		key string
		to  *time.Duration
	}{{"rootwait", &c.RootWait}, {"net.timeout", &c.netTimeout}} {
		w, ok := c.Kiln[d.key]
		if !ok {
			continue
		}
		v, err := cmdline.Duration(w)
		if err == nil && v == 0 && d.key == "net.timeout" {
			err = errors.New("must be more than 0")
		}
		if err != nil {
			return Cmdline{}, fmt.Errorf("kernel cmdline: kiln.%s=%s: %w", d.key, w, err)
		}
		*d.to = v
	}
	if err := c.parseLive(); err != nil {
		return Cmdline{}, err
	}
	if err := c.parseVerity(); err != nil {
		return Cmdline{}, err
	}
	return c, nil
}

// parseRoot checks root=, which a disk boot requires and a network boot may leave out.
func (c *Cmdline) parseRoot(root string) error {
	if root == "" {
		if c.mode() != modeDisk {
			return nil
		}
		return fmt.Errorf("kernel cmdline: root= is missing (want root=PARTUUID=<guid>, or kiln.live.rootfs_url= for a live boot) in %q", c.Raw)
	}
	id, ok := strings.CutPrefix(root, "PARTUUID=")
	if !ok {
		return fmt.Errorf("kernel cmdline: root=%s is not supported (want root=PARTUUID=<guid>)", root)
	}
	if _, err := uuid.Parse(id); err != nil || len(id) != 36 {
		return fmt.Errorf("kernel cmdline: root=%s: %q is not a partition GUID", root, id)
	}
	c.rootPARTUUID = strings.ToLower(id)
	return nil
}

// liveKeys are the kiln.live.* parameters stage 1 knows.
var liveKeys = []string{"live.rootfs_url", "live.rootfs_sha256"}

// parseLive checks kiln.live.* and kiln.data.dev=.
func (c *Cmdline) parseLive() error {
	for k := range c.Kiln {
		if strings.HasPrefix(k, "live.") && k != liveKeys[0] && k != liveKeys[1] {
			return fmt.Errorf("kernel cmdline: kiln.%s is not a live boot parameter (want kiln.live.rootfs_url=, kiln.live.rootfs_sha256=)", k)
		}
	}
	if dev, ok := c.Kiln["data.dev"]; ok {
		if err := checkDataDev(dev); err != nil {
			return fmt.Errorf("kernel cmdline: kiln.data.dev=%s: %w", dev, err)
		}
		c.dataDev = dev
	}
	if c.mode() != modeLive {
		return nil
	}
	u, hasURL := c.Kiln["live.rootfs_url"]
	sum, hasSum := c.Kiln["live.rootfs_sha256"]
	switch {
	case !hasURL:
		return errors.New("kernel cmdline: kiln.live.rootfs_sha256= is set without kiln.live.rootfs_url=")
	case !hasSum:
		return fmt.Errorf("kernel cmdline: kiln.live.rootfs_url=%s needs kiln.live.rootfs_sha256=<64 hex digits>: a live root is never used unverified", u)
	}
	if _, medium, err := liveroot.MediumPath(u); medium {
		if err != nil {
			return fmt.Errorf("kernel cmdline: kiln.live.rootfs_url=%s: %w", u, err)
		}
	} else if err := checkHTTPURL(u); err != nil {
		return fmt.Errorf("kernel cmdline: kiln.live.rootfs_url=%s: %w", u, err)
	}
	if b, err := hex.DecodeString(sum); err != nil || len(b) != 32 {
		return fmt.Errorf("kernel cmdline: kiln.live.rootfs_sha256=%s: not a sha256 (want 64 hex digits)", sum)
	}
	c.live = liveRoot{url: u, sha256: strings.ToLower(sum)}
	return nil
}

// checkHTTPURL accepts an absolute http or https URL with a host.
func checkHTTPURL(s string) error {
	u, err := url.Parse(s)
	if err != nil {
		return fmt.Errorf("not a URL: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("scheme %q is not supported (want http, https or %s<path> for a file on the boot medium)", u.Scheme, nodeimage.MediumScheme)
	}
	if u.Host == "" {
		return errors.New("the URL has no host")
	}
	return nil
}

// checkDataDev accepts a device path under /dev or a name in /dev/disk/by-id.
func checkDataDev(dev string) error {
	switch {
	case dev == "":
		return errors.New("empty (want /dev/<disk> or a /dev/disk/by-id name)")
	case strings.HasPrefix(dev, "/dev/disk/by-id/"):
		if name := strings.TrimPrefix(dev, "/dev/disk/by-id/"); name == "" || strings.Contains(name, "/") {
			return errors.New("not a name in /dev/disk/by-id")
		}
	case strings.HasPrefix(dev, "/"):
		if !strings.HasPrefix(dev, "/dev/") || len(dev) == len("/dev/") || strings.Contains(dev, "..") {
			return errors.New("a device path must lie under /dev")
		}
	case strings.Contains(dev, "/"):
		return errors.New("not a /dev path nor a /dev/disk/by-id name")
	}
	return nil
}
