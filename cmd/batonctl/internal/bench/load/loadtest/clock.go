// Package loadtest holds a virtual clock for the tests of code that takes a
// load.Clock, so that timings are exact and tests do not sleep.
package loadtest

import (
	"context"
	"sync"
	"time"
)

// Clock is virtual time that only Sleep and Advance move; it satisfies
// load.Clock. It is safe for concurrent use.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock returns a clock reading start.
func NewClock(start time.Time) *Clock { return &Clock{now: start} }

// Now reads the clock.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// Sleep advances the clock by d at once and returns ctx's error, if any.
func (c *Clock) Sleep(ctx context.Context, d time.Duration) error {
	if d > 0 {
		c.Advance(d)
	}
	return ctx.Err()
}
