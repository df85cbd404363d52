package maintenance

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/idem-go/idem"
)

// Defaults of Config, exported so that the idem binary's flags state the
// same values.
const (
	DefaultTTL                  = 24 * time.Hour // the engine's default TTL
	DefaultStoreTimeout         = 5 * time.Second
	DefaultSweepInterval        = 15 * time.Second
	DefaultSweepGrace           = 5 * time.Second
	DefaultReapInterval         = time.Minute
	DefaultReconcileInterval    = 10 * time.Second
	DefaultBatchSize            = 100
	DefaultBatchTimeout         = time.Minute
	DefaultBatchPause           = 100 * time.Millisecond
	DefaultAbandonedTTL         = 24 * time.Hour
	DefaultReconcileBackoff     = 30 * time.Second
	DefaultReconcileMaxBackoff  = time.Hour
	DefaultMaxReconcileAttempts = 10
)

// Config configures a Maintainer. The zero value is valid: every field
// has a documented default, applied by New. A negative duration or count
// is an error, not a default.
type Config struct {
	// TTL is how long a response settled as Happened is replayed. Give it
	// the engine's Config.TTL. Defaults to 24h, the engine's default.
	TTL time.Duration

	// StoreTimeout bounds every store call. Defaults to 5s.
	StoreTimeout time.Duration

	// SweepInterval is how often expired leases are swept, and
	// asynchronous requests no worker claimed in time are ended (see
	// ExpirePendingOnce). Defaults to 15s.
	SweepInterval time.Duration

	// SweepGrace is how long past its end a lease must be before the
	// sweeper moves its record to unknown, or the reaper abandons it past
	// its expiry (store.ReapParams.Grace). A live holder whose renewal
	// failed during a store outage renews as soon as the store answers
	// again; the grace keeps the sweeper and the reaper from taking the
	// record from it in that moment. A retry that finds the lease expired
	// still decides at once (the store's Reserve does not wait). Defaults
	// to 5s.
	SweepGrace time.Duration

	// ReapInterval is how often expired records are reaped. Defaults to
	// 1m.
	ReapInterval time.Duration

	// ReconcileInterval is how often due unknown records are reconciled.
	// Reconciliation runs only with a Resolver. Defaults to 10s.
	ReconcileInterval time.Duration

	// BatchSize bounds the records of one store call; a pass runs batch
	// after batch until one comes back short. Defaults to 100.
	BatchSize int

	// BatchTimeout bounds one batch: its store calls and, when
	// reconciling, its Resolver calls, which end StoreTimeout (half the
	// batch at most) before it so that their attempts can be recorded. It
	// must not be shorter than StoreTimeout. Defaults to 1m.
	BatchTimeout time.Duration

	// BatchPause is the pause between two batches of one pass, so that a
	// long pass leaves the store room for requests. Each pause lasts a
	// random time from BatchPause/2 to BatchPause. Defaults to 100ms.
	BatchPause time.Duration

	// SoftExpire keeps expired terminal records as state expired (audit)
	// instead of deleting them. Defaults to false.
	SoftExpire bool

	// AbandonedTTL is how long an abandoned record (in progress or unknown
	// past its expiry) keeps its timeout answer. Defaults to 24h.
	AbandonedTTL time.Duration

	// Resolver settles unknown records. Defaults to nil: no
	// reconciliation; only Settle resolves unknown records.
	Resolver Resolver

	// ReconcileBackoff is the delay after the first attempt that did not
	// settle a record; each further attempt doubles it, up to
	// ReconcileMaxBackoff. Defaults to 30s.
	ReconcileBackoff time.Duration

	// ReconcileMaxBackoff caps the delay between two attempts. It must not
	// be shorter than ReconcileBackoff. Defaults to 1h.
	ReconcileMaxBackoff time.Duration

	// MaxReconcileAttempts dead-letters a record for an operator at its
	// MaxReconcileAttempts-th attempt that does not settle it. Defaults to
	// 10.
	MaxReconcileAttempts int

	// Services are other background workers started and stopped with the
	// maintainer, such as an outbox.Outbox, so that one Start and one Stop
	// run all of an instance's background work. Defaults to none.
	Services []Service

	// Logger receives the services' events: swept zombies, abandoned
	// records, dead letters, failed passes. Defaults to slog.Default().
	Logger *slog.Logger

	// Observer receives the services' metrics (its StoreCall and Event
	// methods), under the same names as the engine's: give it the engine's
	// Observer (package otelidem reports them to OpenTelemetry). Defaults
	// to none.
	Observer idem.Observer

	// Clock tells the time: when the passes of Start are due, how long a
	// store call took. Defaults to the system clock. Records are due by
	// the store's clock, not this one.
	Clock Clock
}

