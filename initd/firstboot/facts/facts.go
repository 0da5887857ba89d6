// Package facts gathers what first boot needs to know about the machine it runs on:
// its name, primary addresses, network interfaces, identity on the platform, size and
// kernel. Everything is read from /proc, /sys and /etc below roots the caller chooses,
// so tests run against fake trees.
package facts

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/kilnproject/kiln/internal/cmdline"
)

// Facts describe a machine. They serialise to JSON for status reports and templates.
type Facts struct {
	// Hostname is the node name (see Gather for where it comes from), always a valid
	// RFC 1123 subdomain; HostnameSource is one of FromConfig, fromPlatform,
	// fromKernel, fromGenerated.
	Hostname       string `json:"hostname"`
	HostnameSource string `json:"hostnameSource"`
	// Interface is the primary interface: the one holding the IPv4 default route (or,
	// without one, the IPv6 default route, or the first interface with an address).
	Interface string `json:"interface,omitempty"`
	// IPv4 and IPv6 are the primary addresses, without prefix length; "" if none.
	IPv4 string `json:"ipv4,omitempty"`
	IPv6 string `json:"ipv6,omitempty"`
	// MACs maps each physical (non-virtual, non-loopback) interface to its MAC address.
	MACs map[string]string `json:"macs"`
	// Platform, InstanceID, Zone and Region come from the platform's metadata.
	Platform   string `json:"platform,omitempty"`
	InstanceID string `json:"instanceID,omitempty"`
	Zone       string `json:"zone,omitempty"`
	Region     string `json:"region,omitempty"`
	// MachineID is /etc/machine-id; "" while systemd has not initialised it.
	MachineID     string `json:"machineID,omitempty"`
	CPUs          int    `json:"cpus"`
	MemoryMB      int64  `json:"memoryMB"`
	KernelVersion string `json:"kernelVersion"`
	// CgroupV2 is true when /sys/fs/cgroup is the unified hierarchy
	// (cgroup.controllers exists at its top).
	CgroupV2 bool `json:"cgroupV2"`
}

// Platform is what the caller learnt from the platform's metadata service (AWS IMDS,
// GCE metadata, …). Empty fields are unknown.
type Platform struct {
	Name       string // "aws", "gce", "qemu", "metal"; "" means kiln.platform= from the kernel command line
	Hostname   string
	InstanceID string
	Zone       string
	Region     string // "" is derived from Zone on aws and gce
}

// Options say where to look. The zero value reads the running machine.
type Options struct {
	// Root is the node's root directory (for /etc/machine-id); "" means "/".
	Root string
	// ProcRoot and SysRoot are where proc and sysfs are mounted; "" means /proc and /sys.
	ProcRoot, SysRoot string
	// Hostname is the name the node config gives; it wins over every other source.
	Hostname string
	// Platform is the platform's metadata.
	Platform Platform
	// Addrs lists an interface's addresses; nil asks the kernel (net.InterfaceByName).
	// IPv4 addresses come from here, IPv6 from <proc>/net/if_inet6.
	Addrs func(iface string) ([]netip.Prefix, error)
}

func (o Options) withDefaults() Options {
	if o.Root == "" {
		o.Root = "/"
	}
	if o.ProcRoot == "" {
		o.ProcRoot = "/proc"
	}
	if o.SysRoot == "" {
		o.SysRoot = "/sys"
	}
	if o.Addrs == nil {
		o.Addrs = kernelAddrs
	}
	return o
}

