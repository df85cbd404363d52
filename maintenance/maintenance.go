// Package maintenance runs the background services of an idempotency
// store: the sweeper moves records whose holder died to unknown, the reaper
// deletes expired records and closes abandoned ones, the reconciler asks
// the application's Resolver what became of unknown outcomes, and on a
// store that keeps asynchronous requests, pending requests no worker
// claimed in time end with a stored timeout answer.
//
// Run them in every instance of a service: several maintainers may work on
// one store at once, as every step is atomic per record. Settle is the one
// path by which an unknown outcome is resolved, whether by the reconciler,
// a webhook from a provider, or an operator.
package maintenance

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"runtime/debug"
	"sync"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/httpfield"
	"github.com/idem-go/idem/internal/plural"
	"github.com/idem-go/idem/store"
)

// Resolver is implemented by the application to settle requests whose
// outcome is unknown: it asks the outside world (the payment provider, by
// the key or the fence it was given) what happened.
type Resolver interface {
	Resolve(ctx context.Context, rec store.Record) (Resolution, error)
}

// ResolverFunc adapts a function to Resolver.
type ResolverFunc func(ctx context.Context, rec store.Record) (Resolution, error)

// Resolve implements Resolver.
func (f ResolverFunc) Resolve(ctx context.Context, rec store.Record) (Resolution, error) {
	return f(ctx, rec)
}

// Outcome is the verdict of a Resolution.
type Outcome int

const (
	// StillUnknown: the outside world cannot tell yet; ask again later.
	StillUnknown Outcome = iota
	// Happened: the operation took effect; Response is what retries get.
	Happened
	// DidNotHappen: the operation certainly had no effect; the key is
	// released and the next retry runs it.
	DidNotHappen
	// RunAgain: the operation may have had part of its effect, but running
	// it again is safe (its foreign calls carry the key, and its committed
	// phases are kept): the key is released like DidNotHappen, and the next
	// retry of a request of atomic phases resumes after its recovery point.
	RunAgain
)

var outcomeNames = [...]string{"still_unknown", "happened", "did_not_happen", "run_again"}

