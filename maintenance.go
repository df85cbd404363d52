package idem

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"

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

// Verdicts of a Resolution.
const (
	// StillUnknown: the outside world cannot tell yet; ask again later.
	StillUnknown = iota
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

// Resolution is a Resolver's answer.
type Resolution struct {
	Outcome  int
	Response *store.Response // required when Outcome is Happened
}

// MaintenanceConfig configures the background services. Zero values take
// the documented defaults.
type MaintenanceConfig struct {
	// SweepInterval is how often expired leases are swept. Defaults to 15s.
	SweepInterval time.Duration
	// ReapInterval is how often expired records are reaped. Defaults to 1m.
	ReapInterval time.Duration
	// ReconcileInterval is how often due unknown records are reconciled.
	// Defaults to 10s. Reconciliation runs only with a Resolver.
	ReconcileInterval time.Duration
	// BatchSize bounds every batch. Defaults to 100.
	BatchSize int
	// SoftExpire keeps expired terminal records as state expired (audit)
	// instead of deleting them.
	SoftExpire bool
	// AbandonedTTL is how long an abandoned record (in progress or unknown
	// past its expiry) keeps its timeout answer. Defaults to 24h.
	AbandonedTTL time.Duration
	// Resolver settles unknown records. Nil disables reconciliation.
	Resolver Resolver
	// ReconcileBackoff is the first delay after an attempt that did not
	// settle a record; it doubles up to ReconcileMaxBackoff. Defaults to
	// 30s and 1h.
	ReconcileBackoff    time.Duration
	ReconcileMaxBackoff time.Duration
	// MaxReconcileAttempts dead-letters a record for an operator after this
	// many attempts. Defaults to 10.
	MaxReconcileAttempts int
	// Services are other background workers started and stopped with the
	// maintainer, such as an outbox.Outbox, so that one Start and one Stop
	// run all of an instance's background work.
	Services []Service
}

// Service is a background worker with a lifecycle, as outbox.Outbox has.
type Service interface {
	Start(ctx context.Context) error
	Stop(ctx context.Context) error
}

func (c MaintenanceConfig) withDefaults() MaintenanceConfig {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&c.SweepInterval, 15*time.Second)
	def(&c.ReapInterval, time.Minute)
	def(&c.ReconcileInterval, 10*time.Second)
	def(&c.AbandonedTTL, 24*time.Hour)
	def(&c.ReconcileBackoff, 30*time.Second)
	def(&c.ReconcileMaxBackoff, time.Hour)
	if c.BatchSize <= 0 {
		c.BatchSize = 100
	}
	if c.MaxReconcileAttempts <= 0 {
		c.MaxReconcileAttempts = 10
	}
	return c
}

// DeadLetterDelay is how far a dead-lettered record's reconciliation is
// pushed: out of every automatic pass, until an operator resolves it.
const DeadLetterDelay = 100 * 365 * 24 * time.Hour

// Maintainer runs the background services of DESIGN §5 over an engine's
// store: the sweeper, the reaper and the reconciler. Several instances may
// run at once against one store; every step is atomic per record.
type Maintainer struct {
	e   *Engine
	cfg MaintenanceConfig

	mu     sync.Mutex
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// Maintainer returns the background services for e's store.
func (e *Engine) Maintainer(cfg MaintenanceConfig) *Maintainer {
	return &Maintainer{e: e, cfg: cfg.withDefaults()}
}

// Start runs the services in the background until ctx ends or Stop. It
// fails if one of Config.Services fails to start (those already started
// are stopped again).
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
			return fmt.Errorf("idem: starting a background service: %w", err)
		}
	}
	ctx, m.cancel = context.WithCancel(ctx)
	m.loop(ctx, "sweep", m.cfg.SweepInterval, func(ctx context.Context) error {
		_, err := m.SweepOnce(ctx)
		return err
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

func (m *Maintainer) loop(ctx context.Context, name string, every time.Duration, once func(context.Context) error) {
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		// A random first delay spreads the instances of a fleet.
		t := time.NewTimer(time.Duration(rand.Int64N(int64(every))))
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if err := once(ctx); err != nil && ctx.Err() == nil {
				m.e.log.Error("idem: background pass failed", "service", name, "err", err)
			}
			t.Reset(every)
		}
	}()
}

