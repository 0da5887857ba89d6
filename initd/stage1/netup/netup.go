// Package netup brings the network up inside the initramfs for a network boot (live or
// install): it waits for the Ethernet links the loaded drivers create, sets them up, asks for a
// DHCPv4 lease on all of them at once and configures the first lease it gets (address, routes,
// /etc/resolv.conf). It is bounded by one timeout and says on the console what it waits for.
// After switch_root systemd-networkd takes the links over, as on a disk boot.
package netup

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
)

// defaultTimeout bounds Up when Options.Timeout is zero.
const defaultTimeout = 60 * time.Second

// Defaults for the other Options.
const (
	defaultResolvConf = "/etc/resolv.conf"
	defaultProgress   = 5 * time.Second
	linkScan          = 250 * time.Millisecond
)

// Options tune Up.
type Options struct {
	// Timeout bounds the whole wait: for a link to appear and for a lease. Zero means
	// 60 s (defaultTimeout).
	Timeout time.Duration
	// resolvConf is where the lease's DNS servers are written; empty means defaultResolvConf.
	resolvConf string
	// progress is how often the wait is reported on the console; zero means every 5 s.
	progress time.Duration
}

// Lease is the DHCPv4 lease Up configured.
type Lease struct {
	Link     string // kernel name of the link, e.g. eth0
	mac      net.HardwareAddr
	Address  netip.Prefix // the leased address and its subnet, e.g. 10.0.2.15/24
	gateway  netip.Addr   // the default route's router; invalid when the server named none
	dns      []netip.Addr
	search   []string
	server   netip.Addr    // the DHCP server's identifier
	duration time.Duration // lease time
}

// String renders the lease for the console.
func (l Lease) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", l.Link, l.Address)
	if l.gateway.IsValid() {
		fmt.Fprintf(&b, " via %s", l.gateway)
	}
	if len(l.dns) > 0 {
		dns := make([]string, len(l.dns))
		for i, d := range l.dns {
			dns[i] = d.String()
		}
		fmt.Fprintf(&b, " dns %s", strings.Join(dns, ","))
	}
	if l.server.IsValid() {
		fmt.Fprintf(&b, " from %s", l.server)
	}
	fmt.Fprintf(&b, " for %s", l.duration)
	return b.String()
}

// attempt is what a link's DHCP client reports: a lease, or why an attempt failed.
type attempt struct {
	link  string
	lease *offered
	err   error
}

// Up waits for non-loopback Ethernet links, sets them up, runs DHCPv4 on all of them and
// configures the first lease it gets, all within opts.Timeout. The kernel's NIC drivers must
// be loaded already. Without a link, or without a lease in time, it returns an error
// (*noLeaseError) naming the links it saw and what each one lacked.
func Up(ctx context.Context, log *slog.Logger, opts Options) (Lease, error) {
	opts.Timeout = cmp.Or(opts.Timeout, defaultTimeout)
	opts.resolvConf = cmp.Or(opts.resolvConf, defaultResolvConf)
	opts.progress = cmp.Or(opts.progress, defaultProgress)
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, opts.Timeout)
	defer cancel()
	dctx, stopClients := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { stopClients(); wg.Wait() }()

	w := &waiter{log: log, start: start, results: make(chan attempt), seen: map[string]*linkState{}}
	scan, progress := time.NewTicker(linkScan), time.NewTicker(opts.progress)
	defer scan.Stop()
	defer progress.Stop()
	for {
		if err := w.startNew(dctx, &wg); err != nil {
			return Lease{}, err
		}
		select {
		case a := <-w.results:
			if a.err != nil {
				w.seen[a.link].lastErr = a.err
				continue
			}
			stopClients()
			return configure(log, a.lease, opts.resolvConf)
		case <-progress.C:
			w.report()
		case <-scan.C:
		case <-ctx.Done():
			return Lease{}, w.failure(ctx, opts.Timeout)
		}
	}
}

// waiter tracks the links Up has seen and started DHCP on.
type waiter struct {
	log     *slog.Logger
	start   time.Time
	results chan attempt
	seen    map[string]*linkState // Ethernet links with a DHCP client
	others  []string              // other links: loopback, tunnels
}

type linkState struct {
	mac     net.HardwareAddr
	lastErr error
}

// startNew sets up the Ethernet links that appeared since the last scan and starts a DHCP
// client on each.
func (w *waiter) startNew(ctx context.Context, wg *sync.WaitGroup) error {
	links, err := netlink.LinkList()
	if err != nil {
		return fmt.Errorf("network: list links: %w", err)
	}
	w.others = w.others[:0]
	for _, l := range links {
		a := l.Attrs()
		if !isEthernet(l) {
			w.others = append(w.others, a.Name)
			continue
		}
		if _, ok := w.seen[a.Name]; ok {
			continue
		}
		if err := netlink.LinkSetUp(l); err != nil {
			return fmt.Errorf("network: set link %s up: %w", a.Name, err)
		}
		w.log.Info("network link up, asking for a DHCP lease", "link", a.Name, "mac", a.HardwareAddr.String())
		w.seen[a.Name] = &linkState{mac: a.HardwareAddr}
		wg.Add(1)
		go func() {
			defer wg.Done()
			runClient(ctx, a.Name, a.HardwareAddr, w.results)
		}()
	}
	return nil
}

// isEthernet is true for a link with an Ethernet address that is not the loopback: the links
// NIC drivers create (tunnels such as sit0 and tunl0 have other encapsulations).
func isEthernet(l netlink.Link) bool {
	a := l.Attrs()
	return a.Flags&net.FlagLoopback == 0 && a.EncapType == "ether" && len(a.HardwareAddr) == 6
}

// names lists the Ethernet links seen, sorted.
func (w *waiter) names() []string {
	names := make([]string, 0, len(w.seen))
	for n := range w.seen {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// report tells the console what Up is waiting for.
func (w *waiter) report() {
	waited := time.Since(w.start).Round(time.Second)
	if len(w.seen) == 0 {
		w.log.Info(fmt.Sprintf("waiting for a network link (%d s)", int(waited.Seconds())), "other_links", strings.Join(w.others, ","))
		return
	}
	w.log.Info(fmt.Sprintf("waiting for a DHCP lease on %s (%d s)", strings.Join(w.names(), ", "), int(waited.Seconds())))
}
