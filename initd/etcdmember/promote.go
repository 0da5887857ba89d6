package etcdmember

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
)

// Promotion is what Promote found or did.
type Promotion struct {
	ID uint64
	// Promoted reports that this call promoted the member; false when it was a voting
	// member already.
	Promoted bool
	// Tries counts the promotions etcd refused because the learner had not caught up.
	Tries int
}

// Promote makes this member a voting member once etcd has started it and it has caught up
// with the leader: it asks the members (this one included) for the membership until this
// member is listed as started, then, while it is a learner, asks for its promotion every
// interval until etcd takes it (etcd refuses a learner that is not in sync with the leader).
// A member that votes already is left alone. It returns when the member votes, or with
// ctx's error (naming what it waited for last).
func Promote(ctx context.Context, o Options, interval time.Duration) (Promotion, error) {
	o = o.withDefaults()
	var p Promotion
	last := "the membership"
	for {
		// This member answers once it votes; until then the others do.
		list, err := o.membership(ctx, o.endpoints())
		if err != nil {
			last = err.Error()
		}
		var me *memberState
		for _, m := range list {
			if o.isSelf(m) {
				me = &memberState{id: m.ID, started: m.Name != "", learner: m.IsLearner}
			}
		}
		switch {
		case err != nil:
		case me == nil:
			return p, fmt.Errorf("etcd member %s (%s) is not in the cluster's membership (%s): it was removed", o.Name, o.PeerURL, names(list))
		case !me.learner:
			p.ID = me.id
			return p, nil
		case !me.started:
			last = "etcd to start this learner"
		default:
			p.ID = me.id
			err := o.promote(ctx, list, me.id)
			switch {
			case err == nil:
				p.Promoted = true
				o.Log.Info("etcd member promoted to a voting member", "name", o.Name, "id", fmt.Sprintf("%x", me.id), "refused", p.Tries)
				return p, nil
			case errors.Is(err, rpctypes.ErrMemberLearnerNotReady), errors.Is(err, rpctypes.ErrUnhealthy):
				p.Tries++
				last = "the learner to catch up with the leader (" + err.Error() + ")"
			case errors.Is(err, rpctypes.ErrMemberNotLearner):
				return p, nil
			default:
				return p, fmt.Errorf("promote etcd member %s (%x): %w", o.Name, me.id, err)
			}
		}
		select {
		case <-ctx.Done():
			return p, fmt.Errorf("etcd member %s not promoted: still waiting for %s: %w", o.Name, last, ctx.Err())
		case <-time.After(interval):
		}
	}
}

// promote asks list's voting members to promote the learner id.
func (o Options) promote(ctx context.Context, list []*etcdserverpb.Member, id uint64) error {
	c, err := o.votersClient(list)
	if err != nil {
		return err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	_, err = c.MemberPromote(ctx, id)
	return err
}

type memberState struct {
	id               uint64
	started, learner bool
}

func names(list []*etcdserverpb.Member) string {
	var out []string
	for _, m := range list {
		n := m.Name
		if n == "" {
			n = strings.Join(m.PeerURLs, ",") + " (not started)"
		}
		out = append(out, n)
	}
	slices.Sort(out)
	return strings.Join(out, ", ")
}

// WaitVoter waits until the member at endpoint (a client URL) answers and is a voting
// member, asking every interval; it returns nil then, or ctx's error naming what it saw
// last. The API server of a stacked control plane waits for it, so that it never serves
// from a learner.
func WaitVoter(ctx context.Context, endpoint string, tc *tls.Config, interval time.Duration) error {
	c, err := newClient([]string{endpoint}, tc, 10*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	last := "no answer yet"
	for {
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		st, err := c.Status(sctx, endpoint)
		cancel()
		switch {
		case err != nil:
			last = err.Error()
		case st.IsLearner:
			last = "a learner, not promoted yet"
		case st.Leader == 0:
			last = "no leader"
		default:
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("etcd member at %s is not a voting member: %s: %w", endpoint, last, ctx.Err())
		case <-time.After(interval):
		}
	}
}