// Gather reads the facts. The hostname is, in this order: Options.Hostname (the node
// config), Options.Platform.Hostname, the kernel's current hostname (which DHCP may have
// set), else one generated from the primary MAC address; see chooseHostname for the
// rules about placeholders such as "localhost". A machine without any network address is
// not an error (IPv4 and IPv6 stay empty); unreadable basics (/proc/meminfo, the CPU
// list, the kernel release, the routing tables) and an invalid hostname are.
func Gather(ctx context.Context, opts Options) (*Facts, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	o := opts.withDefaults()
	f := &Facts{MACs: map[string]string{}}
	var errs []error
	fail := func(err error) { errs = append(errs, err) }

	var err error
	if f.CPUs, err = onlineCPUs(filepath.Join(o.SysRoot, "devices/system/cpu/online")); err != nil {
		fail(err)
	}
	if f.MemoryMB, err = memTotalMB(filepath.Join(o.ProcRoot, "meminfo")); err != nil {
		fail(err)
	}
	if f.KernelVersion, err = readLine(filepath.Join(o.ProcRoot, "sys/kernel/osrelease")); err != nil {
		fail(err)
	}
	_, err = os.Stat(filepath.Join(o.SysRoot, "fs/cgroup/cgroup.controllers"))
	f.CgroupV2 = err == nil
	f.MachineID = machineID(filepath.Join(o.Root, "etc/machine-id"))

	ifaces, err := interfaces(filepath.Join(o.SysRoot, "class/net"))
	if err != nil {
		fail(err)
	}
	for _, i := range ifaces {
		if !i.virtual && !i.loopback && i.mac != "" {
			f.MACs[i.name] = i.mac
		}
	}
	if err := primary(o, f, ifaces); err != nil {
		fail(err)
	}

	f.Platform = o.Platform.Name
	if f.Platform == "" {
		f.Platform = cmdlinePlatform(filepath.Join(o.ProcRoot, "cmdline"))
	}
	f.InstanceID, f.Zone, f.Region = o.Platform.InstanceID, o.Platform.Zone, o.Platform.Region
	if f.Region == "" {
		f.Region = regionOf(f.Platform, f.Zone)
	}

	kernelName, _ := readLine(filepath.Join(o.ProcRoot, "sys/kernel/hostname"))
	mac := ""
	for _, i := range ifaces {
		if i.name == f.Interface {
			mac = i.mac
		}
	}
	if f.Hostname, f.HostnameSource, err = chooseHostname(o.Hostname, o.Platform.Hostname, kernelName, mac, f.MachineID); err != nil {
		fail(err)
	}
	if len(errs) > 0 {
		return f, fmt.Errorf("facts: %w", errors.Join(errs...))
	}
	return f, nil
}

// iface is one entry of /sys/class/net.
type iface struct {
	name     string
	mac      string // "" when all zero or absent
	loopback bool
	virtual  bool // lives under /sys/devices/virtual (bridges, veths, ifb, …)
}

// arphrdLoopback is ARPHRD_LOOPBACK, the type of "lo" in /sys/class/net/*/type.
const arphrdLoopback = "772"

