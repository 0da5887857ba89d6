package vm

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// Link is a NIC on a private Ethernet segment shared by every VM on this host that is started
// with a link of the same Name. The segment is QEMU socket networking over a multicast group
// on the loopback interface: it needs neither root nor a tap device, and no frame leaves the
// host. Any local process may join the group, so it is a test network, not a trust boundary.
type Link struct {
	Name string // segment name: letters, digits, '.', '_' and '-', at most 64
	MAC  string // the NIC's address; LinkMAC(image, Name) when empty
}

// Guest PCI slots of the NICs, fixed so that the guest's interface names do not depend on the
// number of disks: links take 0x10 onwards (enp0s16, enp0s17, …), the user network 0x18
// (enp0s24). Links therefore come first by name and by PCI order.
const (
	linkSlot = 0x10
	userSlot = 0x18
	// MaxLinks is the number of links one VM can have.
	MaxLinks = userSlot - linkSlot
)

// UserNetdev is the QEMU id of the user network's netdev, e.g. for the monitor's set_link.
const UserNetdev = "user0"

var linkNameRE = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// LinkMAC is the MAC address a VM booted from image gets on link name when none is given:
// locally administered and unicast, derived from the image's file name (not its directory)
// and the link name, so it is the same on every boot and can be written into the node's
// network config before the VM starts. Two VMs booted from the same file on one link need
// explicit MACs.
func LinkMAC(image, name string) string {
	h := sha256.Sum256([]byte("kiln-link-mac\x00" + filepath.Base(image) + "\x00" + name))
	mac := net.HardwareAddr{0x02, h[0], h[1], h[2], h[3], h[4]}
	return mac.String()
}

// LinkGroup is the multicast group and UDP port ("239.255.x.y:port") that carries link
// name's frames; every VM on the host with the same link name joins it.
func LinkGroup(name string) string {
	h := sha256.Sum256([]byte("kiln-link-group\x00" + name))
	port := 20000 + int(binary.BigEndian.Uint16(h[2:4]))%10000
	return fmt.Sprintf("239.255.%d.%d:%d", h[0], h[1], port)
}

// normalMAC checks a MAC given by the user: six octets, unicast.
func normalMAC(s string) (string, error) {
	mac, err := net.ParseMAC(s)
	if err != nil || len(mac) != 6 {
		return "", fmt.Errorf("MAC %q: want six octets like 02:00:00:00:00:01", s)
	}
	if mac[0]&1 != 0 {
		return "", fmt.Errorf("MAC %q is a multicast address (the first octet must be even)", s)
	}
	return mac.String(), nil
}

// netArgs returns the QEMU arguments for cfg's links and its user network.
func netArgs(cfg Config) ([]string, error) {
	args, err := linkArgs(cfg)
	if err != nil {
		return nil, err
	}
	user, err := userNetwork(cfg)
	if err != nil {
		return nil, err
	}
	nic := fmt.Sprintf("virtio-net-pci,netdev=%s,addr=%x", UserNetdev, userSlot)
	if cfg.NetBoot != nil {
		opt, err := cfg.NetBoot.userOption()
		if err != nil {
			return nil, err
		}
		nicOpts, err := cfg.NetBoot.nicOptions()
		if err != nil {
			return nil, err
		}
		user, nic = user+opt, nic+nicOpts
	}
	args = append(args, "-netdev", user, "-device", nic)
	return args, nil
}

