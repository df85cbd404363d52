package payments

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/maintenance"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/postgres"
	"github.com/idem-go/idem/store/sqlite"
)

// Config configures a Service. Zero values take the documented defaults.
type Config struct {
	// DB holds the payments, the idempotency records and the outbox, so
	// that one transaction can write all three: "sqlite:PATH" or a
	// postgres:// URL (add search_path=SCHEMA to pick a schema). Defaults
	// to "sqlite:payments.db".
	DB string
	// ProviderURL is the base URL of the card provider. Required.
	ProviderURL string
	// ProviderTimeout bounds one call to the provider; a call that takes
	// longer has an unknown outcome. Defaults to 3s.
	ProviderTimeout time.Duration
	// Lease is the idempotency lease (idem.Config.Lease). Defaults to idem's
	// 30s.
	Lease time.Duration
	// Wait makes a duplicate of a request in flight wait for it and replay
	// its answer instead of getting 409 (idem.Config.Wait). Defaults to 0.
	Wait time.Duration
	// SweepInterval and ReconcileInterval pace the maintainer: expired
	// leases are swept, and unknown outcomes reconciled, that often.
	// Default to 15s and 5s. A record that the provider cannot settle yet
	// is asked about again after ReconcileInterval, doubling.
	SweepInterval     time.Duration
	ReconcileInterval time.Duration
	// OutboxBackoff is the delay after a failed charge attempt, times the
	// attempt number, at most a minute. Defaults to 1s.
	OutboxBackoff time.Duration
	// OutboxPollInterval is how often the outbox looks for charges to make
	// when no notification woke it. Defaults to outbox's 1s.
	OutboxPollInterval time.Duration
	// Logger receives the service's events. Defaults to slog.Default().
	Logger *slog.Logger
	// Clock is the time of the idempotency store and of the payments'
	// created times. Defaults to the database's clock and time.Now; tests
	// move it to expire leases without sleeping.
	Clock store.Clock

	hooks hooks
}

// hooks let tests stop a request at a chosen point, in process.
type hooks struct {
	// beforePayment runs in the payment handler before its transaction.
	beforePayment func(x *idem.Execution) error
	// beforePhase runs at the start of each refund phase, inside its
	// transaction; an error fails the phase.
	beforePhase func(x *idem.Execution, phase string) error
	// manualMaintenance leaves the maintainer to the test (SweepOnce,
	// ReconcileOnce) instead of Start.
	manualMaintenance bool
}

func (c Config) withDefaults() (Config, error) {
	if c.DB == "" {
		c.DB = "sqlite:payments.db"
	}
	if c.ProviderURL == "" {
		return c, errors.New("payments: ProviderURL is required")
	}
	c.ProviderURL = strings.TrimSuffix(c.ProviderURL, "/")
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&c.ProviderTimeout, 3*time.Second)
	def(&c.SweepInterval, 15*time.Second)
	def(&c.ReconcileInterval, 5*time.Second)
	def(&c.OutboxBackoff, time.Second)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c, nil
}

// Service is the payments service: its HTTP API and its background work
// (the outbox worker that charges cards, the idempotency maintainer).
type Service struct {
	handler http.Handler
	core    core
}

// core is the part of the service that depends on the database's
// transaction type; app[TTx] implements it.
type core interface {
	start(ctx context.Context) error
	stop(ctx context.Context) error
	close() error
	maintainer() *maintenance.Maintainer
	resolve(ctx context.Context, rec store.Record) (maintenance.Resolution, error)
	store() store.Store
	refundCount(ctx context.Context, paymentID string) (int, error)
}

// Open connects to cfg.DB, creates the tables it lacks (payments, idem's
// records, the outbox's) and returns the service, not started.
func Open(ctx context.Context, cfg Config) (*Service, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	switch {
	case strings.HasPrefix(cfg.DB, "sqlite:"):
		return openSQLite(ctx, strings.TrimPrefix(cfg.DB, "sqlite:"), cfg)
	case strings.HasPrefix(cfg.DB, "postgres://"), strings.HasPrefix(cfg.DB, "postgresql://"):
		return openPostgres(ctx, cfg.DB, cfg)
	}
	return nil, fmt.Errorf("payments: database %q: want sqlite:PATH or a postgres:// URL", cfg.DB)
}

func openSQLite(ctx context.Context, path string, cfg Config) (*Service, error) {
	st, err := sqlite.Open(ctx, path, sqlite.Config{Clock: cfg.Clock})
	if err != nil {
		return nil, err
	}
	// The outbox shares the store's writer: the same file, the same
	// transactions.
	a, err := newApp(ctx, cfg, st, sqliteConn{st.DB()}, sqliteSchema,
		func(c outbox.Config) (*outbox.Outbox[*sql.Tx], error) { return outbox.NewSQLite(st.DB(), c) })
	if err != nil {
		return nil, errors.Join(err, st.Close())
	}
	a.closers = []func() error{st.Close}
	return &Service{handler: a.routes(), core: a}, nil
}

func openPostgres(ctx context.Context, url string, cfg Config) (*Service, error) {
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("payments: %w", err)
	}
	// The store sees a commit a synchronous standby did not confirm
	// (postgres.Open's pools do this themselves).
	postgres.WatchStandbyWaits(pcfg)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("payments: %w", err)
	}
	st, err := postgres.New(ctx, pool, postgres.Config{Clock: cfg.Clock})
	if err != nil {
		pool.Close()
		return nil, err
	}
	a, err := newApp(ctx, cfg, st, postgresConn{pool}, postgresSchema,
		func(c outbox.Config) (*outbox.Outbox[pgx.Tx], error) { return outbox.NewPostgres(pool, c) })
	if err != nil {
		pool.Close()
		return nil, err
	}
	a.closers = []func() error{st.Close, func() error { pool.Close(); return nil }}
	return &Service{handler: a.routes(), core: a}, nil
}

// Handler returns the HTTP API.
func (s *Service) Handler() http.Handler { return s.handler }

// Start starts the background work: the outbox worker that charges the
// cards and the maintainer (sweeper, reaper, reconciler). ctx must outlive
// them.
func (s *Service) Start(ctx context.Context) error { return s.core.start(ctx) }

// Stop stops the background work, waiting for running deliveries until ctx
// is done.
func (s *Service) Stop(ctx context.Context) error { return s.core.stop(ctx) }

// Close closes the database. Stop first.
func (s *Service) Close() error { return s.core.close() }
