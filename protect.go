package idem

import (
	"context"
	"fmt"
	"math"
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
