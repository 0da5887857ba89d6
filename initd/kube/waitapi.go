package kube

import (
	"context"
	"log/slog"
	"time"

	"github.com/kilnproject/kiln/internal/poll"
)

// WaitAPIOptions says what WaitAPI waits for.
type WaitAPIOptions struct {
	// Path is the health endpoint: /healthz (the default), /readyz or /livez.
	Path string
	// Timeout bounds the wait; 0 waits until ctx ends.
	Timeout time.Duration
	// Interval is the pause between two requests; 0 means one second.
	Interval time.Duration
	Log      *slog.Logger
}

// WaitAPI returns once the API server of c answers "ok" on o.Path. It logs the failing
// checks each time they change, so a log shows what the API server was still doing.
//
// The controller-manager's static pod runs it as an init container: kube-controller-manager
// gives the API server a fixed 10 s to answer /healthz once it has won its leader lease, and
// exits otherwise. On a control plane that starts slowly its lease is granted while the API
// server's post-start hooks (rbac/bootstrap-roles above all) are still running, so it would
// win the lease, wait 10 s and exit; waiting here first lets it start only once /healthz is
// ok, without holding back the API server or anything else.
func WaitAPI(ctx context.Context, c *Client, o WaitAPIOptions) error {
	if o.Path == "" {
		o.Path = "/healthz"
	}
	if o.Interval <= 0 {
		o.Interval = time.Second
	}
	log := o.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	start := time.Now()
	last := ""
	err := poll.Until(ctx, poll.Options{What: c.server + o.Path, Timeout: o.Timeout, Backoff: poll.Constant(o.Interval)},
		func(ctx context.Context) (bool, error) {
			rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			err := c.check(rctx, o.Path)
			if err != nil {
				msg := err.Error()
				if last != msg {
					last = msg
					log.Info("waiting for the API server", "server", c.server, "path", o.Path, "reason", msg,
						"waited", time.Since(start).Round(time.Second))
				}
			}
			return err == nil, err
		})
	if err != nil {
		return err // names the URL awaited and the last answer
	}
	log.Info("API server ok", "server", c.server, "path", o.Path, "waited", time.Since(start).Round(time.Second))
	return nil
}
