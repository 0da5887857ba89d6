package netup

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4/nclient4"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// noLeaseError says why Up got no lease: no Ethernet link appeared, or none of them got a lease.
type noLeaseError struct {
	waited time.Duration
	// links are the Ethernet links Up ran DHCP on, with what each one lacked.
	links []linkReport
	// others are the other links seen (lo, tunnels), which Up does not use.
	others []string
}

// linkReport is one Ethernet link's state when Up gave up.
type linkReport struct {
	name    string
	mac     string
	carrier bool
	// lastErr is the last DHCP attempt's failure, e.g. "no DHCP offer".
	lastErr string
}

func (e *noLeaseError) Error() string {
	others := strings.Join(e.others, ", ")
	if others == "" {
		others = "none"
	}
	if len(e.links) == 0 {
		return fmt.Sprintf("network: no network link appeared within %s (links seen: %s); is the NIC's driver among the image's initramfs modules?",
			e.waited, others)
	}
	names := make([]string, len(e.links))
	states := make([]string, len(e.links))
	for i, l := range e.links {
		names[i] = l.name
		carrier := "link up"
		if !l.carrier {
			carrier = "no carrier"
		}
		states[i] = fmt.Sprintf("%s %s: %s, %s", l.name, l.mac, carrier, l.lastErr)
	}
	return fmt.Sprintf("network: no DHCP lease within %s on %s (%s)", e.waited, strings.Join(names, ", "), strings.Join(states, "; "))
}

// failure is Up's error once ctx is done: a *noLeaseError when the timeout ran out, the
// context's error when the caller cancelled.
func (w *waiter) failure(ctx context.Context, timeout time.Duration) error {
	if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("network: %w", ctx.Err())
	}
	e := &noLeaseError{waited: timeout, others: append([]string(nil), w.others...)}
	for _, name := range w.names() {
		st := w.seen[name]
		r := linkReport{name: name, mac: st.mac.String(), lastErr: "no DHCP offer"}
		if st.lastErr != nil {
			r.lastErr = st.lastErr.Error()
		}
		if l, err := netlink.LinkByName(name); err == nil {
			r.carrier = l.Attrs().RawFlags&unix.IFF_LOWER_UP != 0
		}
		e.links = append(e.links, r)
	}
	return e
}

// dhcpError shortens the DHCP client's errors to what the console needs.
func dhcpError(err error) error {
	var nak *nclient4.ErrNak
	switch {
	case errors.As(err, &nak):
		return fmt.Errorf("the DHCP server refused the request: %w", err)
	case errors.Is(err, nclient4.ErrNoResponse):
		return errors.New("no DHCP offer")
	}
	return err
}
