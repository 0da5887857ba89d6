package netup

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/dhcpv4/nclient4"
)

// The DHCP client's pacing: each round sends a DISCOVER and waits attemptTimeout, doubling
// the wait attemptTries times; a failed round is tried again after roundPause.
const (
	attemptTimeout = time.Second
	attemptTries   = 4
	roundPause     = time.Second
	vendorClass    = "kiln"
	defaultLease   = time.Hour
)

// offered is a lease as the server gave it, for one link.
type offered struct {
	link string
	mac  net.HardwareAddr
	ack  *dhcpv4.DHCPv4
}

// runClient asks for a lease on link until it gets one or ctx is done, and reports every
// failed round and the lease on results.
func runClient(ctx context.Context, link string, mac net.HardwareAddr, results chan<- attempt) {
	send := func(a attempt) bool {
		select {
		case results <- a:
			return true
		case <-ctx.Done():
			return false
		}
	}
	for ctx.Err() == nil {
		ack, err := requestLease(ctx, link, mac)
		if err == nil {
			send(attempt{link: link, lease: &offered{link: link, mac: mac, ack: ack}})
			return
		}
		if ctx.Err() != nil || !send(attempt{link: link, err: dhcpError(err)}) {
			return
		}
		select {
		case <-time.After(roundPause):
		case <-ctx.Done():
		}
	}
}

// requestLease runs one DISCOVER/OFFER/REQUEST/ACK exchange on link.
func requestLease(ctx context.Context, link string, mac net.HardwareAddr) (*dhcpv4.DHCPv4, error) {
	raw, err := nclient4.NewRawUDPConn(link, nclient4.ClientPort)
	if err != nil {
		return nil, fmt.Errorf("DHCP client on %s: %w", link, err)
	}
	c, err := nclient4.NewWithConn(paddedConn{raw}, mac, nclient4.WithTimeout(attemptTimeout), nclient4.WithRetry(attemptTries))
	if err != nil {
		raw.Close()
		return nil, fmt.Errorf("DHCP client on %s: %w", link, err)
	}
	defer c.Close()
	l, err := c.Request(ctx,
		dhcpv4.WithOption(dhcpv4.OptClassIdentifier(vendorClass)),
		dhcpv4.WithRequestedOptions(dhcpv4.OptionSubnetMask, dhcpv4.OptionRouter, dhcpv4.OptionDomainNameServer,
			dhcpv4.OptionDomainName, dhcpv4.OptionDNSDomainSearchList, dhcpv4.OptionClasslessStaticRoute))
	if err != nil {
		return nil, err
	}
	return l.ACK, nil
}

// minMessageSize is the size every DHCP message Up sends is padded to: a BOOTP message with
// the whole 312-byte options field. QEMU's user-mode network (libslirp 4.6 and later) drops
// shorter requests without a word, and the DHCP library pads only to BOOTP's 300 bytes.
const minMessageSize = 548

// paddedConn pads each message it sends with zeros (the Pad option, after End) to
// minMessageSize.
type paddedConn struct{ net.PacketConn }

func (c paddedConn) WriteTo(b []byte, addr net.Addr) (int, error) {
	if len(b) >= minMessageSize {
		return c.PacketConn.WriteTo(b, addr)
	}
	padded := make([]byte, minMessageSize)
	copy(padded, b)
	if _, err := c.PacketConn.WriteTo(padded, addr); err != nil {
		return 0, err
	}
	return len(b), nil
}

// route is one route a lease asks for; a nil dst is the default route.
type route struct {
	dst *net.IPNet
	gw  net.IP
}

// leaseOf reads the lease and the routes out of a server's ACK. Classless static routes
// (option 121), when present, replace the router option, as RFC 3442 requires.
func leaseOf(o *offered) (Lease, []route, error) {
	ack := o.ack
	addr, ok := netip.AddrFromSlice(ack.YourIPAddr.To4())
	if !ok || addr.IsUnspecified() {
		return Lease{}, nil, fmt.Errorf("DHCP lease on %s: the server gave no address", o.link)
	}
	mask := ack.SubnetMask()
	if mask == nil {
		mask = ack.YourIPAddr.DefaultMask()
	}
	ones, bits := mask.Size()
	if bits != 32 {
		return Lease{}, nil, fmt.Errorf("DHCP lease on %s: subnet mask %s is not an IPv4 netmask", o.link, net.IP(mask))
	}
	l := Lease{Link: o.link, mac: o.mac, Address: netip.PrefixFrom(addr, ones),
		duration: ack.IPAddressLeaseTime(defaultLease)}
	l.server, _ = netip.AddrFromSlice(ack.ServerIdentifier().To4())
	for _, d := range ack.DNS() {
		if a, ok := netip.AddrFromSlice(d.To4()); ok {
			l.dns = append(l.dns, a)
		}
	}
	if s := ack.DomainSearch(); s != nil {
		l.search = append(l.search, s.Labels...)
	}
	if d := ack.DomainName(); d != "" && len(l.search) == 0 {
		l.search = []string{d}
	}
	var routes []route
	if cs := ack.ClasslessStaticRoute(); len(cs) > 0 {
		for _, r := range cs {
			if ones, _ := r.Dest.Mask.Size(); ones == 0 {
				l.gateway, _ = netip.AddrFromSlice(r.Router.To4())
				routes = append(routes, route{gw: r.Router})
				continue
			}
			routes = append(routes, route{dst: r.Dest, gw: r.Router})
		}
	} else if gws := ack.Router(); len(gws) > 0 {
		l.gateway, _ = netip.AddrFromSlice(gws[0].To4())
		routes = append(routes, route{gw: gws[0]})
	}
	if l.gateway.IsValid() && l.gateway.IsUnspecified() {
		return Lease{}, nil, errors.New("DHCP lease on " + o.link + ": the default route's router is 0.0.0.0")
	}
	return l, routes, nil
}
