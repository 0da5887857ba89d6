// Package etcdmember decides how this node's etcd member starts in a cluster of several,
// the way kubeadm (EtcdLearnerMode) and etcd-manager grow a cluster: one member at a time.
//
// The seed member (etcd.seed in node.yaml, else the first of etcd.members) starts a
// one-member cluster when no other member answers. Every other member, and a seed whose
// disk is blank while the cluster runs, joins the running cluster: it removes a stale
// member of its own name (the one whose data went with the old disk), adds itself as a
// learner (etcd's MemberAddAsLearner), starts with --initial-cluster-state=existing and,
// once etcd has started it and it has caught up with the leader, is promoted to a voting
// member (Promote). A learner does not count towards the quorum, so a member that joins
// never puts the cluster's quorum at risk, and etcd takes one learner at a time: members
// that boot together join one after another. A data directory that holds data is never
// touched: its member just starts.
//
// Decide returns a *WaitError while the member cannot start yet (the seed has not started
// the cluster, the cluster has no quorum, another member is joining); first boot waits
// and asks again. Probe tells how many members answer, for the status of a node that
// waits for its peers.
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

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/kilnproject/kiln/initd/config"
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
	// Members are every member the cluster may have, this one included: where to find the
	// running ones.
	Members []Member
	// Seed names the member that starts a new cluster; empty means Members[0].
	Seed string
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
	// Learner reports that this member is a learner of the running cluster: it must be
	// promoted (Promote) once etcd has started it.
	Learner bool
	// Why says in a sentence how the plan was reached.
	Why string
	// Changed reports whether the cluster's membership was changed (removed, added).
	Changed bool
}

// WaitError is Decide's error while this member cannot start yet; Reason says what it
// waits for.
type WaitError struct{ Reason string }

func (e *WaitError) Error() string { return "etcd member cannot start yet: " + e.Reason }

// ErrHasData is returned by Join for a data directory that holds data.
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

// Decide plans this member's start. A data directory with data: the member just starts
// (etcd ignores the initial flags then), nothing is asked. An empty one: the other members
// are asked for the membership. When one answers, the cluster runs and this member joins
// it (Join). When none answers and none is even reachable, the seed starts a new
// one-member cluster and any other member waits for it (*WaitError); when one is
// reachable but none answers (a cluster without quorum, a seed still starting), every
// member waits, the seed too: it must not start a second cluster beside a running one.
// Decide can be run again at any point: each step checks the membership first.
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
	p, err := Join(ctx, o)
	var na *NoAnswerError
	if !errors.As(err, &na) {
		return p, err
	}
	if reach := Probe(ctx, o.others(), 2*time.Second); len(reach.Reachable) > 0 {
		return Plan{}, &WaitError{Reason: fmt.Sprintf("etcd members %s listen but none answers for the membership (%v): waiting for the cluster to have a quorum",
			strings.Join(reach.Reachable, ", "), na.Err)}
	}
	if o.Name != o.Seed {
		return Plan{}, &WaitError{Reason: fmt.Sprintf("no etcd member answers: waiting for the seed member %s (%s) to start the cluster",
			o.Seed, o.hostOf(o.Seed))}
	}
	self := []Member{{Name: o.Name, PeerURL: o.PeerURL}}
	return Plan{State: StateNew, Members: self,
		Why: "empty data directory, this is the seed member and no other member answers: a new one-member cluster; the others join it"}, nil
}

// NoAnswerError is Join's error when no other member answered.
type NoAnswerError struct{ Err error }

func (e *NoAnswerError) Error() string { return "no other etcd member answered: " + e.Err.Error() }
func (e *NoAnswerError) Unwrap() error { return e.Err }

// Join makes this member, whose data directory is empty, a member of the running cluster:
// it removes the member of the same name or peer URL that has started before (its data is
// gone with the old disk), adds this one as a learner, and returns the plan to start as
// "existing" with the current membership. A member already listed but never started (an
// earlier run added it, and was cut off before etcd started) is kept. While another member
// is a learner, etcd takes no second one: Join then returns a *WaitError. A data directory
// with data is refused (ErrHasData); no member answering is a *NoAnswerError.
func Join(ctx context.Context, o Options) (Plan, error) {
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
	list, err := o.membership(ctx, peers)
	if err != nil {
		return Plan{}, &NoAnswerError{Err: err}
	}
	// Membership changes go to the voting members only: a learner, or a member still
	// starting, holds a request until its deadline.
	c, err := o.votersClient(list)
	if err != nil {
		return Plan{}, err
	}
	defer c.Close()
	found, changed, err := o.removeStale(ctx, c, list)
	if err != nil {
		return joinFailed(changed, err), err
	}
	if !found {
		if err := o.addLearner(ctx, c, list); err != nil {
			return joinFailed(changed, err), err
		}
		changed = true
	}
	if changed {
		if list, err = o.memberList(ctx, c); err != nil {
			return Plan{}, err
		}
	}
	return o.joinPlan(list, changed), nil
}

