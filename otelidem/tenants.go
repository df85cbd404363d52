package otelidem

import (
	"context"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// tenantSeries counts outcomes per tenant with a bounded number of series:
// the first max tenants admitted (after a 2xx answer) get their own tenant
// attribute, the others share OtherTenant. A series, once exported, lives as long as the meter
// provider, so the set of named tenants only grows, up to max: the bound
// is on what a metrics backend stores, whatever the number of tenants (or
// of made-up tenant names) calling.
type tenantSeries struct {
	c   metric.Int64Counter
	max int

	mu sync.RWMutex
	// opts holds the options of each named tenant by outcome.
	opts  map[string]map[string][]metric.AddOption
	other map[string][]metric.AddOption
}

func newTenantSeries(c metric.Int64Counter, max int) *tenantSeries {
	t := &tenantSeries{c: c, max: max, opts: map[string]map[string][]metric.AddOption{}}
	t.other = t.optionsFor(OtherTenant)
	return t
}

// optionsFor builds the option slices of one tenant.
func (t *tenantSeries) optionsFor(tenant string) map[string][]metric.AddOption {
	m := make(map[string][]metric.AddOption, len(outcomes))
	for _, out := range outcomes {
		m[out] = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(
			attribute.String("tenant", tenant), attribute.String("outcome", out)))}
	}
	return m
}

// series returns the options of tenant's series: its own once admitted,
// else OtherTenant's.
func (t *tenantSeries) series(tenant string) map[string][]metric.AddOption {
	t.mu.RLock()
	m, ok := t.opts[tenant]
	t.mu.RUnlock()
	if ok {
		return m
	}
	return t.other
}

// admit gives tenant a series of its own while there is room.
func (t *tenantSeries) admit(tenant string) {
	if tenant == OtherTenant {
		return
	}
	t.mu.RLock()
	_, ok := t.opts[tenant]
	full := len(t.opts) >= t.max
	t.mu.RUnlock()
	if ok || full {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.opts[tenant]; !ok && len(t.opts) < t.max {
		t.opts[tenant] = t.optionsFor(tenant)
	}
}

func (t *tenantSeries) add(ctx context.Context, tenant, outcome string) {
	opts, ok := t.series(tenant)[outcome]
	if !ok {
		return // not an outcome the engine reports
	}
	t.c.Add(ctx, 1, opts...)
}