// linkArgs returns the QEMU arguments for cfg's links: a netdev on the link's multicast
// group and a NIC with the link's MAC in the link's PCI slot.
func linkArgs(cfg Config) ([]string, error) {
	if len(cfg.Links) > MaxLinks {
		return nil, fmt.Errorf("%d links: at most %d", len(cfg.Links), MaxLinks)
	}
	var args []string
	seen := map[string]bool{}
	macs := map[string]string{}
	for i, l := range cfg.Links {
		if !linkNameRE.MatchString(l.Name) {
			return nil, fmt.Errorf("link %q: name must be 1 to 64 letters, digits, '.', '_' or '-'", l.Name)
		}
		if seen[l.Name] {
			return nil, fmt.Errorf("link %q given twice", l.Name)
		}
		seen[l.Name] = true
		mac := LinkMAC(cfg.Image, l.Name)
		if l.MAC != "" {
			var err error
			if mac, err = normalMAC(l.MAC); err != nil {
				return nil, fmt.Errorf("link %s: %w", l.Name, err)
			}
		}
		if other, dup := macs[mac]; dup {
			return nil, fmt.Errorf("links %s and %s have the same MAC %s", other, l.Name, mac)
		}
		macs[mac] = l.Name
		id := fmt.Sprintf("link%d", i)
		args = append(args,
			"-netdev", fmt.Sprintf("socket,id=%s,mcast=%s,localaddr=127.0.0.1", id, LinkGroup(l.Name)),
			"-device", fmt.Sprintf("virtio-net-pci,netdev=%s,mac=%s,addr=%x", id, mac, linkSlot+i))
	}
	return args, nil
}

// userNetwork returns the -netdev option of cfg's user network: its range, host and DHCP
// addresses, whether it is restricted (offline), and its forwarded ports.
func userNetwork(cfg Config) (string, error) {
	user := "user,id=" + UserNetdev
	if cfg.Net != "" {
		if strings.Contains(cfg.Net, ",") {
			return "", fmt.Errorf("user network %q: want a range like 10.0.3.0/24", cfg.Net)
		}
		user += ",net=" + cfg.Net
	}
	for _, a := range []struct{ opt, addr string }{{"host", cfg.NetHost}, {"dhcpstart", cfg.NetDHCPStart}} {
		if a.addr == "" {
			continue
		}
		ip, err := netip.ParseAddr(a.addr)
		pfx, perr := netip.ParsePrefix(cfg.Net)
		switch {
		case err != nil || !ip.Is4():
			return "", fmt.Errorf("user network %s address %q: want an IPv4 address", a.opt, a.addr)
		case cfg.Net == "" || perr != nil || !pfx.Contains(ip):
			return "", fmt.Errorf("user network %s address %s is not inside the network %q", a.opt, ip, cfg.Net)
		}
		user += "," + a.opt + "=" + ip.String()
	}
	if cfg.Offline {
		user += ",restrict=on"
	}
	fwd, err := hostForwards(cfg)
	if err != nil {
		return "", err
	}
	return user + fwd, nil
}

// hostForwards returns the user network's hostfwd options for cfg's Forward and ForwardTo,
// each in the order of its host side.
func hostForwards(cfg Config) (string, error) {
	var opts string
	hosts := make([]string, 0, len(cfg.Forward))
	for h := range cfg.Forward {
		hosts = append(hosts, h)
	}
	sort.Strings(hosts)
	for _, h := range hosts {
		addr, port, ok := strings.Cut(h, ":")
		if !ok {
			addr, port = "127.0.0.1", h
		}
		if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 || strings.Contains(addr, ",") {
			return "", fmt.Errorf("forward %q: want [ADDR:]PORT on the host", h)
		}
		if g := cfg.Forward[h]; g < 1 || g > 65535 {
			return "", fmt.Errorf("forward %s: guest port %d out of range", h, g)
		}
		opts += fmt.Sprintf(",hostfwd=tcp:%s:%s-:%d", addr, port, cfg.Forward[h])
	}
	to := make([]string, 0, len(cfg.ForwardTo))
	for h := range cfg.ForwardTo {
		to = append(to, h)
	}
	sort.Strings(to)
	for _, h := range to {
		hap, err := netip.ParseAddrPort(h)
		gap, gerr := netip.ParseAddrPort(cfg.ForwardTo[h])
		if err != nil || gerr != nil || !hap.Addr().Is4() || !gap.Addr().Is4() || hap.Port() == 0 || gap.Port() == 0 {
			return "", fmt.Errorf("forward %s to %s: want IPv4 ADDR:PORT on both sides", h, cfg.ForwardTo[h])
		}
		opts += fmt.Sprintf(",hostfwd=tcp:%s-%s", hap, gap)
	}
	return opts, nil
}
