// Package appoutbox is an application's outbox as the idem outbox commands
// find it, for their tests: a charge enqueued in the application's own
// transaction and delivered by its own workers to a provider that fails
// until the test says it is back, in PostgreSQL or SQLite.
package appoutbox

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-go/idem/internal/sqltx"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/store/sqlite"
)

// Kind is the kind of message the application's provider delivers.
const Kind = "charge"

// App is the application. Each message gets one delivery attempt, then it
// is dead-lettered.
type App struct {
	// Up makes the provider accept deliveries; until it is set, each fails
	// with "provider unavailable: 503".
	Up atomic.Bool
	// Calls counts the deliveries tried.
	Calls atomic.Int64

	enqueue func(t testing.TB, msg outbox.Message)
	start   func(t testing.TB) (stop func())
	get     func(t testing.TB, key string) outbox.Delivery
	close   func()
}

// New opens the application's outbox in the database of dsn, a PostgreSQL
// URL or "sqlite:" and a file path, and migrates it. It is closed when the
// test ends, or by Close.
func New(t testing.TB, dsn string) *App {
	t.Helper()
	a := &App{}
	cfg := outbox.Config{
		MaxAttempts:        1,
		PollInterval:       50 * time.Millisecond,
		DeadLetterInterval: 50 * time.Millisecond,
		Deliverers: map[string]outbox.Deliverer{Kind: outbox.DelivererFunc(func(ctx context.Context, msg outbox.Message) (string, error) {
			a.Calls.Add(1)
			if !a.Up.Load() {
				return "", errors.New("provider unavailable: 503")
			}
			return DownstreamID(msg.Key), nil
		})},
		OnDead: func(context.Context, outbox.Message, error) error { return nil },
		Logger: slog.New(slog.DiscardHandler),
	}
	ctx := context.Background()
	if path, ok := strings.CutPrefix(dsn, "sqlite:"); ok {
		s, err := sqlite.Open(ctx, path, sqlite.Config{})
		if err != nil {
			t.Fatal(err)
		}
		a.closeWith(t, func() { s.Close() })
		ob, err := outbox.NewSQLite(s.DB(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		wire(a, t, ob, func(fn func(*sql.Tx) error) error { return sqltx.Run(ctx, s.DB(), fn) })
		return a
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	a.closeWith(t, pool.Close)
	ob, err := outbox.NewPostgres(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	wire(a, t, ob, func(fn func(pgx.Tx) error) error { return pgx.BeginFunc(ctx, pool, fn) })
	return a
}

// Charge is the message the tests dead-letter: the charge of key
// order-42 on POST /v1/payments, under fence.
func Charge(fence int64) outbox.Message {
	return outbox.Message{Key: outbox.KeyFor("0:POST /v1/payments", "order-42", Kind), Kind: Kind, Fence: fence,
		Payload: []byte(`{"amount":4200}`)}
}

// DownstreamID is the provider's id of the delivered message of key.
func DownstreamID(key string) string { return "ch_" + key[len(key)-4:] }

// closeWith makes f the App's Close, run once, at the latest when the test
// ends.
func (a *App) closeWith(t testing.TB, f func()) {
	a.close = sync.OnceFunc(f)
	t.Cleanup(a.close)
}

// wire sets a's functions on ob, whose transactions inTx runs.
func wire[TTx any](a *App, t testing.TB, ob *outbox.Outbox[TTx], inTx func(func(TTx) error) error) {
	ctx := context.Background()
	if err := ob.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	a.enqueue = func(t testing.TB, msg outbox.Message) {
		if err := inTx(func(tx TTx) error { return ob.EnqueueTx(ctx, tx, msg) }); err != nil {
			t.Fatal(err)
		}
	}
	a.start = func(t testing.TB) func() {
		if err := ob.Start(ctx); err != nil {
			t.Fatal(err)
		}
		return func() {
			if err := ob.Stop(ctx); err != nil {
				t.Error(err)
			}
		}
	}
	a.get = func(t testing.TB, key string) outbox.Delivery {
		d, err := ob.Delivery(ctx, key, Kind)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
}

// Enqueue enqueues msg in a transaction of the application's.
func (a *App) Enqueue(t testing.TB, msg outbox.Message) { t.Helper(); a.enqueue(t, msg) }

// Start starts the application's workers; stop stops them.
func (a *App) Start(t testing.TB) (stop func()) { t.Helper(); return a.start(t) }

// WaitState waits until the message of key reaches state.
func (a *App) WaitState(t testing.TB, key string, state outbox.State) outbox.Delivery {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		d := a.get(t, key)
		if d.State == state {
			return d
		}
		if time.Now().After(deadline) {
			t.Fatalf("message %s is %s after 20s, want %s", key, d.State, state)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Dead enqueues msg and runs the workers until its one attempt failed and
// it is dead-lettered.
func (a *App) Dead(t testing.TB, msg outbox.Message) {
	t.Helper()
	a.Enqueue(t, msg)
	stop := a.Start(t)
	defer stop()
	a.WaitState(t, msg.Key, outbox.Dead)
}

// Close closes the application's database handle before the test ends, so
// that its files may be copied whole.
func (a *App) Close() { a.close() }
