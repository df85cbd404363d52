// Package storetest is the one conformance suite every idem store runs.
//
// A store's test calls Run with a Harness:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, storetest.Harness{
//			NewDatabase: func(t *testing.T) storetest.Opener { ... },
//			Durable:     true,
//		})
//	}
//
// A change to the store contract extends this suite first.
package storetest

import (
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem/store"
)

// Opener opens a handle on one database. Every call opens a new, independent
// handle (its own connections, as another process would have); handles are
// closed by the suite or by t.Cleanup. clock nil means the store's own clock.
type Opener func(t *testing.T, clock store.Clock) store.Store

// Harness tells the suite how to get stores.
type Harness struct {
	// NewDatabase creates a fresh, empty database (a new schema, a new file,
	// a new Redis key prefix ...) and returns how to open handles on it. It
	// registers its own cleanup on t.
	NewDatabase func(t *testing.T) Opener
	// Durable is true when a record completed through one handle is seen by
	// a handle opened after the first was closed (a process restart). The
	// memory store is not durable.
	Durable bool
	// Shared is true when two handles opened on one database see each
	// other's records at once (two processes on one database).
	Shared bool
	// NoTenantCap is true for a store that implements store.CapRefuser:
	// the suite then checks that a capped Reserve fails with
	// store.ErrCapUnsupported and changes nothing.
	NoTenantCap bool
	// NoActiveCount is true for a store that does not implement
	// store.ActiveCounter, or refuses to count through
	// store.ActiveCountRefuser (the suite checks that it does not count).
	NoActiveCount bool
	// ReapWidth, when positive, is the span of time a store's Reap
	// retires at once (postgres.Config.Partitions): a record past its
	// expiry is deleted or abandoned once every instant of its span has
	// passed, and Reap's Limit does not bound the records of a retired
	// span. The reap tests then move the clock that much further before
	// a Reap that must act.
	ReapWidth time.Duration
}

// Clock is a manual clock for tests. Times are truncated to microseconds,
// the finest precision every store keeps.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock returns a clock set to a fixed instant.
func NewClock() *Clock {
	return &Clock{now: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)}
}

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d).Truncate(time.Microsecond)
	c.mu.Unlock()
}

// Run runs the conformance suite.
func Run(t *testing.T, h Harness) {
	t.Helper()
	run(t, h)
}
