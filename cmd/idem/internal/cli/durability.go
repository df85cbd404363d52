package cli

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/idem-go/idem/store"
)

// durabilityStates are the values of the state attribute of
// idem.store.durability, one gauge each.
var durabilityStates = []store.DurabilityState{store.DurabilitySafe, store.DurabilityAtRisk, store.DurabilityUnknown}

// durabilityMetrics registers the gauges of the store's durability check
// (see idem.Engine.Durability): idem_store_durability{state} is 1 for the
// state of the last check and 0 for the others, idem_store_replicas the
// replicas it saw (-1: not visible). Neither is reported while the store
// is not open or has no check (SQLite, memory).
func (p *Proxy) durabilityMetrics(m metric.Meter) (metric.Registration, error) {
	state, err := m.Int64ObservableGauge("idem.store.durability",
		metric.WithDescription("1 for the state of the store's last durability check (safe, at_risk: acknowledged answers can be lost by a failover or restart, unknown), 0 for the others"))
	if err != nil {
		return nil, err
	}
	replicas, err := m.Int64ObservableGauge("idem.store.replicas",
		metric.WithDescription("replicas (standbys) the store's last durability check saw attached; -1 when not visible"))
	if err != nil {
		return nil, err
	}
	return m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		d, ok := p.durability()
		if !ok {
			return nil
		}
		for _, s := range durabilityStates {
			v := int64(0)
			if d.State == s {
				v = 1
			}
			o.ObserveInt64(state, v, metric.WithAttributes(attribute.String("state", string(s))))
		}
		o.ObserveInt64(replicas, int64(d.Replicas))
		return nil
	}, state, replicas)
}

// lostMetrics registers idem_reservations_unacknowledged: the
// reservations whose answer the store lost that the engine remembers, to
// give back once the store answers (idem.Engine.LostReservations). Not
// reported while the store is not open.
func (p *Proxy) lostMetrics(m metric.Meter) (metric.Registration, error) {
	lost, err := m.Int64ObservableGauge("idem.reservations.unacknowledged",
		metric.WithDescription("reservations whose answer the store lost, remembered to be read back and given back once the store answers"))
	if err != nil {
		return nil, err
	}
	return m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		p.mu.Lock()
		e := p.engine
		p.mu.Unlock()
		if e != nil {
			o.ObserveInt64(lost, int64(e.LostReservations()))
		}
		return nil
	}, lost)
}

// durability is the engine's last durability report, false while the
// store is not open or has no check.
func (p *Proxy) durability() (store.Durability, bool) {
	p.mu.Lock()
	e := p.engine
	p.mu.Unlock()
	if e == nil {
		return store.Durability{}, false
	}
	return e.Durability()
}
