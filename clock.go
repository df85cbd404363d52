package idem

import (
	"context"
	"math/rand/v2"
	"time"
)

// clock is the engine's source of time: lease estimates, heartbeats, waits,
// retry pauses and store-call deadlines all read it, so tests can step time
// instead of sleeping. The store keeps its own clock for expiry decisions.
type clock interface {
	Now() time.Time
	// Until is t.Sub(Now()), which the wall clock reads from its
	// monotonic part alone when t has one (half the cost of Now).
	Until(t time.Time) time.Duration
	// AfterFunc calls f in its own goroutine once d has passed.
	AfterFunc(d time.Duration, f func()) timer
}

// timer is the part of *time.Timer the engine uses.
type timer interface {
	Stop() bool
	Reset(d time.Duration) bool
}

type wallClock struct{}

func (wallClock) Now() time.Time { return time.Now() }

func (wallClock) Until(t time.Time) time.Duration { return time.Until(t) }

func (wallClock) AfterFunc(d time.Duration, f func()) timer { return time.AfterFunc(d, f) }

// sleep pauses for d on c, or until ctx ends, whichever comes first.
func sleep(ctx context.Context, c clock, d time.Duration) error {
	ch := make(chan struct{})
	t := c.AfterFunc(d, func() { close(ch) })
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		t.Stop()
		return ctx.Err()
	}
}

// jitter returns a duration drawn uniformly from [d/2, d], so that many
// executions failing at once do not retry in lockstep.
func jitter(d time.Duration) time.Duration {
	if d <= 1 {
		return d
	}
	return d/2 + rand.N(d/2+1)
}