func interfaces(dir string) ([]iface, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("list interfaces: %w", err)
	}
	var out []iface
	for _, e := range ents {
		p := filepath.Join(dir, e.Name())
		i := iface{name: e.Name()}
		if t, err := readLine(filepath.Join(p, "type")); err == nil && t == arphrdLoopback {
			i.loopback = true
		}
		if target, err := os.Readlink(p); err == nil && strings.Contains(target, "/devices/virtual/") {
			i.virtual = true
		}
		if mac, err := readLine(filepath.Join(p, "address")); err == nil {
			if hw, err := net.ParseMAC(mac); err == nil && !allZero(hw) {
				i.mac = hw.String()
			}
		}
		out = append(out, i)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].name < out[b].name })
	return out, nil
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// primary finds the primary interface and its addresses.
func primary(o Options, f *Facts, ifaces []iface) error {
	v4If, err := defaultRoute4(filepath.Join(o.ProcRoot, "net/route"))
	if err != nil {
		return err
	}
	v6If, err := defaultRoute6(filepath.Join(o.ProcRoot, "net/ipv6_route"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) { // no IPv6 in the kernel: no file
		return err
	}
	v6Addrs, err := inet6Addrs(filepath.Join(o.ProcRoot, "net/if_inet6"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}

	if v4If != "" {
		f.Interface = v4If
		if f.IPv4, err = firstIPv4(o.Addrs, v4If); err != nil {
			return err
		}
	}
	if f.Interface == "" {
		f.Interface = v6If
	}
	if f.Interface == "" {
		// No default route: the first interface with an address.
		for _, i := range ifaces {
			if i.loopback {
				continue
			}
			a4, err := firstIPv4(o.Addrs, i.name)
			if err != nil {
				return err
			}
			if a4 != "" || v6Addrs[i.name] != "" {
				f.Interface, f.IPv4 = i.name, a4
				break
			}
		}
	}
	if v6If == "" {
		v6If = f.Interface
	}
	f.IPv6 = v6Addrs[v6If]
	return nil
}

// rtfUp and rtfReject are route flags (linux/route.h, linux/ipv6_route.h).
const (
	rtfUp     = 0x0001
	rtfReject = 0x0200
)

// defaultRoute4 returns the interface of the IPv4 default route with the lowest metric
// from /proc/net/route, or "" when there is none.
func defaultRoute4(file string) (string, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("read IPv4 routes: %w", err)
	}
	best, bestMetric := "", uint64(0)
	for n, line := range strings.Split(string(data), "\n")[1:] {
		fl := strings.Fields(line)
		if len(fl) == 0 {
			continue
		}
		if len(fl) < 8 {
			return "", fmt.Errorf("%s line %d: %d fields, want 11", file, n+2, len(fl))
		}
		flags, err1 := strconv.ParseUint(fl[3], 16, 32)
		metric, err2 := strconv.ParseUint(fl[6], 10, 32)
		if err := errors.Join(err1, err2); err != nil {
			return "", fmt.Errorf("%s line %d: %w", file, n+2, err)
		}
		if fl[1] != "00000000" || fl[7] != "00000000" || flags&rtfUp == 0 || flags&rtfReject != 0 {
			continue
		}
		if best == "" || metric < bestMetric {
			best, bestMetric = fl[0], metric
		}
	}
	return best, nil
}

// defaultRoute6 does the same for /proc/net/ipv6_route (no header; dest, dest prefix
// length, src, src prefix length, next hop, metric, refcnt, use, flags, interface).
func defaultRoute6(file string) (string, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("read IPv6 routes: %w", err)
	}
	best, bestMetric := "", uint64(0)
	for n, line := range strings.Split(string(data), "\n") {
		fl := strings.Fields(line)
		if len(fl) == 0 {
			continue
		}
		if len(fl) != 10 {
			return "", fmt.Errorf("%s line %d: %d fields, want 10", file, n+1, len(fl))
		}
		metric, err1 := strconv.ParseUint(fl[5], 16, 32)
		flags, err2 := strconv.ParseUint(fl[8], 16, 32)
		if err := errors.Join(err1, err2); err != nil {
			return "", fmt.Errorf("%s line %d: %w", file, n+1, err)
		}
		if strings.Trim(fl[0], "0") != "" || fl[1] != "00" || flags&rtfUp == 0 || flags&rtfReject != 0 || fl[9] == "lo" {
			continue
		}
		if best == "" || metric < bestMetric {
			best, bestMetric = fl[9], metric
		}
	}
	return best, nil
}

// IPv6 address flags in /proc/net/if_inet6 (linux/if_addr.h).
const (
	ifaTemporary  = 0x01
	ifaDADFailed  = 0x08
	ifaDeprecated = 0x20
)

// inet6Addrs returns, per interface, its preferred global IPv6 address from
// /proc/net/if_inet6: global scope, neither deprecated nor failed duplicate address
// detection, a stable address before a temporary (privacy) one, in file order.
func inet6Addrs(file string) (map[string]string, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("read IPv6 addresses: %w", err)
	}
	out := map[string]string{}
	temporary := map[string]bool{}
	for n, line := range strings.Split(string(data), "\n") {
		fl := strings.Fields(line)
		if len(fl) == 0 {
			continue
		}
		if len(fl) != 6 || len(fl[0]) != 32 {
			return nil, fmt.Errorf("%s line %d: want 6 fields starting with 32 hex digits", file, n+1)
		}
		scope, err1 := strconv.ParseUint(fl[3], 16, 8)
		flags, err2 := strconv.ParseUint(fl[4], 16, 32)
		var raw [16]byte
		for i := range raw {
			b, err := strconv.ParseUint(fl[0][2*i:2*i+2], 16, 8)
			if err != nil {
				err1 = err
			}
			raw[i] = byte(b)
		}
		if err := errors.Join(err1, err2); err != nil {
			return nil, fmt.Errorf("%s line %d: %w", file, n+1, err)
		}
		name := fl[5]
		if scope != 0 || flags&(ifaDADFailed|ifaDeprecated) != 0 {
			continue
		}
		if out[name] != "" && (!temporary[name] || flags&ifaTemporary != 0) {
			continue
		}
		out[name] = netip.AddrFrom16(raw).String()
		temporary[name] = flags&ifaTemporary != 0
	}
	return out, nil
}

