package dns

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	"github.com/kilnproject/kiln/internal/poll"
)

// Registration states, the values of State.State.
const (
	StatePending    = "pending"    // not published yet; Register keeps trying
	StateRegistered = "registered" // the provider holds the records
	StateFailed     = "failed"     // the records or the provider's settings are wrong; no retry
)

// State is where a registration stands. It is what StatusFile stores.
type State struct {
	State     string    `json:"state"`
	Provider  string    `json:"provider"`
	Records   []Record  `json:"records"`
	LastError string    `json:"last_error,omitempty"`
	Attempts  int       `json:"attempts"`
	Updated   time.Time `json:"updated"`
}

// String is "registered", "pending", "pending: <last error>" or "failed: <error>".
func (s State) String() string {
	if s.LastError == "" {
		return s.State
	}
	return s.State + ": " + s.LastError
}

// Options tune Register.
type Options struct {
	// MinBackoff and MaxBackoff bound the wait between attempts, which doubles from
	// MinBackoff (1 s when 0) up to MaxBackoff (2 min when 0); each wait is jittered
	// to between half and all of it, so nodes booted together do not retry together.
	MinBackoff, MaxBackoff time.Duration
	// Log receives a line per failed attempt and one when registered; nil: discard.
	Log *slog.Logger
	// OnState is called with every state change: pending before the first attempt,
	// pending with the error after each failure, then registered (or failed). Calls
	// come from the goroutine running Register, one at a time.
	OnState func(State)
}

// warner is a Provider whose settings have a weakness Register warns of every time it
// runs, e.g. RFC2136 without TSIG.
type warner interface {
	Warning() string
}

// errConfig marks errors no retry can fix (see invalid).
var errConfig = errors.New("invalid")

// configError is an error in the records or the provider's settings.
type configError struct{ error }

func (e configError) Unwrap() error        { return e.error }
func (e configError) Is(target error) bool { return target == errConfig }

// invalid marks err as one no retry can fix.
func invalid(err error) error {
	if err == nil {
		return nil
	}
	return configError{err}
}

// Register publishes recs through p and returns once p holds them: it looks the
// names up first and does nothing when p already answers the desired addresses
// (providers without lookup are always updated), else it upserts. A failed attempt
// is retried with exponential backoff and jitter until ctx ends; Register then
// returns the last state and an error wrapping the last failure. Invalid records are
// not retried (state failed). A provider set up without authentication (RFC2136
// without TSIG) gets a warning logged at every call.
func Register(ctx context.Context, p Provider, recs []Record, opts Options) (State, error) {
	log := opts.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	minB, maxB := opts.MinBackoff, opts.MaxBackoff
	if minB <= 0 {
		minB = time.Second
	}
	if maxB <= 0 {
		maxB = 2 * time.Minute
	}
	maxB = max(maxB, minB)
	st := State{State: StatePending, Provider: p.Name(), Records: recs}
	report := func() {
		st.Updated = time.Now().UTC()
		if opts.OnState != nil {
			opts.OnState(st)
		}
	}
	if w, ok := p.(warner); ok {
		if msg := w.Warning(); msg != "" {
			log.Warn("dns: "+msg, "provider", p.Name())
		}
	}
	if err := checkRecords(recs); err != nil {
		st.State, st.LastError = StateFailed, err.Error()
		report()
		return st, fmt.Errorf("dns %s: %w", p.Name(), err)
	}
	report()
	var changed bool
	err := poll.Retry(ctx, poll.Options{
		What:      "dns " + p.Name(),
		Backoff:   poll.Backoff{Initial: minB, Factor: 2, Max: maxB, Jitter: 0.5},
		Retryable: func(err error) bool { return !errors.Is(err, errConfig) },
		OnRetry: func(a poll.Attempt) {
			report()
			log.Warn("dns: registration pending", "provider", p.Name(), "attempt", a.N, "retry_in", a.Pause.Round(time.Millisecond), "err", a.Err)
		},
	}, func(ctx context.Context) error {
		st.Attempts++
		var err error
		changed, err = registerOnce(ctx, p, recs, log)
		if err != nil && ctx.Err() == nil {
			st.LastError = err.Error()
		}
		return err
	})
	var pe *poll.Error
	switch {
	case err == nil:
		st.State, st.LastError = StateRegistered, ""
		report()
		log.Info("dns: registered", "provider", p.Name(), "records", len(recs), "changed", changed, "attempts", st.Attempts)
		return st, nil
	case errors.As(err, &pe):
		// When ctx cut the last attempt short, Last is the failure before it: the one worth
		// reporting.
		st.LastError = pe.Last.Error()
		report()
		return st, fmt.Errorf("dns %s: not registered after %d attempts (%w): %w", p.Name(), st.Attempts, ctx.Err(), pe.Last)
	default:
		st.State, st.LastError = StateFailed, err.Error()
		report()
		log.Error("dns: cannot register", "provider", p.Name(), "err", err)
		return st, fmt.Errorf("dns %s: %w", p.Name(), err)
	}
}

// registerOnce looks recs up and upserts those p does not hold yet. It reports
// whether it changed anything.
func registerOnce(ctx context.Context, p Provider, recs []Record, log *slog.Logger) (bool, error) {
	if ctx.Err() != nil {
		return false, ctx.Err()
	}
	var todo []Record
	looked := map[string][]netip.Addr{}
	for _, r := range recs {
		have, ok := looked[FQDN(r.Name)]
		if !ok {
			var err error
			have, err = p.Lookup(ctx, r.Name)
			if err != nil {
				if !errors.Is(err, errNoLookup) {
					log.Debug("dns: lookup failed; updating", "name", HostName(r.Name), "err", err)
				}
				todo = recs
				break
			}
			looked[FQDN(r.Name)] = have
		}
		var family []netip.Addr
		for _, a := range have {
			if a.Is4() == (r.Type == TypeA) {
				family = append(family, a)
			}
		}
		if _, differs := r.Want(family); differs {
			todo = append(todo, r)
		}
	}
	if len(todo) == 0 {
		return false, nil
	}
	if err := p.Upsert(ctx, todo); err != nil {
		return false, err
	}
	return true, nil
}

// result is what Start delivers: the final state and Register's error.
type result struct {
	State State
	Err   error
}

// Start runs Register in a goroutine and returns at once, so boot goes on while the
// DNS server is unreachable. The channel delivers one result, when the records are
// registered or ctx ends, and is then closed.
func Start(ctx context.Context, p Provider, recs []Record, opts Options) <-chan result {
	ch := make(chan result, 1)
	go func() {
		defer close(ch)
		st, err := Register(ctx, p, recs, opts)
		ch <- result{State: st, Err: err}
	}()
	return ch
}