// String returns the outcome's name, or Outcome(n) for a value that is
// none of them.
func (o Outcome) String() string {
	if o >= 0 && int(o) < len(outcomeNames) {
		return outcomeNames[o]
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// Resolution is a Resolver's answer, or a settlement given to Settle.
type Resolution struct {
	Outcome  Outcome
	Response *store.Response // required when Outcome is Happened
}

// Service is a background worker with a lifecycle, as outbox.Outbox has.
type Service interface {
	Start(ctx context.Context) error
	Stop(ctx context.Context) error
}

// Maintainer runs the background services over a store. Start runs them
// on their intervals; SweepOnce, ReapOnce and ReconcileOnce run one pass
// now (for a cron job, an operator, or a test).
type Maintainer struct {
	store store.Store
	cfg   Config
	obs   *observer
	// randN draws in [0, n); tests replace it to pin the jitter's bounds.
	randN func(n int64) int64

	mu     sync.Mutex
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// New returns the background services over s. It fails on a Config that
// no default can mend, such as a negative interval.
func New(s store.Store, cfg Config) (*Maintainer, error) {
	if s == nil {
		return nil, errors.New("maintenance: a store is required")
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Maintainer{store: s, cfg: cfg, obs: newObserver(cfg.Observer), randN: rand.Int64N}, nil
}

// Start runs the services in the background until ctx ends or Stop. Each
// service waits a random part of its interval before its first pass, so
// that the instances of a fleet started together spread their passes.
// Start fails if one of Config.Services fails to start (those already
// started are stopped again). Starting a running Maintainer does nothing.
func (m *Maintainer) Start(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cancel != nil {
		return nil
	}
	for i, s := range m.cfg.Services {
		if err := s.Start(ctx); err != nil {
			for _, started := range m.cfg.Services[:i] {
				started.Stop(context.WithoutCancel(ctx))
			}
			return fmt.Errorf("maintenance: starting a background service: %w", err)
		}
	}
	ctx, m.cancel = context.WithCancel(ctx)
	m.loop(ctx, "sweep", m.cfg.SweepInterval, func(ctx context.Context) error {
		_, err := m.SweepOnce(ctx)
		// The sweeper also ends the asynchronous requests no worker
		// claimed in time (nothing on a store without them).
		_, perr := m.ExpirePendingOnce(ctx)
		return errors.Join(err, perr)
	})
	m.loop(ctx, "reap", m.cfg.ReapInterval, func(ctx context.Context) error {
		_, err := m.ReapOnce(ctx)
		return err
	})
	if m.cfg.Resolver != nil {
		m.loop(ctx, "reconcile", m.cfg.ReconcileInterval, func(ctx context.Context) error {
			_, err := m.ReconcileOnce(ctx)
			return err
		})
	}
	return nil
}

// Stop ends the services, waits for the running passes, and stops
// Config.Services (within ctx), returning their errors.
func (m *Maintainer) Stop(ctx context.Context) error {
	m.mu.Lock()
	cancel := m.cancel
	m.cancel = nil
	m.mu.Unlock()
	if cancel == nil {
		return nil
	}
	cancel()
	m.wg.Wait()
	var errs []error
	for _, s := range m.cfg.Services {
		errs = append(errs, s.Stop(ctx))
	}
	return errors.Join(errs...)
}

func (m *Maintainer) loop(ctx context.Context, name string, every time.Duration, pass func(context.Context) error) {
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		for wait := m.jitter(0, every); m.sleep(ctx, wait) == nil; wait = every {
			if err := pass(ctx); err != nil && ctx.Err() == nil {
				m.cfg.Logger.Error("idem: background pass failed", "service", name, "err", err)
			}
		}
	}()
}

// jitter returns a random duration in [lo, hi), or lo when the range is
// empty.
func (m *Maintainer) jitter(lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(m.randN(int64(hi-lo)))
}

// sleep waits d on the Maintainer's clock, or until ctx ends.
func (m *Maintainer) sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-m.cfg.Clock.After(d):
		return nil
	}
}

// pass runs batch after batch, each under BatchTimeout and with a pause
// between two, until a batch reports that it was the last.
func (m *Maintainer) pass(ctx context.Context, batch func(ctx context.Context) (more bool, err error)) error {
	for {
		bctx, cancel := context.WithTimeout(ctx, m.cfg.BatchTimeout)
		more, err := batch(bctx)
		cancel()
		if err != nil || !more {
			return err
		}
		if err := m.sleep(ctx, m.jitter(m.cfg.BatchPause/2, m.cfg.BatchPause)); err != nil {
			return err
		}
	}
}

// call runs one store operation under StoreTimeout, measuring it and
// wrapping its failure in idem.ErrStore. Lease and state conflicts are
// answers about the record, not failures, and pass through unwrapped.
func (m *Maintainer) call(ctx context.Context, o op, f func(context.Context) error) error {
	start := m.cfg.Clock.Now()
	cctx, cancel := context.WithTimeout(ctx, m.cfg.StoreTimeout)
	err := f(cctx)
	cancel()
	// A definite answer about the record or the call (invalid parameters
	// included: a resolver's verdict the store refuses) is not the store
	// failing, and must not stop a pass.
	answer := errors.Is(err, store.ErrLeaseLost) || errors.Is(err, store.ErrNotFound) ||
		errors.Is(err, store.ErrStateConflict) || errors.Is(err, store.ErrInvalidParams)
	m.obs.storeOp(ctx, o, m.cfg.Clock.Now().Sub(start), err != nil && !answer)
	if err == nil || answer {
		return err
	}
	return fmt.Errorf("%w: %s: %w", idem.ErrStore, o, err)
}

// SweepOnce moves in_progress records whose lease expired (under policy
// unknown) to unknown, batch after batch until none is left, and returns
// how many it moved. Records under retry or resume wait for their retry.
func (m *Maintainer) SweepOnce(ctx context.Context) (int, error) {
	total := 0
	err := m.pass(ctx, func(ctx context.Context) (bool, error) {
		var recs []store.Record
		err := m.call(ctx, opSweep, func(ctx context.Context) (err error) {
			recs, err = m.store.SweepExpiredLeases(ctx, store.SweepParams{Limit: m.cfg.BatchSize, Grace: m.cfg.SweepGrace})
			return err
		})
		// Records moved before a failure come with it (a cluster's masters).
		for _, r := range recs {
			m.cfg.Logger.Warn("idem: zombie lease swept; outcome unknown until reconciled",
				"scope", r.Scope, "key", r.Key, "fence", r.Fence, "locked_until", r.LockedUntil)
		}
		total += len(recs)
		m.obs.count(ctx, "zombies_swept", len(recs))
		m.obs.count(ctx, "reconcile_scheduled", len(recs))
		return err == nil && len(recs) == m.cfg.BatchSize, err
	})
	return total, err
}

// abandonedResponse is what a client still retrying an abandoned request
// gets: a definite timeout instead of a key that vanished.
var abandonedResponse = store.Response{
	Status: http.StatusGatewayTimeout,
	Header: http.Header{"Content-Type": {"application/problem+json"}},
	Body:   []byte(`{"type":"` + idem.ProblemBase + `abandoned","title":"The request was abandoned before its outcome was recorded","status":504}`),
}

// ReapOnce deletes (or soft-expires) terminal records past their expiry
// and turns abandoned ones into a stored timeout, batch after batch.
func (m *Maintainer) ReapOnce(ctx context.Context) (store.ReapResult, error) {
	var total store.ReapResult
	err := m.pass(ctx, func(ctx context.Context) (bool, error) {
		var res store.ReapResult
		err := m.call(ctx, opReap, func(ctx context.Context) (err error) {
			res, err = m.store.Reap(ctx, store.ReapParams{
				Limit: m.cfg.BatchSize, Soft: m.cfg.SoftExpire,
				Abandoned: abandonedResponse, AbandonedTTL: m.cfg.AbandonedTTL, Grace: m.cfg.SweepGrace,
			})
			return err
		})
		total.Deleted += res.Deleted // with a failure, what was done before it
		total.Abandoned += res.Abandoned
		m.obs.count(ctx, "ttl_pruned", res.Deleted)
		m.obs.count(ctx, "abandoned", res.Abandoned)
		if res.Abandoned > 0 {
			m.cfg.Logger.Warn("idem: abandoned records closed with a timeout answer", "count", res.Abandoned)
		}
		return err == nil && res.Deleted+res.Abandoned >= m.cfg.BatchSize, err
	})
	return total, err
}

// ReconcileResult counts one reconciliation pass.
type ReconcileResult struct {
	Resolved     int // settled as happened or not
	Deferred     int // still unknown, asked again later
	DeadLettered int // given up on: an operator must resolve them
}

// ReconcileOnce asks the Resolver about every unknown record that is due,
// batch after batch. A record asked about is settled or rescheduled, so it
// is not due again within the pass.
//
// A record that is not settled is asked again after ReconcileBackoff,
// doubled at each further attempt up to ReconcileMaxBackoff; at its
// MaxReconcileAttempts-th attempt it is dead-lettered instead: no pass asks
// about it again, and only Settle resolves it. Maintainers that ask about
// one record at once count one attempt, and an attempt about a record
// that ran again since it was listed counts for nothing. An attempt the
// store refuses to record (another maintainer, a webhook or an operator
// recorded one first, or the record ran again) is reported to the
// Observer as reconcile_raced, never as reconcile_failed, whatever the
// Resolver answered.
//
// A Resolver that panics, or has not answered when the batch has only
// StoreTimeout left (half the batch at most), has failed that attempt:
// the reconciler records it and goes on without waiting for it any longer.
// A record asked about after the records before it took the batch's time
// is asked again first in the next batch, not charged an attempt.
func (m *Maintainer) ReconcileOnce(ctx context.Context) (ReconcileResult, error) {
	var total ReconcileResult
	if m.cfg.Resolver == nil {
		return total, errors.New("maintenance: reconciliation needs a Resolver")
	}
	err := m.pass(ctx, func(ctx context.Context) (bool, error) {
		return m.reconcileBatch(ctx, &total)
	})
	return total, err
}

// reconcileBatch handles one batch, adds it to out, and reports whether
// due records may be left for another batch.
func (m *Maintainer) reconcileBatch(ctx context.Context, out *ReconcileResult) (more bool, err error) {
	var recs []store.Record
	err = m.call(ctx, opListUnknown, func(ctx context.Context) (err error) {
		recs, err = m.store.ListUnknown(ctx, store.ListUnknownParams{DueOnly: true, Limit: m.cfg.BatchSize})
		return err
	})
	if err != nil {
		return false, err
	}
	for i, r := range recs {
		res, late, rerr := m.resolve(ctx, r)
		if err := ctx.Err(); err != nil {
			return false, err // stopped: nothing is recorded about r
		}
		if late && i > 0 {
			// Asked with what the records before it left of the batch:
			// not a fair attempt. The next batch asks it first, with
			// the whole batch's time.
			return true, nil
		}
		if rerr == nil && res.Outcome != StillUnknown {
			err := m.Settle(ctx, r.Scope, r.Key, r.Fence, res)
			switch {
			case err == nil:
				out.Resolved++
				continue
			case raced(err):
				m.obs.count(ctx, "reconcile_raced", 1)
				continue // settled by someone else, or run again, meanwhile
			case errors.Is(err, idem.ErrStore):
				return false, err
			}
			rerr = err
		}
		why := "resolver could not tell yet"
		if rerr != nil {
			why = store.ErrorText(rerr.Error())
		}
		// The attempt is about r as listed. The store refuses it, changing
		// nothing, when another maintainer deferred or settled r
		// meanwhile, or r ran again under a new fence: someone else
		// handled it, so it counts as raced (a resolver's failure
		// included: the attempt that stands is the other's), is not
		// logged here, and the pass goes on.
		p := store.DeferParams{FenceParams: store.FenceParams{Scope: r.Scope, Key: r.Key, Fence: r.Fence},
			Attempts: r.ReconcileAttempts, Error: why}
		attempt := r.ReconcileAttempts + 1
		if attempt >= m.cfg.MaxReconcileAttempts {
			p.Error = store.ErrorText("dead-lettered after " + plural.Count(attempt, "attempt", "attempts") + ": " + why)
			err = m.deadLetter(ctx, p)
			if err == nil {
				out.DeadLettered++
				m.obs.count(ctx, "reconcile_dead", 1)
				m.cfg.Logger.Error("idem: unknown outcome dead-lettered; an operator must resolve it",
					"scope", r.Scope, "key", r.Key, "fence", r.Fence, "reason", p.Error)
			}
		} else {
			p.Delay = m.backoff(r.ReconcileAttempts)
			err = m.call(ctx, opDefer, func(ctx context.Context) error { return m.store.Defer(ctx, p) })
			if err == nil {
				out.Deferred++
			}
		}
		if raced(err) {
			m.obs.count(ctx, "reconcile_raced", 1)
			continue
		}
		if rerr != nil {
			m.obs.count(ctx, "reconcile_failed", 1)
		}
		if errors.Is(err, idem.ErrStore) {
			return false, err
		}
	}
	return len(recs) == m.cfg.BatchSize, nil
}

// resolve asks the Resolver about r. The Resolver's time ends before the
// batch's, leaving it the time to record the attempt: an attempt that is
// never recorded is never counted, so a record whose provider never
// answers would never be dead-lettered, and, due first at every pass, it
// would take every batch's time from the records after it. For the same
// reason resolve stops waiting at that deadline for a Resolver that
// ignores its context (its answer, should one come, is dropped). A panic
// is that attempt's error: a malformed answer about one record must not
// bring down every instance that reconciles, again at every pass. late
// reports that the Resolver's time ran out without a verdict.
func (m *Maintainer) resolve(ctx context.Context, r store.Record) (res Resolution, late bool, err error) {
	rctx, cancel := context.WithCancel(ctx)
	if d, ok := ctx.Deadline(); ok {
		cancel()
		rctx, cancel = context.WithDeadline(ctx, d.Add(-min(m.cfg.StoreTimeout, m.cfg.BatchTimeout/2)))
	}
	// Also ends the context of a Resolver left running past its time.
	defer cancel()
	if err := rctx.Err(); err != nil {
		return Resolution{}, true, err
	}
	type verdict struct {
		res Resolution
		err error
	}
	done := make(chan verdict, 1)
	go func() {
		var v verdict
		defer func() {
			if p := recover(); p != nil {
				m.cfg.Logger.Error("idem: resolver panicked; counted as a failed attempt",
					"scope", r.Scope, "key", r.Key, "fence", r.Fence, "panic", p, "stack", string(debug.Stack()))
				v = verdict{err: fmt.Errorf("resolver panicked: %v", p)}
			}
			done <- v
		}()
		v.res, v.err = m.cfg.Resolver.Resolve(rctx, r)
	}()
	var v verdict
	select {
	case v = <-done:
	case <-rctx.Done():
		select {
		case v = <-done: // answered as its time ran out
		default:
			return Resolution{}, true, fmt.Errorf("resolver did not answer in time: %w", rctx.Err())
		}
	}
	return v.res, v.err != nil && rctx.Err() != nil, v.err
}

// raced reports whether the store refused to record an attempt because
// the record is no longer as the attempt's reconciler listed it: another
// maintainer, a webhook or an operator deferred, settled or deleted it
// meanwhile, or it ran again under a new fence.
func raced(err error) bool {
	return errors.Is(err, store.ErrStateConflict) || errors.Is(err, store.ErrNotFound) || errors.Is(err, store.ErrLeaseLost)
}

// deadLetter takes the record p names out of every automatic pass, for an
// operator to settle: the store marks it (Record.DeadLettered) and
// ListUnknown's due records never include it again.
func (m *Maintainer) deadLetter(ctx context.Context, p store.DeferParams) error {
	p.DeadLetter = true
	return m.call(ctx, opDefer, func(ctx context.Context) error { return m.store.Defer(ctx, p) })
}

// backoff is the delay after a record's attempts+1-th unsettled attempt.
func (m *Maintainer) backoff(attempts int) time.Duration {
	d := m.cfg.ReconcileBackoff
	for i := 0; i < attempts && d < m.cfg.ReconcileMaxBackoff; i++ {
		d *= 2
	}
	return min(d, m.cfg.ReconcileMaxBackoff)
}

// Settle resolves one unknown record: the reconciler's verdicts go through
// it, and so do a webhook from the provider and an operator's decision.
// Happened stores res.Response (without the headers a replay must not
// carry) for every retry during Config.TTL; DidNotHappen and RunAgain
// release the key.
//
// A settlement is about one execution of the request: fence is the
// record's fence when it was decided (store.Record.Fence, as listed or
// shown). A record that ran again since has another fence, and Settle
// fails with store.ErrLeaseLost, changing nothing: a late or replayed
// settlement never releases the next execution. A record that is not
// unknown fails with store.ErrStateConflict, a missing one with
// store.ErrNotFound.
func (m *Maintainer) Settle(ctx context.Context, scope, key string, fence int64, res Resolution) error {
	p := store.ResolveParams{FenceParams: store.FenceParams{Scope: scope, Key: key, Fence: fence}, To: store.StateFailedRetryable}
	switch res.Outcome {
	case Happened:
		if res.Response == nil {
			return errors.New("maintenance: a request that happened needs the response to replay")
		}
		resp := *res.Response
		resp.Header = httpfield.Replayable(resp.Header) // as the engine stores them
		p.To, p.Response, p.TTL = store.StateCompleted, &resp, m.cfg.TTL
	case DidNotHappen, RunAgain:
	default:
		return fmt.Errorf("maintenance: a settlement must say whether the request happened (got %v)", res.Outcome)
	}
	err := m.call(ctx, opResolve, func(ctx context.Context) error {
		return m.store.Resolve(ctx, p)
	})
	if err == nil {
		m.obs.count(ctx, "reconcile_resolved", 1)
		m.cfg.Logger.Info("idem: unknown outcome resolved", "scope", scope, "key", key, "fence", fence, "to", p.To)
	}
	return err
}
