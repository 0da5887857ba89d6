package netup

import (
	"fmt"
	"log/slog"
	"net"
	"strings"

	"github.com/vishvananda/netlink"

	"github.com/kilnproject/kiln/internal/atomicfile"
)

// configure puts the lease on its link: the address, the routes and resolv.conf.
func configure(log *slog.Logger, o *offered, resolvConf string) (Lease, error) {
	l, routes, err := leaseOf(o)
	if err != nil {
		return Lease{}, fmt.Errorf("network: %w", err)
	}
	link, err := netlink.LinkByName(l.Link)
	if err != nil {
		return Lease{}, fmt.Errorf("network: link %s: %w", l.Link, err)
	}
	ipnet := &net.IPNet{IP: l.Address.Addr().AsSlice(), Mask: net.CIDRMask(l.Address.Bits(), 32)}
	if err := netlink.AddrReplace(link, &netlink.Addr{IPNet: ipnet}); err != nil {
		return Lease{}, fmt.Errorf("network: add address %s to %s: %w", l.Address, l.Link, err)
	}
	for _, r := range routes {
		if err := addRoute(link, ipnet, r); err != nil {
			return Lease{}, fmt.Errorf("network: %s: %w", l.Link, err)
		}
	}
	if err := writeResolvConf(resolvConf, l); err != nil {
		return Lease{}, fmt.Errorf("network: %w", err)
	}
	log.Info("network up: DHCP lease " + l.String())
	return l, nil
}

// addRoute adds r through link. A router outside the leased subnet (a /32 lease, say) is
// reached on-link.
func addRoute(link netlink.Link, subnet *net.IPNet, r route) error {
	nr := &netlink.Route{LinkIndex: link.Attrs().Index, Dst: r.dst, Gw: r.gw}
	switch {
	case r.gw == nil || r.gw.IsUnspecified():
		nr.Gw, nr.Scope = nil, netlink.SCOPE_LINK
	case !subnet.Contains(r.gw):
		nr.Flags = int(netlink.FLAG_ONLINK)
	}
	if err := netlink.RouteReplace(nr); err != nil {
		dst := "default"
		if r.dst != nil {
			dst = r.dst.String()
		}
		return fmt.Errorf("add route %s via %s: %w", dst, r.gw, err)
	}
	return nil
}

// writeResolvConf writes the lease's name servers and search domains to path, replacing it
// whole.
func writeResolvConf(path string, l Lease) error {
	var b strings.Builder
	fmt.Fprintf(&b, "# written by kiln-init from the DHCP lease on %s\n", l.Link)
	for _, d := range l.dns {
		fmt.Fprintf(&b, "nameserver %s\n", d)
	}
	if len(l.search) > 0 {
		fmt.Fprintf(&b, "search %s\n", strings.Join(l.search, " "))
	}
	if err := atomicfile.Write(path, []byte(b.String()), atomicfile.Options{Mode: 0o644, DirMode: 0o755}); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
