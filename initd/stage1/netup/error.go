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

// Error says why Up got no lease: no Ethernet link appeared, or none of them got a lease.
type Error struct {
	Waited time.Duration
	// Links are the Ethernet links Up ran DHCP on, with what each one lacked.
	Links []LinkReport
	// Others are the other links seen (lo, tunnels), which Up does not use.
	Others []string
}

// LinkReport is one Ethernet link's state when Up gave up.
type LinkReport struct {
	Name    string
	MAC     string
	Carrier bool
	// LastErr is the last DHCP attempt's failure, e.g. "no DHCP offer".
	LastErr string
}

func (e *Error) Error() string {
	others := strings.Join(e.Others, ", ")
	if others == "" {
		others = "none"
	}
	if len(e.Links) == 0 {
		return fmt.Sprintf("network: no network link appeared within %s (links seen: %s); is the NIC's driver among the image's initramfs modules?",
			e.Waited, others)
	}
	names := make([]string, len(e.Links))
	states := make([]string, len(e.Links))
	for i, l := range e.Links {
		names[i] = l.Name
		carrier := "link up"
		if !l.Carrier {
			carrier = "no carrier"
		}
		states[i] = fmt.Sprintf("%s %s: %s, %s", l.Name, l.MAC, carrier, l.LastErr)
	}
	return fmt.Sprintf("network: no DHCP lease within %s on %s (%s)", e.Waited, strings.Join(names, ", "), strings.Join(states, "; "))
}

// failure is Up's error once ctx is done: an *Error when the timeout ran out, the context's
// error when the caller cancelled.
func (w *waiter) failure(ctx context.Context, timeout time.Duration) error {
	if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("network: %w", ctx.Err())
	}
	e := &Error{Waited: timeout, Others: append([]string(nil), w.others...)}
	for _, name := range w.names() {
		st := w.seen[name]
		r := LinkReport{Name: name, MAC: st.mac.String(), LastErr: "no DHCP offer"}
		if st.lastErr != nil {
			r.LastErr = st.lastErr.Error()
		}
		if l, err := netlink.LinkByName(name); err == nil {
			r.Carrier = l.Attrs().RawFlags&unix.IFF_LOWER_UP != 0
		}
		e.Links = append(e.Links, r)
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
