package idem

import (
	"context"
	"errors"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem/store"
)

// Reservations whose answer was lost.
//
// A Reserve that failed may have been applied all the same (see
// lostReserve). The engine reads the record back at once when the store failed promptly
// or the client left. When it cannot (the read fails too: the store is
// away, a failover), or should not (the Reserve took the whole store
// timeout, and a second call would double the client's wait), the
// reservation is remembered here and read back later, in the background
// of the engine's own work: a request that reaches begin, or a readiness
// check, starts a sweep once one is due. An idle engine does no work, and
// needs no Close. A retry of a remembered key settles it first, before its
// own Reserve, so that it runs the request instead of finding it in
// progress.
//
// The engine keeps at most lostMax reservations, each for at most lostAge:
// past that, the record is left to its lease, its policy and the
// reconciler, as a reservation of a process that stopped is.

const (
	// lostMax bounds the reservations remembered. While the store is
	// away, every Reserve the breaker lets through fails; most of them
	// were not applied, and each costs a read once it is back.
	lostMax = 4096
	// lostAge bounds how long one is remembered: longer than the
	// outages a failover makes, shorter than a key's retention.
	lostAge = time.Hour
	// lostRetryMin and lostRetryMax bound the wait between sweeps that
	// could not reach the store: it doubles from one to the other.
	lostRetryMin = 250 * time.Millisecond
	lostRetryMax = 10 * time.Second
)

type lostKey struct{ scope, key string }

// lostEntry is what the engine remembers of a key's lost reservations.
// A retry of the key while the store is away fails too, and may have
// reserved the key just as well: each Reserve's owner is kept, the
// latest lostOwners.
type lostEntry struct {
	owners []int64
	since  time.Time // when the first Reserve failed
	after  time.Time // no read before: a Reserve that timed out may still be under way
}

const lostOwners = 8

// add adds owners, keeping the latest lostOwners, and pushes after back
// to after when it is later.
func (ent *lostEntry) add(after time.Time, owners ...int64) {
	ent.owners = append(ent.owners, owners...)
	ent.owners = ent.owners[max(0, len(ent.owners)-lostOwners):]
	ent.after = later(ent.after, after)
}

// lostReservations is shared by every engine derived from one New (they
// share the store).
type lostReservations struct {
	n       atomic.Int64 // len(m), read without the lock
	due     atomic.Int64 // unix nanoseconds of the next sweep; MaxInt64: none
	running atomic.Bool
	sweeps  sync.WaitGroup

	mu      sync.Mutex
	m       map[lostKey]lostEntry
	retry   time.Duration // the wait after a sweep the store failed
	dropped bool          // an entry was dropped at lostMax since the list last emptied
}

func newLostReservations() *lostReservations {
	l := &lostReservations{m: map[lostKey]lostEntry{}}
	l.due.Store(math.MaxInt64)
	return l
}

// LostReservations reports how many reservations whose answer the store
// lost the engine remembers, to be read back and given back once the store
// answers (see the HTTP contract's "Lost reservations"). Engines derived
// by With share them. During an outage it grows with the reservations
// that may have been made; once the store is back it falls to 0 as they
// are read back.
func (e *Engine) LostReservations() int { return int(e.lost.n.Load()) }

// reservationLost is the LastError of a record whose reservation's answer
// was lost, released by the engine that made it.
const reservationLost = "reservation_unacknowledged"

