// Package obstest records what the engine and the maintenance services
// report to an idem.Observer, for tests of the core that must not depend on
// a telemetry library.
package obstest

import (
	"context"
	"sync"
	"time"

	"github.com/idem-go/idem"
)

// Recorder is an idem.Observer that keeps counts of every report. The zero
// value is ready; it is safe for concurrent use.
type Recorder struct {
	mu          sync.Mutex
	reserves    map[string]int64
	storeCalls  map[string]int64
	storeErrors map[string]int64
	finishFails map[string]int64
	events      map[string]int64
	tenants     map[string]int64
	steps       []Step
}

// Step is a step that ended.
type Step struct {
	idem.Step
	End idem.StepEnd
}

var (
	_ idem.Observer       = (*Recorder)(nil)
	_ idem.TenantObserver = (*Recorder)(nil)
)

func add(m *map[string]int64, k string, n int64) {
	if *m == nil {
		*m = map[string]int64{}
	}
	(*m)[k] += n
}

func (r *Recorder) Reserve(_ context.Context, outcome string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	add(&r.reserves, outcome, 1)
}

func (r *Recorder) StoreCall(_ context.Context, op string, _ time.Duration, failed bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	add(&r.storeCalls, op, 1)
	if failed {
		add(&r.storeErrors, op, 1)
	}
}

func (r *Recorder) FinishFailed(_ context.Context, op string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	add(&r.finishFails, op, 1)
}

func (r *Recorder) Event(_ context.Context, name string, n int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	add(&r.events, name, n)
}

func (r *Recorder) Step(ctx context.Context, s idem.Step) (context.Context, func(idem.StepEnd)) {
	return ctx, func(end idem.StepEnd) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.steps = append(r.steps, Step{Step: s, End: end})
	}
}

func snapshot(m map[string]int64) map[string]int64 {
	c := make(map[string]int64, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

// Reserves returns the reservations counted by outcome.
func (r *Recorder) Reserves() map[string]int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return snapshot(r.reserves)
}

// StoreCalls returns the store calls counted by op.
func (r *Recorder) StoreCalls() map[string]int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return snapshot(r.storeCalls)
}

// StoreErrors returns the failed store calls counted by op.
func (r *Recorder) StoreErrors() map[string]int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return snapshot(r.storeErrors)
}

// FinishFailures returns the outcomes not recorded, counted by op.
func (r *Recorder) FinishFailures() map[string]int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return snapshot(r.finishFails)
}

// Events returns the events summed by name.
func (r *Recorder) Events() map[string]int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return snapshot(r.events)
}

// Steps returns the steps that ended, in the order they ended.
func (r *Recorder) Steps() []Step {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Step(nil), r.steps...)
}

// TenantReserve counts a tenant's outcome under "tenant/outcome".
func (r *Recorder) TenantReserve(_ context.Context, tenant, outcome string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	add(&r.tenants, tenant+"/"+outcome, 1)
}

// Tenants returns the counts of TenantReserve by "tenant/outcome".
func (r *Recorder) Tenants() map[string]int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return snapshot(r.tenants)
}
