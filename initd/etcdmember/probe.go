package etcdmember

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync"
	"time"
)

// Reach is which members of the cluster answer on their peer port.
type Reach struct {
	Reachable   []string // the reachable members' peer URLs' hosts
	Unreachable []string
}

// Quorum reports whether enough members are reachable for a quorum (more than half).
func (r Reach) Quorum() bool {
	n := len(r.Reachable) + len(r.Unreachable)
	return n > 0 && len(r.Reachable) > n/2
}

// String is the line `kiln-init status` shows, e.g. "etcd: waiting for quorum: 1 of 3
// members reachable (etcd-b.internal.prod.example.test, etcd-c.internal.prod.example.test
// unreachable)".
func (r Reach) String() string {
	n := len(r.Reachable) + len(r.Unreachable)
	if r.Quorum() {
		s := fmt.Sprintf("etcd: %d of %d members reachable", len(r.Reachable), n)
		if len(r.Unreachable) > 0 {
			s += " (" + strings.Join(r.Unreachable, ", ") + " unreachable)"
		}
		return s
	}
	return fmt.Sprintf("etcd: waiting for quorum: %d of %d members reachable (%s unreachable)",
		len(r.Reachable), n, strings.Join(r.Unreachable, ", "))
}

// Probe dials every member's peer URL (a TCP connection, timeout each) at once and says
// which answer. A member that runs listens on its peer port before the cluster has a
// quorum, so this tells a member that waits for its peers from one that is down.
func Probe(ctx context.Context, members []Member, timeout time.Duration) Reach {
	ok := make([]bool, len(members))
	hosts := make([]string, len(members))
	var wg sync.WaitGroup
	for i, m := range members {
		u, err := url.Parse(m.PeerURL)
		if err != nil || u.Host == "" {
			hosts[i] = m.Name
			continue
		}
		hosts[i] = u.Hostname()
		wg.Add(1)
		go func() {
			defer wg.Done()
			d := net.Dialer{Timeout: timeout}
			c, err := d.DialContext(ctx, "tcp", u.Host)
			if err == nil {
				ok[i] = true
				c.Close()
			}
		}()
	}
	wg.Wait()
	var r Reach
	for i := range members {
		if ok[i] {
			r.Reachable = append(r.Reachable, hosts[i])
		} else {
			r.Unreachable = append(r.Unreachable, hosts[i])
		}
	}
	return r
}