// lostReserve runs after p's Reserve, called at start, failed with err.
// A store failure (ErrStore: callAt leaves the store's answers, a refusal
// at the tenant cap say, unwrapped) may have been applied all the same: a
// store can lose the answer of a write it applied (the connection lost
// during the commit, the request cancelled while the commit was under
// way, a synchronous standby's confirmation cancelled). Such a record
// would stay in_progress under a lease nobody renews, and under the
// default lease policy become unknown, sent to reconciliation although no
// handler ran; the client's retries would get 409 meanwhile. The breaker's
// refusal called no store.
//
// When the store failed promptly or the client left (nobody waits for the
// answer), the record is read back at once (settleLost), so that the
// client's next retry runs the request. A read that fails too, and a
// Reserve that took the whole store timeout (a store that slow would
// double the client's wait for its 503, and its statement may still be
// under way), leave the reservation to be read back later. So does a read
// that finds no record, once more a store timeout later: a statement whose
// connection was cut can still commit after the read (a server notices a
// lost client only when it answers).
func (e *Engine) lostReserve(ctx context.Context, p *store.ReserveParams, err error, start time.Time) {
	if !errors.Is(err, ErrStore) || errors.Is(err, ErrBreakerOpen) {
		return
	}
	now := e.clk.Now()
	if ctx.Err() == nil && now.Sub(start) >= e.cfg.StoreTimeout {
		e.remember(p, now, now.Add(e.cfg.StoreTimeout))
		return
	}
	switch e.settleLost(ctx, p.Scope, p.Key, []int64{p.Owner}) {
	case lostFailed:
		e.remember(p, now, now)
	case lostAbsent:
		e.remember(p, now, now.Add(e.cfg.StoreTimeout))
	}
}

// remember adds the reservation p's Reserve may have made, to be read
// back no earlier than after: by a retry of its key, or by a sweep, at
// least lostRetryMin from now.
func (e *Engine) remember(p *store.ReserveParams, now, after time.Time) {
	l := e.lost
	l.mu.Lock()
	defer l.mu.Unlock()
	k := lostKey{p.Scope, p.Key}
	ent, ok := l.m[k]
	if !ok && len(l.m) >= lostMax {
		if !l.dropped {
			l.dropped = true
			e.log.Warn("idem: too many reservations whose answer was lost are waiting to be read back; this one is left to its lease",
				"scope", p.Scope, "key", p.Key, "max", lostMax)
		}
		return
	}
	if !ok {
		ent.since = now
	}
	ent.add(after, p.Owner)
	l.m[k] = ent
	l.n.Store(int64(len(l.m)))
	// The store just failed: the sweep waits a little, a retry of the
	// key does not.
	l.schedule(later(after, now.Add(lostRetryMin)))
	e.log.Debug("idem: a reservation whose answer may have been lost will be read back",
		"scope", p.Scope, "key", p.Key, "after", after)
}

// schedule makes the next sweep due at t at the latest. l.mu is held.
func (l *lostReservations) schedule(t time.Time) {
	if t.UnixNano() < l.due.Load() {
		l.due.Store(t.UnixNano())
	}
}

// lostBefore runs before key's Reserve: a remembered reservation of key
// is settled first (the client's retry), unless the breaker is open (the
// Reserve will be refused at once, and a read of a store that hangs
// would hold the client for a store timeout), and a sweep of the others
// starts when one is due. Without remembered reservations it costs one
// atomic load.
func (e *Engine) lostBefore(ctx context.Context, scope, key string) {
	l := e.lost
	if l.n.Load() == 0 {
		return
	}
	now := e.clk.Now()
	k := lostKey{scope, key}
	l.mu.Lock()
	ent, ok := l.m[k]
	if ok && !now.Before(ent.after) && !e.breaker.refuses(now) {
		l.forget(k)
	} else {
		ok = false
	}
	l.mu.Unlock()
	if ok && e.settleLost(ctx, scope, key, ent.owners) == lostFailed {
		l.mu.Lock()
		l.putBack(k, ent)
		l.schedule(now.Add(max(l.retry, lostRetryMin)))
		l.mu.Unlock()
	}
	e.lostTick(now)
}

// lostTick starts a sweep in the background when one is due.
func (e *Engine) lostTick(now time.Time) {
	l := e.lost
	if now.UnixNano() < l.due.Load() || !l.running.CompareAndSwap(false, true) {
		return
	}
	l.sweeps.Go(func() {
		defer l.running.Store(false)
		e.sweepLost()
	})
}

