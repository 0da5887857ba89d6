package poll

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
)

// fakeClock moves on by d at each After, at once: the tests never depend on the wall clock.
type fakeClock struct {
	now    time.Time
	pauses []time.Duration
}

func (c *fakeClock) Now() time.Time { return c.now }

func (c *fakeClock) After(d time.Duration) <-chan time.Time {
	c.pauses = append(c.pauses, d)
	c.now = c.now.Add(d)
	ch := make(chan time.Time, 1)
	ch <- c.now
	return ch
}

// stuckClock never fires: only the context ends a pause.
type stuckClock struct{ fakeClock }

func (*stuckClock) After(time.Duration) <-chan time.Time { return nil }

var (
	errNotYet = errors.New("not yet")
	errBusy   = errors.New("busy")
)

func TestUntil(t *testing.T) {
	errBad := errors.New("bad request")
	tests := []struct {
		name       string
		o          Options
		results    []error // one per call; past the end the condition holds
		wantCalls  int
		wantPauses []time.Duration
		wantErr    string
		wantIs     []error
	}{
		{
			name:       "holds on the third call",
			o:          Options{What: "x", Backoff: Backoff{Initial: 10 * time.Millisecond, Factor: 2, Max: 25 * time.Millisecond}},
			results:    []error{errNotYet, nil},
			wantCalls:  3,
			wantPauses: []time.Duration{10 * time.Millisecond, 20 * time.Millisecond},
		},
		{
			name:       "growth stops at Max",
			o:          Options{What: "x", Backoff: Backoff{Initial: 10 * time.Millisecond, Factor: 3, Max: 50 * time.Millisecond}},
			results:    []error{nil, nil, nil, nil},
			wantCalls:  5,
			wantPauses: []time.Duration{10 * time.Millisecond, 30 * time.Millisecond, 50 * time.Millisecond, 50 * time.Millisecond},
		},
		{
			name:       "timeout returns the last error",
			o:          Options{What: "the disk", Timeout: time.Second, Backoff: Constant(300 * time.Millisecond)},
			results:    slices.Repeat([]error{errNotYet}, 100),
			wantCalls:  5, // at 0, 300, 600 and 900ms, and once more at the deadline
			wantPauses: []time.Duration{300 * time.Millisecond, 300 * time.Millisecond, 300 * time.Millisecond, 100 * time.Millisecond},
			wantErr:    "waiting 1s for the disk: not yet",
			wantIs:     []error{ErrTimeout, context.DeadlineExceeded, errNotYet},
		},
		{
			name:       "timeout without an error",
			o:          Options{What: "the disk", Timeout: time.Second, Backoff: Constant(time.Second)},
			results:    slices.Repeat([]error{nil}, 100),
			wantCalls:  2,
			wantPauses: []time.Duration{time.Second},
			wantErr:    "waiting 1s for the disk: timed out",
			wantIs:     []error{ErrTimeout, context.DeadlineExceeded},
		},
		{
			name:       "a refused error ends the wait as it is",
			o:          Options{What: "x", Retryable: func(err error) bool { return err != errBad }, Backoff: Constant(time.Millisecond)},
			results:    []error{errNotYet, errBad, nil},
			wantCalls:  2,
			wantPauses: []time.Duration{time.Millisecond},
			wantErr:    "bad request",
			wantIs:     []error{errBad},
		},
		{
			name: "Delay replaces a pause; the backoff grows on",
			o: Options{What: "x", Backoff: Backoff{Initial: time.Second, Factor: 2},
				Delay: func(err error) time.Duration {
					if err == errBusy {
						return 7 * time.Second
					}
					return 0
				}},
			results:    []error{errNotYet, errBusy, errNotYet},
			wantCalls:  4,
			wantPauses: []time.Duration{time.Second, 7 * time.Second, 4 * time.Second},
		},
		{
			name: "Delay stays within Timeout",
			o: Options{What: "x", Timeout: 5 * time.Second, Backoff: Constant(time.Second),
				Delay: func(error) time.Duration { return time.Minute }},
			results:    []error{errBusy, errBusy},
			wantCalls:  2,
			wantPauses: []time.Duration{5 * time.Second},
			wantErr:    "waiting 5s for x: busy",
			wantIs:     []error{ErrTimeout, errBusy},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := &fakeClock{now: time.Unix(1000, 0)}
			tt.o.Clock = clock
			calls := 0
			err := Until(context.Background(), tt.o, func(context.Context) (bool, error) {
				calls++
				if calls > len(tt.results) {
					return true, nil
				}
				return false, tt.results[calls-1]
			})
			if calls != tt.wantCalls {
				t.Errorf("calls = %d, want %d", calls, tt.wantCalls)
			}
			if !slices.Equal(clock.pauses, tt.wantPauses) {
				t.Errorf("pauses = %v, want %v", clock.pauses, tt.wantPauses)
			}
			checkErr(t, err, tt.wantErr, tt.wantIs)
		})
	}
}

