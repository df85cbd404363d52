package idem

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/idem-go/idem/store"
)

// Per-tenant protection: a rate of new keys per tenant (a token bucket per
// tenant, per Engine) and a cap on a tenant's active records (counted by
// the store, atomically with the reserve, so it holds across instances).

// TenantObserver is implemented by an Observer that also counts what the
// protocol answered per tenant (package otelidem keeps a bounded set of
// tenants and folds the others into one). The engine calls it, besides
// Observer.Reserve, for every call that reached the store or was refused
// by a tenant limit: outcome is one of created, replay, in_progress,
// key_reused, failed_retry, unknown, taken_over, accepted (an
// asynchronous request recorded as pending), rate_limited or over_cap.
type TenantObserver interface {
	TenantReserve(ctx context.Context, tenant, outcome string)
}

// TenantSuccessObserver is implemented by a TenantObserver that gives a
// tenant a place of its own (a metric series) only once one of its
// requests was answered with a 2xx: tenants minted for free (a fresh
// credential for every request) never take the places of real ones. The
// engine calls it when it stored a 2xx answer of the tenant.
type TenantSuccessObserver interface {
	TenantSucceeded(ctx context.Context, tenant string)
}

// tenantSucceeded reports a tenant's stored 2xx answer to a
// TenantSuccessObserver.
func (e *Engine) tenantSucceeded(ctx context.Context, scope string, status int) {
	t, ok := e.obs.(TenantSuccessObserver)
	if !ok || status < 200 || status > 299 {
		return
	}
	if tenant, _, _, ok := ParseScope(scope); ok {
		t.TenantSucceeded(ctx, tenant)
	}
}

// The outcomes of the tenant limits, in Observer.Reserve and
// TenantObserver.TenantReserve.
const (
	outcomeRateLimited = "rate_limited"
	outcomeOverCap     = "over_cap"
	// outcomeOverCapacity: the store bound (Config.StoreMaxActive).
	outcomeOverCapacity = "over_capacity"
)

// limiterIdle bounds the buckets kept: once there are more, buckets that
// refilled completely (tenants idle for a while) are dropped, as a full
// bucket is what a tenant without one gets. Buckets still refilling are
// kept (dropping one would give its tenant a full burst again): their
// number is bounded by the new keys admitted within burst/rate seconds.
const limiterIdle = 4096

// tenantLimiter is a token bucket per tenant: rate tokens a second, at
// most burst kept. It lives in one process: N instances together admit up
// to N times the rate.
type tenantLimiter struct {
	rate  float64
	burst float64
	mu    sync.Mutex
	b     map[string]*bucket
	// prune is the number of buckets at which the next prune runs: twice
	// what the last one left, so that pruning costs O(1) a call however
	// many tenants are busy at once.
	prune int
}

type bucket struct {
	tokens float64
	at     time.Time
}

func newTenantLimiter(rate float64, burst int) *tenantLimiter {
	if rate <= 0 {
		return nil
	}
	return &tenantLimiter{rate: rate, burst: float64(burst), b: map[string]*bucket{}, prune: limiterIdle}
}

// take takes a token for tenant at now. Without one, it returns how long
// until one is there.
func (l *tenantLimiter) take(tenant string, now time.Time) (bool, time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.b[tenant]
	if b == nil {
		if len(l.b) >= l.prune {
			l.dropIdle(now)
			l.prune = max(limiterIdle, 2*len(l.b))
		}
		b = &bucket{tokens: l.burst, at: now}
		l.b[tenant] = b
	}
	l.refill(b, now)
	if b.tokens >= 1 {
		b.tokens--
		return true, 0
	}
	return false, time.Duration((1 - b.tokens) / l.rate * float64(time.Second))
}

// refund gives back a token taken for a call that did not create a key.
func (l *tenantLimiter) refund(tenant string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if b := l.b[tenant]; b != nil {
		b.tokens = min(b.tokens+1, l.burst)
	}
}

func (l *tenantLimiter) refill(b *bucket, now time.Time) {
	if d := now.Sub(b.at); d > 0 {
		b.tokens = min(l.burst, b.tokens+d.Seconds()*l.rate)
		b.at = now
	}
}

func (l *tenantLimiter) dropIdle(now time.Time) {
	for t, b := range l.b {
		if l.refill(b, now); b.tokens >= l.burst {
			delete(l.b, t)
		}
	}
}

// size is the number of buckets kept (tests).
func (l *tenantLimiter) size() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.b)
}

// admit applies the bounds on new keys before the reservation: the
// tenant's and the Engine's rates of new keys (a token of each) and the
// bound on the records active across the store. When one refuses, the
// call still passes if its key already has a record (a replay, a
// duplicate in flight, a retry of a released key are not new keys).
// charged reports tokens were taken: admitted gives them back unless the
// reservation created a record. err is a store failure of the count
// behind the store bound: the call is refused as the reservation would be
// (fail closed).
func (e *Engine) admit(ctx context.Context, tenant, scope, key string) (charged bool, refused *Answer, err error) {
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

// admitted closes what admit opened once the reservation answered:
// tokens taken for a call that created no record are given back, and a
// record created counts against the store bound until the next count.
func (e *Engine) admitted(tenant string, charged, created bool) {
	if charged && !created {
		e.refund(tenant)
	}
	if created && e.bound != nil {
		e.bound.created()
	}
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
		"the tenant holds "+countOf(e.cfg.TenantMaxActive, "request", "requests")+" waiting for a worker, in progress or awaiting reconciliation")
}

// countOf writes n with the noun that agrees with it: 1 request, 2 requests.
func countOf(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return strconv.Itoa(n) + " " + many
}

// tenantObs reports outcome for tenant to a TenantObserver.
func (e *Engine) tenantObs(ctx context.Context, tenant, outcome string) {
	if t, ok := e.obs.(TenantObserver); ok && outcome != "" {
		t.TenantReserve(ctx, tenant, outcome)
	}
}

// burstFor is the default burst of a rate: one second's worth, at least 1.
func burstFor(rate float64) int {
	return max(1, int(math.Ceil(rate)))
}

// checkCap refuses a cap of active records over a store that cannot count
// them (store.CapRefuser), as configured.
func checkCap(s store.Store, set *settings) error {
	if r, ok := s.(store.CapRefuser); ok && set.TenantMaxActive > 0 {
		if why := r.TenantCapUnsupported(); why != "" {
			return fmt.Errorf("idem: TenantMaxActive: %s", why)
		}
	}
	return nil
}