// sweepLost reads back every remembered reservation that is due, until
// the store fails: the rest wait for the next sweep, which is due after a
// wait that doubles while the store keeps failing.
func (e *Engine) sweepLost() {
	l := e.lost
	now := e.clk.Now()
	l.mu.Lock()
	l.due.Store(math.MaxInt64)
	var due []lostKey
	for k, ent := range l.m {
		switch {
		case now.Sub(ent.since) > lostAge:
			e.log.Warn("idem: gave up reading back a reservation whose answer was lost; it is left to its lease",
				"scope", k.scope, "key", k.key, "since", ent.since)
			l.forget(k)
		case now.Before(ent.after):
			l.schedule(ent.after)
		default:
			due = append(due, k)
		}
	}
	l.mu.Unlock()
	type kept struct {
		k   lostKey
		ent lostEntry
	}
	var back []kept
	for _, k := range due {
		l.mu.Lock()
		ent, ok := l.m[k]
		if ok {
			l.forget(k)
		}
		l.mu.Unlock()
		if !ok {
			continue // a retry of the key settled it meanwhile
		}
		if len(back) > 0 || e.settleLost(context.Background(), k.scope, k.key, ent.owners) == lostFailed {
			back = append(back, kept{k, ent})
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(back) == 0 {
		l.retry = 0
		return
	}
	l.retry = min(max(2*l.retry, lostRetryMin), lostRetryMax)
	for _, b := range back {
		l.putBack(b.k, b.ent)
	}
	l.schedule(now.Add(l.retry))
}

// putBack remembers again the reservations of a key whose read-back
// failed, with those of the key remembered meanwhile. l.mu is held.
func (l *lostReservations) putBack(k lostKey, ent lostEntry) {
	if newer, ok := l.m[k]; ok {
		ent.add(newer.after, newer.owners...)
	}
	l.m[k] = ent
	l.n.Store(int64(len(l.m)))
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// forget removes k. l.mu is held.
func (l *lostReservations) forget(k lostKey) {
	delete(l.m, k)
	l.n.Store(int64(len(l.m)))
	if len(l.m) == 0 {
		l.dropped = false
	}
}

// lostRead is what a read-back found.
type lostRead int

const (
	lostSettled lostRead = iota // given back, another execution's, or ended otherwise: nothing left to do
	lostAbsent                  // no record: the reservation was not made (or not yet)
	lostFailed                  // the store failed: read again later
)

// settleLost reads back the record of a reservation whose answer was
// lost, and gives it back when the store made it: in progress under one
// of owners (its lease not yet lapsed), it is released; unknown under one
// (the lease lapsed under the unknown policy), it is resolved to
// failed_retryable. No handler ran under those owners: the engine never
// learnt it held the key. Its store calls are detached.
func (e *Engine) settleLost(ctx context.Context, scope, key string, owners []int64) lostRead {
	var r store.Record
	err := e.call(ctx, opGet, true, func(ctx context.Context) (err error) {
		r, err = e.store.Get(ctx, scope, key)
		return err
	})
	switch {
	case errors.Is(err, store.ErrNotFound):
		return lostAbsent
	case err != nil:
		return lostFailed
	case !slices.Contains(owners, r.Owner) || (r.State != store.StateInProgress && r.State != store.StateUnknown):
		return lostSettled
	}
	fp := store.FenceParams{Scope: scope, Key: key, Fence: r.Fence}
	how := "released"
	if r.State == store.StateInProgress {
		err = e.call(ctx, opRelease, true, func(ctx context.Context) error {
			return e.store.Release(ctx, store.ReleaseParams{FenceParams: fp, Error: reservationLost})
		})
	} else {
		how = "resolved to failed_retryable"
		err = e.call(ctx, opResolve, true, func(ctx context.Context) error {
			return e.store.Resolve(ctx, store.ResolveParams{FenceParams: fp, To: store.StateFailedRetryable})
		})
	}
	if err != nil {
		// A definite answer means the record moved meanwhile (its lease
		// lapsed, another request took it): the next read tells.
		e.log.Warn("idem: a reservation whose answer was lost could not be given back yet",
			"scope", scope, "key", key, "fence", r.Fence, "err", err)
		return lostFailed
	}
	e.log.Info("idem: a reservation whose answer was lost was "+how, "scope", scope, "key", key, "fence", r.Fence)
	e.obs.Event(ctx, "reservation_released", 1)
	return lostSettled
}
