// Package otelidem reports what the idem engine and its maintenance
// services do to OpenTelemetry: metrics through a MeterProvider, spans
// through a TracerProvider.
//
//	obs, err := otelidem.New(otelidem.Config{MeterProvider: mp, TracerProvider: tp})
//	engine, err := idem.New(s, idem.Config{Observer: obs})
//	m, err := maintenance.New(s, maintenance.Config{Observer: obs})
//
// The metrics, under the meter github.com/idem-go/idem:
//
//   - idem.reserve.outcomes{outcome}: reservations by outcome
//   - idem.tenant.outcomes{tenant, outcome}: the same per tenant, for the
//     first Config.MaxTenants tenants of the process that had a request
//     answered with a 2xx, every other tenant counted under tenant
//     "other" (the number of series stays bounded however many tenants
//     call, and tenants minted for free, which never get a 2xx, cannot
//     take the places of real ones): replays, duplicates in flight, key
//     reuse and the tenant limits' refusals per tenant
//   - idem.store.errors{op}, idem.store.duration{op} (seconds): store
//     operations of the engine and of the services
//   - idem.finish.failures{op}: outcomes the engine could not record
//   - idem.zombies_swept, idem.ttl_pruned, idem.abandoned,
//     idem.reconcile_scheduled, idem.reconcile_resolved,
//     idem.reconcile_failed, idem.reconcile_raced, idem.reconcile_dead:
//     the record's life
//   - idem.breaker_opened, idem.breaker_closed: the store's circuit breaker
//   - idem.reservation_released: reservations whose answer was lost,
//     released by the engine that made them (docs/http-contract.md)
//
// The spans, under the tracer github.com/idem-go/idem, one per step of a
// protected call, named idem.<step> (idem.reserve, idem.wait,
// idem.replay, idem.complete, idem.release, idem.mark_unknown,
// idem.extend), with the attributes idem.store, idem.scope,
// http.route, idem.fence, idem.outcome and idem.attempts. A step that
// failed records its error and the status Error.
package otelidem

import (
	"cmp"
	"context"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/idem-go/idem"
)

// Config selects the providers. Either may be nil: its global provider is
// used (a no-op until the application installs one). Given OpenTelemetry's
// no-op tracer provider (noop.NewTracerProvider()), the observer starts no
// span at all, and records the metrics only.
type Config struct {
	MeterProvider  metric.MeterProvider
	TracerProvider trace.TracerProvider
	// MaxTenants bounds the tenants of idem.tenant.outcomes that get a
	// series of their own; the others share tenant "other". Defaults to
	// 100; negative turns the per-tenant counter off.
	MaxTenants int
}

// OtherTenant is the tenant attribute of the tenants beyond
// Config.MaxTenants.
const OtherTenant = "other"

// Name is the instrumentation scope of the meter and the tracer.
const Name = "github.com/idem-go/idem"

// outcomes are the values of the outcome attribute of
// idem.reserve.outcomes.
var outcomes = []string{
	"created", "replay", "in_progress", "key_reused", "failed_retry", "unknown", "taken_over", "store_error", "rejected",
	"accepted",
	"rate_limited", "over_cap",
}

// ops are the store operations of the engine and of package maintenance.
var ops = []string{
	"reserve", "complete", "release", "mark_unknown", "checkpoint", "extend", "get", "sync",
	"sweep", "reap", "list_unknown", "resolve", "defer",
	"claim", "expire_pending",
}

