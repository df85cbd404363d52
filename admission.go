package idem

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/idem-go/idem/internal/plural"
	"github.com/idem-go/idem/store"
)

// Admission: the engine's bounds on starting work, a layer the protocol
// (Engine.run) calls once before the reservation (admit) and once after
// it (admitted). Before: the store's durability when Config.RequireDurable
// asks for it, the rates of new keys (the tenant's and the Engine's) and
// the bound on the records active across the store; a key that already
// has a record is never refused by them. After: the tokens of a call that
// created no record are given back, a record created counts against the
// store bound, and the refusals that only the reservation can tell are
// answered: the tenant's cap of active records (counted by the store in
// the same atomic step) and the store's circuit breaker, open. The
// breaker itself gates the store calls (see Engine.callAt).

// ticket is what admit took for a call, for admitted to settle.
type ticket struct {
	charged bool // tokens of the rates of new keys were taken
}

// admit is the admission before the reservation: a refusal, or the
// ticket the call is admitted with.
func (e *Engine) admit(ctx context.Context, id *callID) (ticket, *Answer) {
	if err := e.refusesUndurable(); err != nil {
		e.log.Debug("idem: refused while the store's durability is not confirmed", "scope", id.scope, "key", id.key)
		return ticket{}, &Answer{Verdict: Unavailable, Problem: e.problem(probNotDurable, 0), Err: err}
	}
	charged, refused, err := e.admitNew(ctx, id.tenant, id.scope, id.key)
	if err != nil {
		// The count behind the store bound failed: refused as the
		// reservation would have been (fail closed).
		if a := e.breakerOpen(ctx, id, err); a != nil {
			return ticket{}, a
		}
		a := e.unavailable(ctx, id, err)
		return ticket{}, &a
	}
	return ticket{charged: charged}, refused
}

// admitted is the admission after the reservation, which decided d or
// failed with err: it settles t, and answers the refusals the reservation
// met (nil when there is none).
func (e *Engine) admitted(ctx context.Context, t ticket, id *callID, d decision, err error) *Answer {
	created := err == nil && d.created
	if t.charged && !created {
		e.refund(id.tenant)
	}
	if created && e.bound != nil {
		e.bound.created()
	}
	if errors.Is(err, store.ErrOverCap) {
		a := e.overCap(ctx, id.tenant)
		return &a
	}
	return e.breakerOpen(ctx, id, err)
}

// breakerOpen answers a call refused by the store's circuit breaker (503
// with Retry-After until the breaker lets a probe through); nil when err
// is not the breaker's refusal.
func (e *Engine) breakerOpen(ctx context.Context, id *callID, err error) *Answer {
	wait, open := breakerWait(err)
	if !open {
		return nil
	}
	pr := e.problem(probStore, 0)
	pr.RetryAfter = max(pr.RetryAfter, wait)
	e.log.Debug("idem: store circuit breaker open; refused", "scope", id.scope, "key", id.key)
	return &Answer{Verdict: Unavailable, Problem: pr, Err: err}
}

// admitNew applies the bounds on new keys before the reservation: the
// tenant's and the Engine's rates of new keys (a token of each) and the
// bound on the records active across the store. When one refuses, the
// call still passes if its key already has a record (a replay, a
// duplicate in flight, a retry of a released key are not new keys).
// charged reports tokens were taken: admitted gives them back unless the
// reservation created a record. err is a store failure of the count
// behind the store bound: the call is refused as the reservation would be
// (fail closed).
func (e *Engine) admitNew(ctx context.Context, tenant, scope, key string) (charged bool, refused *Answer, err error) {
	if e.limiter == nil && e.global == nil && e.bound == nil {
		return false, nil, nil
	}
	now := e.clk.Now()
	refusal, ok := e.takeTokens(ctx, tenant, now)
	if ok && e.bound != nil {
		full, wait, err := e.bound.full(now, func(f func(context.Context) error) error {
			return e.call(ctx, opCountActive, false, f)
		})
		if err != nil || full {
			e.refund(tenant)
		}
		if err != nil {
			return false, nil, err
		}
		ok = !full
		refusal = func() Answer {
			return e.limited(ctx, tenant, outcomeOverCapacity, probOverCapacity, wait, e.bound.detail())
		}
	}
	if ok {
		return true, nil, nil
	}
	err = e.call(ctx, opGet, false, func(ctx context.Context) error {
		_, err := e.store.Get(ctx, scope, key)
		return err
	})
	if errors.Is(err, store.ErrNotFound) {
		a := refusal()
		return false, &a, nil
	}
	// The key has a record, or the store failed: the reservation meets the
	// same store and answers.
	return false, nil, nil
}

// takeTokens takes a token of the tenant's rate and one of the Engine's;
// without one it takes none, and returns the refusal to answer when the
// key turns out to be new.
func (e *Engine) takeTokens(ctx context.Context, tenant string, now time.Time) (refusal func() Answer, ok bool) {
	l, p, what := e.limiter, probRateLimited, "the tenant's"
	ok, wait := true, time.Duration(0)
	if l != nil {
		ok, wait = l.take(tenant, now)
	}
	if ok && e.global != nil {
		if ok, wait = e.global.take("", now); !ok {
			if l != nil {
				l.refund(tenant)
			}
			l, p, what = e.global, probNewKeysLimited, "this server's"
		}
	}
	if ok {
		return nil, true
	}
	return func() Answer {
		return e.limited(ctx, tenant, outcomeRateLimited, p, wait,
			what+" rate of new keys is "+strconv.FormatFloat(l.rate, 'g', -1, 64)+" a second")
	}, false
}

// refund gives back the tokens admit took for a call that created no
// record.
func (e *Engine) refund(tenant string) {
	if e.limiter != nil {
		e.limiter.refund(tenant)
	}
	if e.global != nil {
		e.global.refund("")
	}
}

// limited answers a call refused by a tenant limit, and counts it.
func (e *Engine) limited(ctx context.Context, tenant, outcome string, p *problemType, wait time.Duration, detail string) Answer {
	e.obs.Reserve(ctx, outcome)
	e.tenantObs(ctx, tenant, outcome)
	// Debug: under key spraying there is one per request; the metrics
	// count them.
	e.log.Debug("idem: tenant limit; refused", "tenant", tenant, "limit", outcome)
	pr := e.problem(p, 0)
	pr.Detail = detail
	if wait > pr.RetryAfter {
		pr.RetryAfter = wait
	}
	return Answer{Verdict: Limited, Problem: pr}
}

// overCap answers a reservation the store refused at the tenant's cap.
func (e *Engine) overCap(ctx context.Context, tenant string) Answer {
	return e.limited(ctx, tenant, outcomeOverCap, probOverCap, 0,
		"the tenant holds "+plural.Count(e.cfg.TenantMaxActive, "request", "requests")+" waiting for a worker, in progress or awaiting reconciliation")
}
