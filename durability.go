package idem

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem/store"
)

// durabilityRetry bounds the wait before a failed durability check is tried
// again.
const durabilityRetry = 10 * time.Second

// durability watches a store's durability (store.DurabilityChecker): it
// checks at New and then again, in the background of a request or a
// readiness check, once the last check is DurabilityInterval old. Each
// change of the report is logged once. It is shared by every engine
// derived from one New.
type durability struct {
	check    store.DurabilityChecker
	interval time.Duration
	timeout  time.Duration
	log      *slog.Logger

	report  atomic.Pointer[store.Durability] // the last report; Unknown until a check succeeds
	due     atomic.Int64                     // unix nanoseconds of the next check
	running atomic.Bool
	logged  atomic.Bool // a report was logged: later ones only when they change
}

func newDurability(s store.Store, set *settings) (*durability, error) {
	c, ok := s.(store.DurabilityChecker)
	if !ok {
		if set.RequireDurable {
			return nil, errNoDurabilityCheck(StoreName(s))
		}
		return nil, nil
	}
	d := &durability{check: c, interval: set.DurabilityInterval, timeout: set.StoreTimeout, log: set.Logger}
	d.report.Store(&store.Durability{State: store.DurabilityUnknown, Replicas: -1})
	d.refresh(time.Now())
	return d, nil
}

// current returns the last report.
func (d *durability) current() store.Durability { return *d.report.Load() }

// tick starts a check in the background when one is due.
func (d *durability) tick(now time.Time) {
	if now.UnixNano() < d.due.Load() || !d.running.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer d.running.Store(false)
		d.refresh(time.Now())
	}()
}

// refresh checks the store once, logs a change, and schedules the next
// check.
func (d *durability) refresh(now time.Time) {
	ctx, cancel := context.WithTimeout(context.Background(), d.timeout)
	defer cancel()
	got, err := d.check.CheckDurability(ctx)
	prev := d.current()
	if err != nil {
		d.due.Store(now.Add(min(d.interval, durabilityRetry)).UnixNano())
		if d.logged.Load() {
			// Keep what the last check found: settings rarely change,
			// and an unreachable store is the breaker's business.
			d.log.Debug("idem: the store's durability check failed; keeping the last report", "err", err)
			return
		}
		got = store.Durability{State: store.DurabilityUnknown, Replicas: -1,
			Warnings: []string{"the store's durability could not be checked yet: " + err.Error()}}
	} else {
		d.due.Store(now.Add(d.interval).UnixNano())
	}
	if got.State == "" {
		got.State = store.DurabilityUnknown
	}
	d.report.Store(&got)
	if first := !d.logged.Swap(true); first || !got.Equal(prev) {
		d.logReport(got)
	}
}

func (d *durability) logReport(r store.Durability) {
	attrs := []any{"durability", r.String()}
	if len(r.Warnings) > 0 {
		attrs = append(attrs, "warnings", strings.Join(r.Warnings, " | "))
	}
	switch {
	case r.State == store.DurabilityAtRisk:
		d.log.Warn("idem: answers the store acknowledged can be lost by a restart or failover of its database, and their keys would then run again on a retry", attrs...)
	case r.State == store.DurabilityUnknown:
		d.log.Warn("idem: the store's durability cannot be confirmed", attrs...)
	case len(r.Warnings) > 0:
		d.log.Warn("idem: store durability checked, with warnings", attrs...)
	default:
		d.log.Info("idem: store durability checked", attrs...)
	}
}

// Durability returns the last report of the store's durability check, and
// false when the store has none (it does not implement
// store.DurabilityChecker). A report older than Config.DurabilityInterval
// is refreshed in the background.
func (e *Engine) Durability() (store.Durability, bool) {
	if e.dur == nil {
		return store.Durability{}, false
	}
	e.dur.tick(time.Now())
	return e.dur.current(), true
}

// errNoDurabilityCheck is the error of RequireDurable on a store without
// a durability check.
func errNoDurabilityCheck(storeName string) error {
	return fmt.Errorf("idem: RequireDurable needs a store that checks its durability (PostgreSQL, MySQL or Redis); the %s store does not", storeName)
}

// errNotDurable is the refusal of RequireDurable.
var errNotDurable = errors.New("idem: the store's durability is not confirmed")

// refusesUndurable returns an error when Config.RequireDurable refuses
// protected requests now, and starts a due durability check either way.
func (e *Engine) refusesUndurable() error {
	d := e.dur
	if d == nil {
		return nil
	}
	d.tick(time.Now()) // the interval is wall time, whatever clock tests give the engine
	if !e.cfg.RequireDurable {
		return nil
	}
	if r := d.current(); r.State != store.DurabilitySafe {
		return fmt.Errorf("%w (RequireDurable): %s: %s", errNotDurable, r.String(), strings.Join(r.Warnings, " | "))
	}
	return nil
}