// events are the counters of the record's life.
var events = map[string]string{
	"zombies_swept":       "In-progress records whose lease expired, moved to unknown by the sweeper.",
	"ttl_pruned":          "Terminal records deleted (or soft-expired) past their expiry.",
	"abandoned":           "In-progress or unknown records past their expiry, closed with a timeout answer.",
	"reconcile_scheduled": "Records scheduled for reconciliation.",
	"reconcile_resolved":  "Unknown records settled by the resolver, a webhook, an operator, or the execution that held them, its outcome recorded late.",
	"reconcile_failed":    "Reconciliation attempts that failed.",
	"reconcile_raced":     "Reconciliation attempts not recorded because another reconciler, a webhook or an operator recorded one first, or the request ran again; not counted as failed.",
	"reconcile_dead":      "Unknown records dead-lettered for an operator.",
	"async_claimed":       "Asynchronous requests claimed by a worker.",
	"pending_expired":     "Asynchronous requests no worker claimed in time, ended with a timeout answer.",
	"breaker_opened":      "Times the store's circuit breaker opened: requests got 503 without calling the store.",
	"breaker_closed":      "Times the store's circuit breaker closed after a successful probe.",
	"reservation_released": "Reservations whose answer the store lost, read back and released by the engine that made them: " +
		"no handler ran, and the client's retry runs the request.",
}

// observer holds the instruments with their attribute sets built once, so
// that recording a metric costs no allocation on the request path.
type observer struct {
	tracer trace.Tracer
	// noSpans: the provider is OpenTelemetry's no-op one, whose spans
	// record nothing and carry on only the parent's span context, which
	// the caller's context carries already: Step skips them.
	noSpans     bool
	reserves    metric.Int64Counter
	storeErrs   metric.Int64Counter
	finishFails metric.Int64Counter
	latency     metric.Float64Histogram
	events      map[string]metric.Int64Counter
	// Option slices, not single options: a variadic call through an
	// interface would allocate a fresh slice per call.
	outcomeAdd map[string][]metric.AddOption
	opAdd      map[string][]metric.AddOption
	opRecord   map[string][]metric.RecordOption
	tenants    *tenantSeries // nil when turned off
}

// New returns an Observer for idem.Config and maintenance.Config.
func New(cfg Config) (idem.Observer, error) {
	mp, tp := cfg.MeterProvider, cfg.TracerProvider
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	m := mp.Meter(Name)
	o := &observer{
		tracer:     tp.Tracer(Name),
		noSpans:    isNoop(tp),
		events:     map[string]metric.Int64Counter{},
		outcomeAdd: map[string][]metric.AddOption{},
		opAdd:      map[string][]metric.AddOption{},
		opRecord:   map[string][]metric.RecordOption{},
	}
	var err error
	if o.reserves, err = m.Int64Counter("idem.reserve.outcomes",
		metric.WithDescription("Reservations by outcome: created, replay, in_progress, key_reused, failed_retry, unknown, taken_over, store_error, rejected.")); err != nil {
		return nil, err
	}
	if o.storeErrs, err = m.Int64Counter("idem.store.errors",
		metric.WithDescription("Store operations that failed (not counting lease or state conflicts).")); err != nil {
		return nil, err
	}
	if o.finishFails, err = m.Int64Counter("idem.finish.failures",
		metric.WithDescription("Outcomes the engine could not record; the key stays in progress until its lease expires.")); err != nil {
		return nil, err
	}
	if o.latency, err = m.Float64Histogram("idem.store.duration", metric.WithUnit("s"),
		metric.WithDescription("Latency of store operations.")); err != nil {
		return nil, err
	}
	for name, desc := range events {
		if o.events[name], err = m.Int64Counter("idem."+name, metric.WithDescription(desc)); err != nil {
			return nil, err
		}
	}
	if cfg.MaxTenants >= 0 {
		c, err := m.Int64Counter("idem.tenant.outcomes",
			metric.WithDescription("Reservations by tenant and outcome, for a bounded set of tenants; the others under tenant \"other\"."))
		if err != nil {
			return nil, err
		}
		o.tenants = newTenantSeries(c, cmp.Or(cfg.MaxTenants, 100))
	}
	for _, out := range outcomes {
		o.outcomeAdd[out] = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(attribute.String("outcome", out)))}
	}
	for _, op := range ops {
		set := attribute.NewSet(attribute.String("op", op))
		o.opAdd[op] = []metric.AddOption{metric.WithAttributeSet(set)}
		o.opRecord[op] = []metric.RecordOption{metric.WithAttributeSet(set)}
	}
	return o, nil
}