// withDefaults applies the defaults and refuses what no default can mend.
func (c Config) withDefaults() (Config, error) {
	var errs []error
	dur := func(name string, d *time.Duration, def time.Duration) {
		switch {
		case *d < 0:
			errs = append(errs, fmt.Errorf("maintenance: %s must not be negative (got %v)", name, *d))
		case *d == 0:
			*d = def
		}
	}
	count := func(name string, n *int, def int) {
		switch {
		case *n < 0:
			errs = append(errs, fmt.Errorf("maintenance: %s must not be negative (got %d)", name, *n))
		case *n == 0:
			*n = def
		}
	}
	dur("TTL", &c.TTL, DefaultTTL)
	dur("StoreTimeout", &c.StoreTimeout, DefaultStoreTimeout)
	dur("SweepInterval", &c.SweepInterval, DefaultSweepInterval)
	dur("SweepGrace", &c.SweepGrace, DefaultSweepGrace)
	dur("ReapInterval", &c.ReapInterval, DefaultReapInterval)
	dur("ReconcileInterval", &c.ReconcileInterval, DefaultReconcileInterval)
	dur("BatchTimeout", &c.BatchTimeout, DefaultBatchTimeout)
	dur("BatchPause", &c.BatchPause, DefaultBatchPause)
	dur("AbandonedTTL", &c.AbandonedTTL, DefaultAbandonedTTL)
	dur("ReconcileBackoff", &c.ReconcileBackoff, DefaultReconcileBackoff)
	dur("ReconcileMaxBackoff", &c.ReconcileMaxBackoff, DefaultReconcileMaxBackoff)
	count("BatchSize", &c.BatchSize, DefaultBatchSize)
	count("MaxReconcileAttempts", &c.MaxReconcileAttempts, DefaultMaxReconcileAttempts)
	if len(errs) > 0 {
		return c, errors.Join(errs...)
	}
	if c.ReconcileMaxBackoff < c.ReconcileBackoff {
		errs = append(errs, fmt.Errorf("maintenance: ReconcileMaxBackoff (%v) is shorter than ReconcileBackoff (%v)",
			c.ReconcileMaxBackoff, c.ReconcileBackoff))
	}
	if c.BatchTimeout < c.StoreTimeout {
		errs = append(errs, fmt.Errorf("maintenance: BatchTimeout (%v) is shorter than StoreTimeout (%v): a batch would end before its store call could",
			c.BatchTimeout, c.StoreTimeout))
	}
	for i, s := range c.Services {
		if s == nil {
			errs = append(errs, fmt.Errorf("maintenance: Services[%d] is nil", i))
		}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Clock == nil {
		c.Clock = systemClock{}
	}
	return c, errors.Join(errs...)
}

// Clock is the time of a Maintainer. Tests give one they step by hand, so
// that they pin the cadence of the passes without sleeping.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// After returns a channel that receives once d has passed, as
	// time.After does.
	After(d time.Duration) <-chan time.Time
}

// systemClock is the system's clock.
type systemClock struct{}

func (systemClock) Now() time.Time                         { return time.Now() }
func (systemClock) After(d time.Duration) <-chan time.Time { return time.After(d) }
