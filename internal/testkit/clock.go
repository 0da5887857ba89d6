package testkit

import (
	"sync"
	"time"
)

// InstantClock is a clock (internal/poll's Clock) whose pauses pass at once; it records each
// pause asked for, so a test can check the backoff without sleeping. Its time is the Unix epoch.
type InstantClock struct {
	mu     sync.Mutex
	pauses []time.Duration
}

// Now is the Unix epoch.
func (c *InstantClock) Now() time.Time { return time.Unix(0, 0) }

// After records d and returns a channel that is ready at once.
func (c *InstantClock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	c.pauses = append(c.pauses, d)
	c.mu.Unlock()
	ch := make(chan time.Time, 1)
	ch <- time.Unix(0, 0)
	return ch
}

// Pauses are the pauses asked for so far, in order.
func (c *InstantClock) Pauses() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Duration(nil), c.pauses...)
}
