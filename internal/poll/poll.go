// Package poll waits for a condition to hold, or retries an operation, within a deadline and
// with a growing pause between attempts. When the wait ends without success the error says
// what was awaited and carries the last attempt's error; errors.Is tells a timeout
// (ErrTimeout, which is also context.DeadlineExceeded) from a cancelled context.
package poll

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"
)

// ErrTimeout is the cause of an Error whose Options.Timeout passed. errors.Is reports it as
// context.DeadlineExceeded too, so callers that test for a deadline keep working.
var ErrTimeout error = timeoutError{}

type timeoutError struct{}

func (timeoutError) Error() string        { return "timed out" }
func (timeoutError) Is(target error) bool { return target == context.DeadlineExceeded }

// Clock is the time source of a wait; tests pass one that does not depend on the wall clock.
type Clock interface {
	Now() time.Time
	// After delivers once d has passed.
	After(d time.Duration) <-chan time.Time
}

type wallClock struct{}

func (wallClock) Now() time.Time                         { return time.Now() }
func (wallClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// Backoff is the pause between two attempts: Initial after the first, then each pause is
// the one before times Factor, up to Max.
type Backoff struct {
	// Initial is the first pause; 0 means one second.
	Initial time.Duration
	// Factor is how much each pause grows; 1 or less (0 included) keeps it constant.
	Factor float64
	// Max caps the pause; 0 means no cap.
	Max time.Duration
	// Jitter, between 0 and 1, draws each pause at random between (1-Jitter)×p and p, so
	// that machines started together do not retry together.
	Jitter float64
}

// Constant is a Backoff that pauses d between attempts.
func Constant(d time.Duration) Backoff { return Backoff{Initial: d} }

// first returns the pause after the first attempt.
func (b Backoff) first() time.Duration {
	p := b.Initial
	if p <= 0 {
		p = time.Second
	}
	if b.Max > 0 {
		p = min(p, b.Max)
	}
	return p
}

// grow returns the pause that follows p.
func (b Backoff) grow(p time.Duration) time.Duration {
	if b.Factor > 1 {
		p = time.Duration(float64(p) * b.Factor)
	}
	if b.Max > 0 {
		p = min(p, b.Max)
	}
	return p
}

// jitter draws the pause actually taken for p.
func (b Backoff) jitter(p time.Duration) time.Duration {
	j := min(max(b.Jitter, 0), 1)
	if j == 0 || p <= 0 {
		return p
	}
	spread := time.Duration(float64(p) * j)
	return p - spread + rand.N(spread+1)
}

// Attempt describes a failed attempt, for Options.OnRetry.
type Attempt struct {
	// N counts the attempts, from 1.
	N int
	// Err is the attempt's error; nil when a condition reported not done without one.
	Err error
	// Pause is how long the wait now sleeps before the next attempt.
	Pause time.Duration
}

// Options tune a wait.
type Options struct {
	// What names what is awaited, for the error: "volume vol-1 to be attached".
	What string
	// Timeout bounds the wait; 0 means only ctx does. It is checked between attempts,
	// never inside one: an attempt runs to its end (bounded by ctx and its own timeouts),
	// at least one is made, and one more is made when the deadline comes during a pause, so
	// the error says what the last look found rather than that a deadline cut it short.
	Timeout time.Duration
	// Backoff sets the pauses between attempts.
	Backoff Backoff
	// Retryable reports whether an attempt's error is worth another attempt; an error it
	// refuses ends the wait and is returned as it is. nil retries every error.
	Retryable func(error) bool
	// Delay, when set, may choose the pause after a failed attempt from its error (a
	// server's Retry-After, say): a positive result is taken instead of the backoff's pause
	// (without jitter, still bounded by Timeout); zero keeps the backoff's. Either way the
	// backoff grows as usual for the pauses that follow.
	Delay func(err error) time.Duration
	// OnRetry, when set, is called after each failed attempt that will be followed by
	// another, e.g. to log it.
	OnRetry func(Attempt)
	// Clock is the time source; nil means the wall clock.
	Clock Clock
}

// Error is the error of a wait that ended without success: its Timeout passed (Cause is
// ErrTimeout) or its context ended (Cause is the context's cause).
type Error struct {
	What     string
	Timeout  time.Duration
	Attempts int
	// Last is the last attempt's error that the end of the wait did not cause; nil when
	// every attempt reported not done without an error.
	Last error
	// Cause is ErrTimeout or the context's cause.
	Cause error
}

func (e *Error) Error() string {
	what := e.What
	if what == "" {
		what = "a condition"
	}
	if errors.Is(e.Cause, ErrTimeout) {
		msg := fmt.Sprintf("waiting %s for %s", e.Timeout, what)
		if e.Last == nil {
			return msg + ": " + e.Cause.Error()
		}
		return msg + ": " + e.Last.Error()
	}
	if e.Last == nil {
		return fmt.Sprintf("waiting for %s: %v", what, e.Cause)
	}
	return fmt.Sprintf("waiting for %s: %v (%v)", what, e.Last, e.Cause)
}

// Unwrap gives errors.Is and errors.As both the cause and the last attempt's error.
func (e *Error) Unwrap() []error {
	if e.Last == nil {
		return []error{e.Cause}
	}
	return []error{e.Cause, e.Last}
}

// Until calls cond until it reports done, returns an error that Options.Retryable refuses,
// the timeout passes or ctx ends, pausing between calls as Options.Backoff says. A
// refused error is returned as it is; the end of the wait returns an *Error.
func Until(ctx context.Context, o Options, cond func(context.Context) (bool, error)) error {
	clock := o.Clock
	if clock == nil {
		clock = wallClock{}
	}
	var deadline time.Time
	if o.Timeout > 0 {
		deadline = clock.Now().Add(o.Timeout)
	}
	fail := func(n int, last, cause error) error {
		return &Error{What: o.What, Timeout: o.Timeout, Attempts: n, Last: last, Cause: cause}
	}
	pause := o.Backoff.first()
	var last error
	for n := 1; ; n++ {
		done, err := cond(ctx)
		if done {
			return nil
		}
		if err != nil {
			if o.Retryable != nil && !o.Retryable(err) {
				return err
			}
			// An attempt that failed as ctx ended was most likely cut short by it: what the
			// attempts before it found says more than "context canceled".
			if ctx.Err() == nil || last == nil {
				last = err
			}
		}
		if ctx.Err() != nil {
			return fail(n, last, context.Cause(ctx))
		}
		sleep := o.Backoff.jitter(pause)
		if o.Delay != nil && err != nil {
			if d := o.Delay(err); d > 0 {
				sleep = d
			}
		}
		if !deadline.IsZero() {
			left := deadline.Sub(clock.Now())
			if left <= 0 {
				return fail(n, last, ErrTimeout)
			}
			sleep = min(sleep, left)
		}
		if o.OnRetry != nil {
			o.OnRetry(Attempt{N: n, Err: err, Pause: sleep})
		}
		select {
		case <-ctx.Done():
			return fail(n, last, context.Cause(ctx))
		case <-clock.After(sleep):
		}
		pause = o.Backoff.grow(pause)
	}
}

// Retry calls op until it succeeds, fails with an error that Options.Retryable refuses, the
// timeout passes or ctx ends; see Until.
func Retry(ctx context.Context, o Options, op func(context.Context) error) error {
	return Until(ctx, o, func(ctx context.Context) (bool, error) {
		err := op(ctx)
		return err == nil, err
	})
}