// SweepOnce moves in_progress records whose lease expired (under policy
// unknown) to unknown, batch after batch until none is left, and returns
// how many it moved. Records under retry or resume wait for their retry.
func (m *Maintainer) SweepOnce(ctx context.Context) (int, error) {
	total := 0
	for {
		var recs []store.Record
		err := m.e.call(ctx, opSweep, false, func(ctx context.Context) (err error) {
			recs, err = m.e.store.SweepExpiredLeases(ctx, store.SweepParams{Limit: m.cfg.BatchSize})
			return err
		})
		if err != nil {
			return total, err
		}
		for _, r := range recs {
			m.e.log.Warn("idem: zombie lease swept; outcome unknown until reconciled",
				"scope", r.Scope, "key", r.Key, "fence", r.Fence, "locked_until", r.LockedUntil)
		}
		total += len(recs)
		m.e.obs.count(ctx, "zombies_swept", len(recs))
		m.e.obs.count(ctx, "reconcile_scheduled", len(recs))
		if len(recs) < m.cfg.BatchSize {
			return total, nil
		}
	}
}

// abandonedResponse is what a client still retrying an abandoned request
// gets: a definite timeout instead of a key that vanished (seed 001).
var abandonedResponse = store.Response{
	Status: http.StatusGatewayTimeout,
	Header: http.Header{"Content-Type": {"application/problem+json"}},
	Body:   []byte(`{"type":"` + ProblemBase + `abandoned","title":"The request was abandoned before its outcome was recorded","status":504}`),
}

