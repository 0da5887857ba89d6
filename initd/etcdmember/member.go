// Package etcdmember decides how this node's etcd member starts in a cluster of several:
// as one of the static initial cluster (--initial-cluster-state=new), or, when its data
// directory is empty in a cluster that already runs, as a replacement that removed its
// stale self from the membership and added itself again (--initial-cluster-state=existing),
// as etcd-manager does. A data directory that holds data is never touched. It also tells
// how many members answer (Quorum), for the status of a node that waits for its peers.
package etcdmember

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/kilnproject/kiln/initd/config"
	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// The values of etcd's --initial-cluster-state.
const (
	StateNew      = "new"
	StateExisting = "existing"
)

// Member is one member of the cluster: its name and peer URL.
type Member struct {
	Name    string
	PeerURL string
}

// Options describe this member and its peers.
type Options struct {
	// Name and PeerURL are this member's (etcd's --name and --initial-advertise-peer-urls).
	Name    string
	PeerURL string
	// DataDir is etcd's --data-dir.
	DataDir string
	// Members is the static initial cluster, this member included.
	Members []Member
	// TLS is the client TLS configuration (the etcd CA and a client certificate it signed).
	TLS *tls.Config
	// Timeout bounds each question to the other members; 0 means 10 seconds.
	Timeout time.Duration
	// Log receives what was decided and done; nil discards it.
	Log *slog.Logger
}

// Plan is how the member starts: --initial-cluster-state and --initial-cluster.
type Plan struct {
	State   string
	Members []Member
	// Why says in a sentence how the plan was reached.
	Why string
	// Changed reports whether the cluster's membership was changed (removed, added).
	Changed bool
}

// ErrHasData is returned by Rejoin for a data directory that holds data.
var ErrHasData = errors.New("the etcd data directory holds data; it is never re-initialised")

// HasData reports whether dir holds an etcd member's data (its member directory exists,
// whatever it contains: a half-written one is not ours to throw away). A missing dir is
// empty; lost+found and other files are not etcd's.
func HasData(dir string) (bool, error) {
	_, err := os.Lstat(filepath.Join(dir, "member"))
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, fs.ErrNotExist):
		return false, nil
	}
	return false, fmt.Errorf("etcd data dir: %w", err)
}

// Decide plans this member's start. A data directory with data: the static cluster
// (etcd ignores the initial flags then), nothing asked. An empty one: the other members
// are asked for the membership; when none answers, the cluster is taken to be new (every
// member boots for the first time) and the static cluster is used. When one answers, the
// cluster exists and this member joins it (Rejoin).
func Decide(ctx context.Context, o Options) (Plan, error) {
	o = o.withDefaults()
	has, err := HasData(o.DataDir)
	if err != nil {
		return Plan{}, err
	}
	if has {
		return Plan{State: StateNew, Members: slices.Clone(o.Members),
			Why: "the data directory " + o.DataDir + " holds this member's data"}, nil
	}
	p, err := Rejoin(ctx, o)
	var nq *NoAnswerError
	if errors.As(err, &nq) {
		return Plan{State: StateNew, Members: slices.Clone(o.Members),
			Why: "empty data directory and no other member answered (" + nq.Error() + "): a new cluster"}, nil
	}
	return p, err
}

// NoAnswerError is Rejoin's error when no other member answered.
type NoAnswerError struct{ Err error }

func (e *NoAnswerError) Error() string { return "no other etcd member answered: " + e.Err.Error() }
func (e *NoAnswerError) Unwrap() error { return e.Err }

// Rejoin makes this member, whose data directory is empty, a member of the running cluster
// again: it removes the member of the same name or peer URL that has started before (its
// data is gone with the old disk), adds this one, and returns the plan to start as
// "existing" with the current membership. Each step checks the membership first, so a
// run cut off between the removal, the addition and etcd's start converges when run
// again. A data directory with data is refused (ErrHasData).
func Rejoin(ctx context.Context, o Options) (Plan, error) {
	o = o.withDefaults()
	has, err := HasData(o.DataDir)
	if err != nil {
		return Plan{}, err
	}
	if has {
		return Plan{}, fmt.Errorf("%s: %w", o.DataDir, ErrHasData)
	}
	peers := o.peerEndpoints()
	if len(peers) == 0 {
		return Plan{}, &NoAnswerError{Err: errors.New("this is the only member")}
	}
	c, err := o.client(peers)
	if err != nil {
		return Plan{}, err
	}
	defer c.Close()
	list, err := o.memberList(ctx, c)
	if err != nil {
		return Plan{}, &NoAnswerError{Err: err}
	}
	changed := false
	found := false
	for _, m := range list {
		if !o.isSelf(m) {
			continue
		}
		if len(m.ClientURLs) == 0 && slices.Contains(m.PeerURLs, o.PeerURL) {
			// Not started yet (a started member publishes its client URLs): this member's
			// place, from the static cluster or added by an earlier run.
			found = true
			continue
		}
		o.Log.Info("removing the stale etcd member", "name", m.Name, "id", fmt.Sprintf("%x", m.ID), "peerURLs", m.PeerURLs)
		err := o.retryUnhealthy(ctx, func(ctx context.Context) error {
			_, err := c.MemberRemove(ctx, m.ID)
			return err
		})
		if err != nil {
			return Plan{}, fmt.Errorf("remove stale etcd member %s (%x): %w", m.Name, m.ID, err)
		}
		changed = true
	}
	if !found {
		o.Log.Info("adding this etcd member", "name", o.Name, "peerURL", o.PeerURL)
		err := o.retryUnhealthy(ctx, func(ctx context.Context) error {
			_, err := c.MemberAdd(ctx, []string{o.PeerURL})
			return err
		})
		if err != nil {
			return Plan{}, fmt.Errorf("add etcd member %s (%s): %w", o.Name, o.PeerURL, err)
		}
		changed = true
	}
	if changed {
		if list, err = o.memberList(ctx, c); err != nil {
			return Plan{}, err
		}
	}
	p := Plan{State: StateExisting, Changed: changed, Members: o.initialCluster(list)}
	if changed {
		p.Why = "empty data directory in a running cluster: replaced the stale member " + o.Name
	} else {
		p.Why = "empty data directory in a running cluster that already lists " + o.Name + " as not started"
	}
	return p, nil
}

