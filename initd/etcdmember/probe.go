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

// String is the line `kiln-init status` shows while a control plane waits for its API
// server, e.g. "etcd: 1 of 3 members reachable (etcd-b.internal.prod.example.test,
// etcd-c.internal.prod.example.test unreachable)". Whether the reachable ones make a quorum
// depends on the cluster's membership, which grows one member at a time: the seed alone
// is a cluster of one.
func (r Reach) String() string {
	n := len(r.Reachable) + len(r.Unreachable)
	s := fmt.Sprintf("etcd: %d of %d members reachable", len(r.Reachable), n)
	if len(r.Unreachable) > 0 {
		s += " (" + strings.Join(r.Unreachable, ", ") + " unreachable)"
	}
	return s
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
