package outbox

import (
	"context"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

const meterName = "github.com/idem-go/idem/outbox"

// Metric names (outbox delivered/retried/dead). Each counter has
// the attribute "kind", the message's Kind.
const (
	MetricDelivered = "idem.outbox.delivered"
	MetricRetried   = "idem.outbox.retried"
	MetricDead      = "idem.outbox.dead"
)

type observer struct {
	delivered, retried, dead metric.Int64Counter
}

func newObserver(mp metric.MeterProvider) (*observer, error) {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	m := mp.Meter(meterName)
	o := &observer{}
	var err error
	if o.delivered, err = m.Int64Counter(MetricDelivered,
		metric.WithDescription("Messages delivered downstream and their downstream id recorded.")); err != nil {
		return nil, err
	}
	if o.retried, err = m.Int64Counter(MetricRetried,
		metric.WithDescription("Delivery attempts that failed and will be retried.")); err != nil {
		return nil, err
	}
	if o.dead, err = m.Int64Counter(MetricDead,
		metric.WithDescription("Messages dead-lettered, each counted once.")); err != nil {
		return nil, err
	}
	return o, nil
}

func (o *observer) add(ctx context.Context, c metric.Int64Counter, kind string) {
	c.Add(ctx, 1, metric.WithAttributes(attribute.String("kind", kind)))
}