func checkErr(t *testing.T, err error, want string, is []error) {
	t.Helper()
	if want == "" {
		if err != nil {
			t.Fatalf("err = %v, want nil", err)
		}
		return
	}
	if err == nil || err.Error() != want {
		t.Fatalf("err = %v, want %q", err, want)
	}
	for _, target := range is {
		if !errors.Is(err, target) {
			t.Errorf("errors.Is(%v, %v) = false", err, target)
		}
	}
}

// When ctx ends, the error is the context's and the last error an attempt found before it:
// the attempt the cancellation cut short says less.
func TestUntilCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	calls := 0
	err := Until(ctx, Options{What: "the API server", Clock: &fakeClock{}}, func(ctx context.Context) (bool, error) {
		calls++
		if calls == 2 {
			cancel()
			return false, ctx.Err()
		}
		return false, errNotYet
	})
	checkErr(t, err, "waiting for the API server: not yet (context canceled)", []error{context.Canceled, errNotYet})
	if errors.Is(err, ErrTimeout) {
		t.Errorf("errors.Is(%v, ErrTimeout), want a cancellation only", err)
	}
	var pe *Error
	if !errors.As(err, &pe) || pe.Attempts != 2 {
		t.Errorf("err = %#v, want *Error with 2 attempts", err)
	}
}

// A pause ends as soon as ctx does.
func TestUntilCancelledInPause(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	calls := 0
	err := Until(ctx, Options{What: "x", Clock: &stuckClock{}, OnRetry: func(Attempt) { cancel() }},
		func(context.Context) (bool, error) { calls++; return false, nil })
	checkErr(t, err, "waiting for x: context canceled", []error{context.Canceled})
	if calls != 1 {
		t.Errorf("calls = %d, want 1", calls)
	}
}

func TestJitter(t *testing.T) {
	b := Backoff{Initial: 100 * time.Millisecond, Jitter: 0.5}
	seen := map[time.Duration]bool{}
	for range 1000 {
		p := b.jitter(b.first())
		if p < 50*time.Millisecond || p > 100*time.Millisecond {
			t.Fatalf("pause %v outside [50ms, 100ms]", p)
		}
		seen[p] = true
	}
	if len(seen) < 10 {
		t.Errorf("%d distinct pauses in 1000, want them spread", len(seen))
	}
	if p := (Backoff{Initial: time.Second, Jitter: 7}).jitter(time.Second); p < 0 || p > time.Second {
		t.Errorf("jitter above 1: pause %v outside [0, 1s]", p)
	}
}

func TestRetry(t *testing.T) {
	var seen []Attempt
	calls := 0
	o := Options{What: "x", Backoff: Backoff{Initial: time.Second, Factor: 2}, Clock: &fakeClock{},
		OnRetry: func(a Attempt) { seen = append(seen, a) }}
	err := Retry(context.Background(), o, func(context.Context) error {
		if calls++; calls < 3 {
			return errNotYet
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []Attempt{{1, errNotYet, time.Second}, {2, errNotYet, 2 * time.Second}}
	if !slices.Equal(seen, want) {
		t.Errorf("OnRetry saw %v, want %v", seen, want)
	}
}

// The wall clock works too; only ordering is checked, so a slow machine cannot fail this.
func TestWallClock(t *testing.T) {
	start := time.Now()
	err := Until(context.Background(), Options{What: "nothing", Timeout: 20 * time.Millisecond, Backoff: Constant(5 * time.Millisecond)},
		func(context.Context) (bool, error) { return false, nil })
	if !errors.Is(err, ErrTimeout) || !strings.HasPrefix(err.Error(), "waiting 20ms for nothing") {
		t.Fatalf("err = %v, want a timeout", err)
	}
	if el := time.Since(start); el < 20*time.Millisecond {
		t.Errorf("gave up after %v, before the 20ms timeout", el)
	}
}