// retryUnhealthy runs a membership change until etcd takes it: etcd refuses one (as
// "unhealthy cluster") until its leader has been connected to a quorum for 5 seconds, as it
// has not right after the previous change. Each try is bounded by o.Timeout, all of them by
// six times that.
func (o Options) retryUnhealthy(ctx context.Context, f func(context.Context) error) error {
	deadline := time.Now().Add(6 * o.Timeout)
	for {
		tctx, cancel := context.WithTimeout(ctx, o.Timeout)
		err := f(tctx)
		cancel()
		if err == nil || !errors.Is(err, rpctypes.ErrUnhealthy) || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(time.Second):
		}
	}
}

func (o Options) withDefaults() Options {
	if o.Timeout == 0 {
		o.Timeout = 10 * time.Second
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	return o
}

// isSelf reports whether m is this member: the same name, or the same peer URL. (A member
// not started yet has no client URLs; the static cluster names it, MemberAdd does not.)
func (o Options) isSelf(m *etcdserverpb.Member) bool {
	return (m.Name != "" && m.Name == o.Name) || slices.Contains(m.PeerURLs, o.PeerURL)
}

// initialCluster is --initial-cluster for the membership list: members not started yet have
// no name in it, and take the one the static cluster gives their peer URL (this member's
// own, for this member).
func (o Options) initialCluster(list []*etcdserverpb.Member) []Member {
	var out []Member
	for _, m := range list {
		for _, u := range m.PeerURLs {
			name := m.Name
			if name == "" && u == o.PeerURL {
				name = o.Name
			}
			for _, s := range o.Members {
				if name == "" && s.PeerURL == u {
					name = s.Name
				}
			}
			if name == "" {
				name = fmt.Sprintf("%x", m.ID)
			}
			out = append(out, Member{Name: name, PeerURL: u})
		}
	}
	slices.SortFunc(out, func(a, b Member) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// peerEndpoints are the client URLs of the other members: their peer URL's host on port
// 2379.
func (o Options) peerEndpoints() []string {
	var out []string
	for _, m := range o.Members {
		if m.Name == o.Name || m.PeerURL == o.PeerURL {
			continue
		}
		if ep, err := ClientURL(m.PeerURL); err == nil {
			out = append(out, ep)
		}
	}
	return out
}

// ClientURL is the client URL of the member at peerURL: the same scheme and host, port 2379.
func ClientURL(peerURL string) (string, error) {
	u, err := url.Parse(peerURL)
	if err != nil || u.Hostname() == "" {
		return "", fmt.Errorf("etcd peer URL %q: not a URL with a host", peerURL)
	}
	return u.Scheme + "://" + net.JoinHostPort(u.Hostname(), "2379"), nil
}

func (o Options) client(endpoints []string) (*clientv3.Client, error) {
	c, err := clientv3.New(clientv3.Config{Endpoints: endpoints, TLS: o.TLS, DialTimeout: o.Timeout,
		Logger: zap.NewNop()})
	if err != nil {
		return nil, fmt.Errorf("etcd client for %s: %w", strings.Join(endpoints, ", "), err)
	}
	return c, nil
}

// memberList asks for the membership, linearizably: only a member in a cluster with quorum
// answers.
func (o Options) memberList(ctx context.Context, c *clientv3.Client) ([]*etcdserverpb.Member, error) {
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	r, err := c.MemberList(ctx)
	if err != nil {
		return nil, fmt.Errorf("etcd member list from %s: %w", strings.Join(c.Endpoints(), ", "), err)
	}
	return r.Members, nil
}

// StaticCluster is the static cluster node n names: every member of etcd.members at its DNS
// name, https://etcd-<member>.internal.<cluster>.<zone>:2380; nil for a node without etcd
// or DNS zone.
func StaticCluster(n *config.Node) []Member {
	if n.Etcd == nil || n.Cluster.DNSZone == "" {
		return nil
	}
	var out []Member
	for _, m := range n.Etcd.Members {
		out = append(out, Member{Name: m, PeerURL: "https://" + net.JoinHostPort(n.InternalName("etcd-"+m), "2380")})
	}
	return out
}
