package otelidem

import (
	"context"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// tenantSeries counts outcomes per tenant with a bounded number of series:
// the first max tenants seen get their own tenant attribute, the others
// share OtherTenant. A series, once exported, lives as long as the meter
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

// series returns the options of tenant's series: its own while there is
// room, else OtherTenant's.
func (t *tenantSeries) series(tenant string) map[string][]metric.AddOption {
	t.mu.RLock()
	m, ok := t.opts[tenant]
	full := len(t.opts) >= t.max
	t.mu.RUnlock()
	if ok {
		return m
	}
	if full || tenant == OtherTenant {
		return t.other
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if m, ok := t.opts[tenant]; ok {
		return m
	}
	if len(t.opts) >= t.max {
		return t.other
	}
	m = t.optionsFor(tenant)
	t.opts[tenant] = m
	return m
}

func (t *tenantSeries) add(ctx context.Context, tenant, outcome string) {
	opts, ok := t.series(tenant)[outcome]
	if !ok {
		return // not an outcome the engine reports
	}
	t.c.Add(ctx, 1, opts...)
}