func firstIPv4(addrs func(string) ([]netip.Prefix, error), name string) (string, error) {
	ps, err := addrs(name)
	if err != nil {
		return "", fmt.Errorf("addresses of %s: %w", name, err)
	}
	for _, p := range ps {
		a := p.Addr().Unmap()
		if a.Is4() && !a.IsLoopback() && !a.IsLinkLocalUnicast() && !a.IsUnspecified() {
			return a.String(), nil
		}
	}
	return "", nil
}

func kernelAddrs(name string) ([]netip.Prefix, error) {
	ifc, err := net.InterfaceByName(name)
	if err != nil {
		return nil, err
	}
	as, err := ifc.Addrs()
	if err != nil {
		return nil, err
	}
	var out []netip.Prefix
	for _, a := range as {
		if n, ok := a.(*net.IPNet); ok {
			if addr, ok := netip.AddrFromSlice(n.IP); ok {
				ones, _ := n.Mask.Size()
				out = append(out, netip.PrefixFrom(addr.Unmap(), ones))
			}
		}
	}
	return out, nil
}

// onlineCPUs counts the CPUs in a sysfs CPU list such as "0-3,6".
func onlineCPUs(file string) (int, error) {
	s, err := readLine(file)
	if err != nil {
		return 0, fmt.Errorf("online CPUs: %w", err)
	}
	n := 0
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		b := a
		if err == nil && isRange {
			b, err = strconv.Atoi(hi)
		}
		if err != nil || b < a {
			return 0, fmt.Errorf("online CPUs: %s: bad CPU list %q", file, s)
		}
		n += b - a + 1
	}
	return n, nil
}

// memTotalMB reads MemTotal from a meminfo file, in MiB.
func memTotalMB(file string) (int64, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return 0, fmt.Errorf("memory size: %w", err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		rest, ok := strings.CutPrefix(line, "MemTotal:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			break
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			break
		}
		return kb / 1024, nil
	}
	return 0, fmt.Errorf("memory size: %s has no MemTotal line in kB", file)
}

// machineID returns the 32 hex digits of /etc/machine-id, or "" when it is absent,
// empty or "uninitialized" (systemd's first-boot marker).
func machineID(file string) string {
	s, err := readLine(file)
	if err != nil || len(s) != 32 {
		return ""
	}
	for _, c := range s {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return ""
		}
	}
	return s
}

// cmdlinePlatform returns kiln.platform= from the kernel command line stored in file.
func cmdlinePlatform(file string) string {
	line, err := cmdline.Read(file)
	if err != nil {
		return ""
	}
	v, _ := line.Lookup("kiln.platform")
	return v
}

// regionOf derives the region from a zone: aws "us-east-1a" → "us-east-1",
// gce "europe-west4-b" → "europe-west4".
func regionOf(platform, zone string) string {
	switch {
	case zone == "":
		return ""
	case platform == "aws" && len(zone) > 1:
		last := zone[len(zone)-1]
		if last >= 'a' && last <= 'z' {
			return zone[:len(zone)-1]
		}
	case platform == "gce":
		if i := strings.LastIndexByte(zone, '-'); i > 0 {
			return zone[:i]
		}
	}
	return ""
}

func readLine(file string) (string, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(data)), nil
}