// removeStale removes from list the members of this one's name or peer URL that have
// started before. It reports whether list holds this member's place, never started (found),
// and whether it removed a member (changed).
func (o Options) removeStale(ctx context.Context, c *clientv3.Client, list []*etcdserverpb.Member) (found, changed bool, err error) {
	for _, m := range list {
		if !o.isSelf(m) {
			continue
		}
		if m.Name == "" && len(m.ClientURLs) == 0 && slices.Contains(m.PeerURLs, o.PeerURL) {
			// Never started: this member's place, added by an earlier run.
			found = true
			continue
		}
		o.Log.Info("removing the stale etcd member", "name", m.Name, "id", fmt.Sprintf("%x", m.ID), "peerURLs", m.PeerURLs)
		err := o.retryUnhealthy(ctx, func(ctx context.Context) error {
			_, err := c.MemberRemove(ctx, m.ID)
			return err
		})
		if timedOut(err) {
			return found, changed, &WaitError{Reason: fmt.Sprintf("the removal of the stale member %s was not answered in time (%v): asking again", m.Name, err)}
		}
		if err != nil {
			return found, changed, fmt.Errorf("remove stale etcd member %s (%x): %w", m.Name, m.ID, err)
		}
		changed = true
	}
	return found, changed, nil
}

// addLearner adds this member to the cluster as a learner, unless another member of list is
// a learner: etcd takes one at a time, and this one waits (*WaitError).
func (o Options) addLearner(ctx context.Context, c *clientv3.Client, list []*etcdserverpb.Member) error {
	if l := otherLearner(list, o); l != "" {
		return &WaitError{Reason: "etcd member " + l + " is joining as a learner; etcd takes one at a time: waiting for its promotion"}
	}
	o.Log.Info("adding this etcd member as a learner", "name", o.Name, "peerURL", o.PeerURL)
	err := o.retryUnhealthy(ctx, func(ctx context.Context) error {
		_, err := c.MemberAddAsLearner(ctx, []string{o.PeerURL})
		return err
	})
	if errors.Is(err, rpctypes.ErrTooManyLearners) {
		return &WaitError{Reason: "another etcd member is joining as a learner; etcd takes one at a time: waiting for its promotion"}
	}
	if timedOut(err) {
		// Two members that add themselves at once: etcd applies one and holds the other
		// until its deadline. The next run finds this one listed, or the other.
		return &WaitError{Reason: fmt.Sprintf("adding this member as a learner was not answered in time (%v): asking again", err)}
	}
	if err != nil {
		return fmt.Errorf("add etcd member %s (%s) as a learner: %w", o.Name, o.PeerURL, err)
	}
	return nil
}

// joinFailed is the plan Join returns with err: with a *WaitError, it says whether Join
// changed the membership before it had to wait.
func joinFailed(changed bool, err error) Plan {
	var wait *WaitError
	if errors.As(err, &wait) {
		return Plan{Changed: changed}
	}
	return Plan{}
}

// joinPlan is the plan of a member that joined the cluster of membership list (changed: by
// this run) and starts as "existing".
func (o Options) joinPlan(list []*etcdserverpb.Member, changed bool) Plan {
	p := Plan{State: StateExisting, Changed: changed, Members: o.initialCluster(list)}
	for _, m := range list {
		if slices.Contains(m.PeerURLs, o.PeerURL) {
			p.Learner = m.IsLearner
		}
	}
	if changed {
		p.Why = "empty data directory in a running cluster: joined it as a learner"
	} else {
		p.Why = "empty data directory in a running cluster that already lists " + o.Name + " as not started"
	}
	return p
}

// timedOut reports whether a membership change ended without an answer: it may have been
// applied or not, and the membership says which when asked again.
func timedOut(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, rpctypes.ErrTimeout) ||
		errors.Is(err, rpctypes.ErrTimeoutDueToConnectionLost) || errors.Is(err, rpctypes.ErrTimeoutDueToLeaderFail)
}

// otherLearner is the name (or peer URL) of a learner of list that is not this member.
func otherLearner(list []*etcdserverpb.Member, o Options) string {
	for _, m := range list {
		if m.IsLearner && !o.isSelf(m) {
			if m.Name != "" {
				return m.Name
			}
			return strings.Join(m.PeerURLs, ",")
		}
	}
	return ""
}

// retryUnhealthy runs a membership change until etcd takes it: etcd refuses one (as
// "unhealthy cluster") until its leader has been connected to a quorum for 5 seconds, as it
// has not right after the previous change. Each try is bounded by o.Timeout, all of them by
// six times that.
func (o Options) retryUnhealthy(ctx context.Context, f func(context.Context) error) error {
	return o.retry(ctx, 6*o.Timeout, f, rpctypes.ErrUnhealthy)
}

