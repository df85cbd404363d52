package idem

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idem-go/idem/store"
)

// Readiness probe record: a scope no request can produce (every request
// scope starts with the tenant's length and a colon), read and never
// written.
const (
	readyScope = "idem-readiness"
	readyKey   = "probe"
)

// NotReady is the failure of Engine.Ready. Reason is a fixed sentence
// that names no host, port, user or database, fit for an unauthenticated
// caller of a readiness endpoint; Err carries the detail (which may name
// them) for the log.
type NotReady struct {
	Reason string
	Err    error
}

func (e *NotReady) Error() string {
	if e.Err == nil {
		return e.Reason
	}
	return e.Reason + ": " + e.Err.Error()
}

func (e *NotReady) Unwrap() error { return e.Err }

// Reasons of NotReady.
const (
	ReasonBreakerOpen   = "the store's circuit breaker is open"
	ReasonStoreFails    = "the store fails its operations"
	ReasonNotDurable    = "the store's durability is not confirmed (required by configuration)"
	ReasonStoreNotOpen  = "the store is not open yet"
	ReasonShuttingDown  = "shutting down"
	readyReasonFallback = "the store is unavailable"
)

// PublicReason returns the part of a readiness failure fit for an
// unauthenticated caller: NotReady's Reason, or a fixed sentence for any
// other error (whose text may name hosts, users or databases).
func PublicReason(err error) string {
	var nr *NotReady
	if errors.As(err, &nr) {
		return nr.Reason
	}
	return readyReasonFallback
}

// Ready reports whether the engine would serve a protected request now:
// it fails (with a *NotReady) while the store's circuit breaker is open,
// while the store cannot answer a read of a record (a real statement, not
// only a connection check: a dropped table, revoked rights or a read-only
// server answer a ping but fail every operation), and, with
// Config.RequireDurable, while the store's durability is not confirmed.
// A readiness endpoint calls it; its error's Reason (PublicReason) is safe
// to show to anyone, its detail belongs in the log. Like a request, it
// starts in the background the reading back of reservations whose answer
// the store lost, when one is due (see the HTTP contract's "Lost
// reservations").
func (e *Engine) Ready(ctx context.Context) error {
	now := e.clk.Now()
	e.lostTick(now)
	if b := e.breaker; b != nil {
		if wait, open := b.openFor(now); open {
			return &NotReady{Reason: ReasonBreakerOpen, Err: fmt.Errorf("%w for another %v", ErrBreakerOpen, wait.Round(time.Millisecond))}
		}
	}
	if err := e.refusesUndurable(); err != nil {
		return &NotReady{Reason: ReasonNotDurable, Err: err}
	}
	if ctx.Err() == nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, e.cfg.StoreTimeout)
		defer cancel()
	}
	_, err := e.store.Get(ctx, readyScope, readyKey)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return &NotReady{Reason: ReasonStoreFails, Err: err}
	}
	return nil
}

// refuses reports whether b, nil when the engine has no breaker, refuses
// calls at now.
func (b *breaker) refuses(now time.Time) bool {
	if b == nil {
		return false
	}
	_, open := b.openFor(now)
	return open
}

// openFor reports whether the breaker refuses calls at now, and for how
// much longer. Half-open is not refused here: its probe is let through.
func (b *breaker) openFor(now time.Time) (time.Duration, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state == breakerOpen && now.Before(b.openUntil) {
		return b.openUntil.Sub(now), true
	}
	return 0, false
}