// ReapOnce deletes (or soft-expires) terminal records past their expiry
// and turns abandoned ones into a stored timeout, batch after batch.
func (m *Maintainer) ReapOnce(ctx context.Context) (store.ReapResult, error) {
	var total store.ReapResult
	for {
		var res store.ReapResult
		err := m.e.call(ctx, opReap, false, func(ctx context.Context) (err error) {
			res, err = m.e.store.Reap(ctx, store.ReapParams{
				Limit: m.cfg.BatchSize, Soft: m.cfg.SoftExpire,
				Abandoned: abandonedResponse, AbandonedTTL: m.cfg.AbandonedTTL,
			})
			return err
		})
		if err != nil {
			return total, err
		}
		total.Deleted += res.Deleted
		total.Abandoned += res.Abandoned
		m.e.obs.count(ctx, "ttl_pruned", res.Deleted)
		m.e.obs.count(ctx, "abandoned", res.Abandoned)
		if res.Abandoned > 0 {
			m.e.log.Warn("idem: abandoned records closed with a timeout answer", "count", res.Abandoned)
		}
		if res.Deleted+res.Abandoned < m.cfg.BatchSize {
			return total, nil
		}
	}
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
func (m *Maintainer) ReconcileOnce(ctx context.Context) (ReconcileResult, error) {
	var total ReconcileResult
	if m.cfg.Resolver == nil {
		return total, errors.New("idem: reconciliation needs a Resolver")
	}
	for {
		res, n, err := m.reconcileBatch(ctx)
		total.Resolved += res.Resolved
		total.Deferred += res.Deferred
		total.DeadLettered += res.DeadLettered
		if err != nil || n < m.cfg.BatchSize {
			return total, err
		}
	}
}

// reconcileBatch handles one batch and returns how many records it read.
func (m *Maintainer) reconcileBatch(ctx context.Context) (ReconcileResult, int, error) {
	var out ReconcileResult
	var recs []store.Record
	err := m.e.call(ctx, opListUnknown, false, func(ctx context.Context) (err error) {
		recs, err = m.e.store.ListUnknown(ctx, store.ListUnknownParams{DueOnly: true, Limit: m.cfg.BatchSize})
		return err
	})
	if err != nil {
		return out, 0, err
	}
	for _, r := range recs {
		res, rerr := m.cfg.Resolver.Resolve(ctx, r)
		if rerr == nil && res.Outcome != StillUnknown {
			err := m.settle(ctx, r.Scope, r.Key, res)
			switch {
			case err == nil:
				out.Resolved++
				continue
			case errors.Is(err, store.ErrStateConflict) || errors.Is(err, store.ErrNotFound):
				continue // settled by someone else meanwhile
			case errors.Is(err, ErrStore):
				return out, len(recs), err
			}
			rerr = err
		}
		why := "resolver could not tell yet"
		if rerr != nil {
			why = rerr.Error()
			m.e.obs.count(ctx, "reconcile_failed", 1)
		}
		delay := m.backoff(r.ReconcileAttempts)
		if r.ReconcileAttempts+1 >= m.cfg.MaxReconcileAttempts {
			delay = DeadLetterDelay
			why = fmt.Sprintf("dead-lettered after %d attempts: %s", r.ReconcileAttempts+1, why)
			out.DeadLettered++
			m.e.obs.count(ctx, "reconcile_dead", 1)
			m.e.log.Error("idem: unknown outcome dead-lettered; an operator must resolve it",
				"scope", r.Scope, "key", r.Key, "fence", r.Fence, "reason", why)
		} else {
			out.Deferred++
		}
		err := m.e.call(ctx, opDefer, false, func(ctx context.Context) error {
			return m.e.store.Defer(ctx, store.DeferParams{Scope: r.Scope, Key: r.Key, Delay: delay, Error: why})
		})
		if err != nil && !isAnswer(err) {
			return out, len(recs), err
		}
	}
	return out, len(recs), nil
}

// DeadLettered reports whether reconciliation gave up on an unknown record
// and left it for an operator.
func DeadLettered(r store.Record) bool {
	return r.State == store.StateUnknown && r.ReconcileAfter.Sub(r.UpdatedAt) > DeadLetterDelay/2
}

func (m *Maintainer) backoff(attempts int) time.Duration {
	d := m.cfg.ReconcileBackoff
	for i := 0; i < attempts && d < m.cfg.ReconcileMaxBackoff; i++ {
		d *= 2
	}
	return min(d, m.cfg.ReconcileMaxBackoff)
}

// Settle resolves one unknown record from outside the poller: a webhook
// from the provider, or an operator. Happened stores res.Response for every
// retry; DidNotHappen releases the key.
func (m *Maintainer) Settle(ctx context.Context, scope, key string, res Resolution) error {
	return m.settle(ctx, scope, key, res)
}

func (m *Maintainer) settle(ctx context.Context, scope, key string, res Resolution) error {
	p := store.ResolveParams{Scope: scope, Key: key, To: store.StateFailedRetryable}
	switch res.Outcome {
	case Happened:
		if res.Response == nil {
			return errors.New("idem: a request that happened needs the response to replay")
		}
		resp := *res.Response
		resp.Header = replayableHeader(resp.Header) // as the middleware stores them
		p.To, p.Response, p.TTL = store.StateCompleted, &resp, m.e.cfg.TTL
	case DidNotHappen, RunAgain:
	default:
		return errors.New("idem: a settlement must say whether the request happened")
	}
	err := m.e.call(ctx, opResolve, false, func(ctx context.Context) error {
		return m.e.store.Resolve(ctx, p)
	})
	if err == nil {
		m.e.obs.count(ctx, "reconcile_resolved", 1)
		m.e.log.Info("idem: unknown outcome resolved", "scope", scope, "key", key, "to", p.To)
	}
	return err
}