// retry runs f until it succeeds, fails with an error other than retryable, or within
// ends; each try is bounded by o.Timeout, and tries are a second apart.
func (o Options) retry(ctx context.Context, within time.Duration, f func(context.Context) error, retryable ...error) error {
	deadline := time.Now().Add(within)
	for {
		tctx, cancel := context.WithTimeout(ctx, o.Timeout)
		err := f(tctx)
		cancel()
		again := slices.ContainsFunc(retryable, func(r error) bool { return errors.Is(err, r) })
		if err == nil || !again || time.Now().After(deadline) {
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
	if o.Seed == "" && len(o.Members) > 0 {
		o.Seed = o.Members[0].Name
	}
	return o
}

// isSelf reports whether m is this member: the same name, or the same peer URL. (A member
// not started yet has no name.)
func (o Options) isSelf(m *etcdserverpb.Member) bool {
	return (m.Name != "" && m.Name == o.Name) || slices.Contains(m.PeerURLs, o.PeerURL)
}

// initialCluster is --initial-cluster for the membership list: members not started yet have
// no name in it, and take the one Members gives their peer URL (this member's own, for
// this member).
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

// others are the members other than this one.
func (o Options) others() []Member {
	var out []Member
	for _, m := range o.Members {
		if m.Name != o.Name && m.PeerURL != o.PeerURL {
			out = append(out, m)
		}
	}
	return out
}

// hostOf is the host of member name's peer URL (its name when it has none).
func (o Options) hostOf(name string) string {
	for _, m := range o.Members {
		if m.Name == name {
			if u, err := url.Parse(m.PeerURL); err == nil && u.Hostname() != "" {
				return u.Hostname()
			}
		}
	}
	return name
}

// endpoints are the client URLs of every member, this one first.
func (o Options) endpoints() []string {
	self, err := ClientURL(o.PeerURL)
	if err != nil {
		return o.peerEndpoints()
	}
	return append([]string{self}, o.peerEndpoints()...)
}

// peerEndpoints are the client URLs of the other members: their peer URL's host on port
// 2379.
func (o Options) peerEndpoints() []string {
	var out []string
	for _, m := range o.others() {
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
	return newClient(endpoints, o.TLS, o.Timeout)
}

func newClient(endpoints []string, tc *tls.Config, timeout time.Duration) (*clientv3.Client, error) {
	c, err := clientv3.New(clientv3.Config{Endpoints: endpoints, TLS: tc, DialTimeout: timeout,
		Logger: zap.NewNop()})
	if err != nil {
		return nil, fmt.Errorf("etcd client for %s: %w", strings.Join(endpoints, ", "), err)
	}
	return c, nil
}

// memberList asks c for the membership, linearizably: only a voting member in a cluster
// with quorum answers.
func (o Options) memberList(ctx context.Context, c *clientv3.Client) ([]*etcdserverpb.Member, error) {
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	r, err := c.MemberList(ctx)
	if err != nil {
		return nil, fmt.Errorf("etcd member list from %s: %w", strings.Join(c.Endpoints(), ", "), err)
	}
	return r.Members, nil
}

// membership asks each of endpoints at once for the membership (memberList) and returns
// the first answer; the error names every endpoint's failure when none answers. Each is
// asked on its own: a client of all of them may wait its whole deadline on a learner, or
// on a member that is still starting.
func (o Options) membership(ctx context.Context, endpoints []string) ([]*etcdserverpb.Member, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type answer struct {
		list []*etcdserverpb.Member
		err  error
	}
	ch := make(chan answer, len(endpoints))
	for _, ep := range endpoints {
		go func() {
			c, err := o.client([]string{ep})
			if err != nil {
				ch <- answer{err: err}
				return
			}
			defer c.Close()
			list, err := o.memberList(ctx, c)
			ch <- answer{list, err}
		}()
	}
	var errs []error
	for range endpoints {
		a := <-ch
		if a.err == nil {
			return a.list, nil
		}
		errs = append(errs, a.err)
	}
	return nil, errors.Join(errs...)
}

// votersClient is a client of list's started voting members, at the client URLs they
// advertise.
func (o Options) votersClient(list []*etcdserverpb.Member) (*clientv3.Client, error) {
	var eps []string
	for _, m := range list {
		if m.Name != "" && !m.IsLearner {
			eps = append(eps, m.ClientURLs...)
		}
	}
	if len(eps) == 0 {
		return nil, fmt.Errorf("the etcd membership lists no started voting member (%s)", names(list))
	}
	return o.client(eps)
}

// StaticCluster is every member node n names: each of etcd.members at its DNS name,
// https://etcd-<member>.internal.<cluster>.<zone>:2380; nil for a node without etcd or DNS
// zone. On a control plane whose etcd is external, they are the etcd nodes' members.
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
