package idem

import (
	"context"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// storeOp names a store operation in metrics and errors.
type storeOp int

const (
	opReserve storeOp = iota
	opComplete
	opRelease
	opMarkUnknown
	opCheckpoint
	opExtend
	opGet
	numOps
)

// opNames match those of package maintenance, whose store calls sit beside
// the engine's under the same op attribute.
var opNames = [numOps]string{"reserve", "complete", "release", "mark_unknown", "checkpoint", "extend", "get"}

func (o storeOp) String() string { return opNames[o] }

// reserveOutcomes are the values of the outcome attribute of
// idem.reserve.outcomes (DESIGN §6).
var reserveOutcomes = []string{
	"created", "replay", "in_progress", "key_reused", "failed_retry", "unknown", "taken_over", "store_error", "rejected",
}

// observer holds the engine's instruments with their attribute sets built
// once, so recording costs no allocation on the request path.
type observer struct {
	reserves    metric.Int64Counter
	reserveOpts map[string][]metric.AddOption
	storeErrs   metric.Int64Counter
	finishFails metric.Int64Counter
	latency     metric.Float64Histogram
	scheduled   metric.Int64Counter
	// Option slices, not single options: a variadic call through an
	// interface would allocate a fresh slice per call.
	opAdd    [numOps][]metric.AddOption
	opRecord [numOps][]metric.RecordOption
}

const meterName = "github.com/idem-go/idem"

func newObserver(mp metric.MeterProvider) (*observer, error) {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	m := mp.Meter(meterName)
	o := &observer{reserveOpts: map[string][]metric.AddOption{}}
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
	if o.scheduled, err = m.Int64Counter("idem.reconcile_scheduled",
		metric.WithDescription("Records scheduled for reconciliation.")); err != nil {
		return nil, err
	}
	for _, out := range reserveOutcomes {
		o.reserveOpts[out] = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(attribute.String("outcome", out)))}
	}
	for op := storeOp(0); op < numOps; op++ {
		set := attribute.NewSet(attribute.String("op", op.String()))
		o.opAdd[op] = []metric.AddOption{metric.WithAttributeSet(set)}
		o.opRecord[op] = []metric.RecordOption{metric.WithAttributeSet(set)}
	}
	return o, nil
}

func (o *observer) reserve(ctx context.Context, outcome string) {
	o.reserves.Add(ctx, 1, o.reserveOpts[outcome]...)
}

func (o *observer) storeOp(ctx context.Context, op storeOp, d time.Duration, err error) {
	o.latency.Record(ctx, d.Seconds(), o.opRecord[op]...)
	if err != nil && !isAnswer(err) {
		o.storeErrs.Add(ctx, 1, o.opAdd[op]...)
	}
}

func (o *observer) finishFailed(ctx context.Context, op storeOp) {
	o.finishFails.Add(ctx, 1, o.opAdd[op]...)
}

// reconcileScheduled counts a record the engine sent to reconciliation
// (package maintenance counts those its sweeper sends, under the same name).
func (o *observer) reconcileScheduled(ctx context.Context) {
	o.scheduled.Add(ctx, 1)
}
