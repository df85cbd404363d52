package maintenance

import (
	"context"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// op names a store operation of the services in metrics and errors.
type op int

const (
	opSweep op = iota
	opReap
	opListUnknown
	opResolve
	opDefer
	numOps
)

var opNames = [numOps]string{"sweep", "reap", "list_unknown", "resolve", "defer"}

func (o op) String() string { return opNames[o] }

// meterName, the instrument names and their descriptions are the engine's:
// an application that runs both exports one set of metrics, in which the
// services' store calls sit beside the engine's under the op attribute.
const meterName = "github.com/idem-go/idem"

// events are the counters of the background services.
var events = map[string]string{
	"zombies_swept":       "In-progress records whose lease expired, moved to unknown by the sweeper.",
	"ttl_pruned":          "Terminal records deleted (or soft-expired) past their expiry.",
	"abandoned":           "In-progress or unknown records past their expiry, closed with a timeout answer.",
	"reconcile_scheduled": "Records scheduled for reconciliation.",
	"reconcile_resolved":  "Unknown records settled by the resolver, a webhook or an operator.",
	"reconcile_failed":    "Reconciliation attempts that failed.",
	"reconcile_dead":      "Unknown records dead-lettered for an operator.",
}

// observer holds the services' instruments, with their attribute sets
// built once.
type observer struct {
	events    map[string]metric.Int64Counter
	storeErrs metric.Int64Counter
	latency   metric.Float64Histogram
	opAdd     [numOps][]metric.AddOption
	opRecord  [numOps][]metric.RecordOption
}

func newObserver(mp metric.MeterProvider) (*observer, error) {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	m := mp.Meter(meterName)
	o := &observer{events: map[string]metric.Int64Counter{}}
	var err error
	if o.storeErrs, err = m.Int64Counter("idem.store.errors",
		metric.WithDescription("Store operations that failed (not counting lease or state conflicts).")); err != nil {
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
	for op := op(0); op < numOps; op++ {
		set := attribute.NewSet(attribute.String("op", op.String()))
		o.opAdd[op] = []metric.AddOption{metric.WithAttributeSet(set)}
		o.opRecord[op] = []metric.RecordOption{metric.WithAttributeSet(set)}
	}
	return o, nil
}

func (o *observer) storeOp(ctx context.Context, op op, d time.Duration, failed bool) {
	o.latency.Record(ctx, d.Seconds(), o.opRecord[op]...)
	if failed {
		o.storeErrs.Add(ctx, 1, o.opAdd[op]...)
	}
}

func (o *observer) count(ctx context.Context, event string, n int) {
	if n > 0 {
		o.events[event].Add(ctx, int64(n))
	}
}
