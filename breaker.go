package idem

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// ErrBreakerOpen is the failure of a call refused by the store's circuit
// breaker: the store kept failing, so the engine answers 503 at once
// instead of making the call wait for it. It matches ErrStore too.
var ErrBreakerOpen = fmt.Errorf("%w: circuit breaker open", ErrStore)

// breakerError carries how long the breaker stays open.
type breakerError struct{ wait time.Duration }

func (e *breakerError) Error() string {
	return fmt.Sprintf("%v for another %v", ErrBreakerOpen, e.wait)
}

func (e *breakerError) Unwrap() error { return ErrBreakerOpen }

type breakerState int

const (
	breakerClosed breakerState = iota
	breakerOpen
	breakerHalfOpen
)

// breaker is the store's circuit breaker, shared by every engine derived
// from one New. After threshold store failures in a row it opens: the
// calls that start a request (reserve, and the reads before it) fail at
// once for an interval. Then it lets one call through as a probe
// (half-open) while the others still fail at once: a probe that succeeds
// closes it, one that fails opens it again for twice the interval, up to
// maxOpen. Only those calls count and are refused: the calls of
// executions already running (completion, lease renewal) retry on their
// own schedule and are never refused, so that a request that ran gets its
// outcome recorded as soon as the store answers again.
type breaker struct {
	threshold     int
	base, maxOpen time.Duration
	timeout       time.Duration // the store timeout, which bounds a probe
	log           *slog.Logger
	obs           Observer

	// healthy is state == breakerClosed && failures == 0, kept under mu
	// and read without it: on a healthy store, allow and done take no lock.
	healthy atomic.Bool

	mu        sync.Mutex
	state     breakerState
	failures  int
	interval  time.Duration
	openUntil time.Time
	probing   bool
	probeAt   time.Time // when the probe under way started
	// closedAt is when the probe that last closed the breaker started. A
	// call that started earlier met the store before it came back: its
	// late failure must not open the breaker again.
	closedAt time.Time
}

func newBreaker(s *settings, obs Observer) *breaker {
	if s.BreakerFailures < 0 {
		return nil
	}
	b := &breaker{threshold: s.BreakerFailures, base: s.BreakerOpen, maxOpen: s.BreakerMaxOpen, timeout: s.StoreTimeout,
		log: s.Logger, obs: obs}
	b.healthy.Store(true)
	return b
}

// mark brings healthy up to date; under mu.
func (b *breaker) mark() { b.healthy.Store(b.state == breakerClosed && b.failures == 0) }

// allow decides whether a call that starts a request may go to the store
// at now. probe reports that it is the one call testing the store's
// recovery; without leave, wait is how long the breaker stays open.
func (b *breaker) allow(now time.Time) (probe bool, wait time.Duration, ok bool) {
	if b.healthy.Load() {
		return false, 0, true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	defer b.mark()
	switch b.state {
	case breakerClosed:
		return false, 0, true
	case breakerOpen:
		if now.Before(b.openUntil) {
			return false, b.openUntil.Sub(now), false
		}
		b.state = breakerHalfOpen
	}
	if b.probing && now.Before(b.probeAt.Add(b.timeout)) {
		// Half-open with a probe in flight: the next one comes after it.
		// One that outlived its store timeout will never report (its call
		// panicked, or the store ignored the deadline): another replaces it.
		return false, b.base, false
	}
	b.probing, b.probeAt = true, now
	return true, 0, true
}

// result is how a store call ended, for the breaker.
type result int

const (
	resultOK result = iota
	resultFailed
	// resultNone: the caller left or the call was never made; says nothing
	// about the store.
	resultNone
)

// done reports how a call that started at start ended at now (zero unless
// it failed); probe as allow returned it.
func (b *breaker) done(ctx context.Context, start, now time.Time, probe bool, r result) {
	if !probe && (r == resultNone || r == resultOK && b.healthy.Load()) {
		return // nothing would change
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	defer b.mark()
	if probe && !start.Equal(b.probeAt) {
		probe = false // replaced (see allow): the probe under way decides
	}
	if probe {
		b.probing = false
	} else if start.Before(b.closedAt) {
		return
	}
	switch {
	case r == resultNone:
		return
	case r == resultOK:
		b.failures = 0
		if probe && b.state != breakerClosed {
			b.state, b.interval, b.closedAt = breakerClosed, 0, start
			b.log.Info("idem: store circuit breaker closed; the store answers again")
			b.obs.Event(ctx, "breaker_closed", 1)
		}
		return
	}
	b.failures++
	switch {
	case probe && b.state == breakerHalfOpen:
		b.open(ctx, now, min(2*b.interval, b.maxOpen))
	case b.state == breakerClosed && b.failures >= b.threshold:
		b.open(ctx, now, b.base)
	}
}

func (b *breaker) open(ctx context.Context, now time.Time, d time.Duration) {
	b.state, b.interval, b.openUntil = breakerOpen, d, now.Add(d)
	b.log.Error("idem: store circuit breaker opened; requests get 503 without waiting for the store",
		"failures", b.failures, "for", d)
	b.obs.Event(ctx, "breaker_opened", 1)
}

// gated reports whether op starts a request: the calls the breaker refuses.
func gated(op storeOp) bool { return op == opReserve || op == opGet || op == opCountActive }

// breakerWait returns how long the breaker stays open when err is its
// refusal.
func breakerWait(err error) (time.Duration, bool) {
	if err == nil {
		return 0, false // without the allocation errors.As's target costs
	}
	var be *breakerError
	if errors.As(err, &be) {
		return be.wait, true
	}
	return 0, false
}