func (o *observer) Reserve(ctx context.Context, outcome string) {
	o.reserves.Add(ctx, 1, o.outcomeOpts(outcome)...)
}

// TenantReserve implements idem.TenantObserver.
func (o *observer) TenantReserve(ctx context.Context, tenant, outcome string) {
	if o.tenants != nil {
		o.tenants.add(ctx, tenant, outcome)
	}
}

// TenantSucceeded implements idem.TenantSuccessObserver: the tenant may
// get a series of its own.
func (o *observer) TenantSucceeded(ctx context.Context, tenant string) {
	if o.tenants != nil {
		o.tenants.admit(tenant)
	}
}

func (o *observer) outcomeOpts(outcome string) []metric.AddOption {
	if opts, ok := o.outcomeAdd[outcome]; ok {
		return opts
	}
	return []metric.AddOption{metric.WithAttributes(attribute.String("outcome", outcome))}
}

func (o *observer) StoreCall(ctx context.Context, op string, d time.Duration, failed bool) {
	rec, ok := o.opRecord[op]
	if !ok {
		rec = []metric.RecordOption{metric.WithAttributes(attribute.String("op", op))}
	}
	o.latency.Record(ctx, d.Seconds(), rec...)
	if failed {
		o.storeErrs.Add(ctx, 1, o.opOpts(op)...)
	}
}

func (o *observer) opOpts(op string) []metric.AddOption {
	if opts, ok := o.opAdd[op]; ok {
		return opts
	}
	return []metric.AddOption{metric.WithAttributes(attribute.String("op", op))}
}

func (o *observer) FinishFailed(ctx context.Context, op string) {
	o.finishFails.Add(ctx, 1, o.opOpts(op)...)
}

func (o *observer) Event(ctx context.Context, name string, n int64) {
	if c, ok := o.events[name]; ok {
		c.Add(ctx, n)
	}
}

// Attribute keys of the spans.
const (
	keyStore    = attribute.Key("idem.store")
	keyScope    = attribute.Key("idem.scope")
	keyRoute    = attribute.Key("http.route")
	keyFence    = attribute.Key("idem.fence")
	keyOutcome  = attribute.Key("idem.outcome")
	keyAttempts = attribute.Key("idem.attempts")
)

func (o *observer) Step(ctx context.Context, s idem.Step) (context.Context, func(idem.StepEnd)) {
	if o.noSpans {
		return ctx, endNothing
	}
	attrs := []attribute.KeyValue{keyStore.String(s.Store), keyScope.String(s.Scope), keyRoute.String(s.Route)}
	if s.Fence != 0 {
		attrs = append(attrs, keyFence.Int64(s.Fence))
	}
	ctx, span := o.tracer.Start(ctx, "idem."+s.Name, trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(attrs...))
	if !span.IsRecording() {
		return ctx, func(idem.StepEnd) { span.End() }
	}
	return ctx, func(end idem.StepEnd) {
		if end.Outcome != "" {
			span.SetAttributes(keyOutcome.String(end.Outcome))
		}
		if end.Fence != 0 && end.Fence != s.Fence {
			span.SetAttributes(keyFence.Int64(end.Fence))
		}
		if end.Attempts > 1 {
			span.SetAttributes(keyAttempts.Int(end.Attempts))
		}
		if end.Err != nil {
			span.RecordError(end.Err)
			span.SetStatus(codes.Error, end.Err.Error())
		}
		span.End()
	}
}

// endNothing ends a step that has no span.
func endNothing(idem.StepEnd) {}

// isNoop reports whether tp is OpenTelemetry's no-op provider.
func isNoop(tp trace.TracerProvider) bool {
	switch tp.(type) {
	case noop.TracerProvider, *noop.TracerProvider:
		return true
	}
	return false
}
