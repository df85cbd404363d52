package cli

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-go/idem/internal/testkit/pgdb"
	"github.com/idem-go/idem/internal/testkit/testenv"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/store/sqlite"
)

// appOutbox is an application's outbox as the commands find it: a message
// enqueued in the application's transaction, delivered by its workers to a
// provider that fails until up is set.
type appOutbox struct {
	dsn     string
	up      atomic.Bool
	calls   atomic.Int64
	enqueue func(t *testing.T, msg outbox.Message)
	start   func(t *testing.T) (stop func())
	get     func(t *testing.T, key, kind string) outbox.Delivery
}

func newAppOutbox(t *testing.T, dsn string) *appOutbox {
	a := &appOutbox{dsn: dsn}
	cfg := outbox.Config{
		MaxAttempts:        1,
		PollInterval:       50 * time.Millisecond,
		DeadLetterInterval: 50 * time.Millisecond,
		Deliverers: map[string]outbox.Deliverer{"charge": outbox.DelivererFunc(func(ctx context.Context, msg outbox.Message) (string, error) {
			a.calls.Add(1)
			if !a.up.Load() {
				return "", errors.New("provider unavailable: 503")
			}
			return "ch_" + msg.Key[len(msg.Key)-4:], nil
		})},
		OnDead: func(context.Context, outbox.Message, error) error { return nil },
		Logger: slog.New(slog.DiscardHandler),
	}
	ctx := context.Background()
	if strings.HasPrefix(dsn, "sqlite:") {
		s, err := sqlite.Open(ctx, strings.TrimPrefix(dsn, "sqlite:"), sqlite.Config{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		ob, err := outbox.NewSQLite(s.DB(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		wire(a, t, ob, func(fn func(*sql.Tx) error) error {
			tx, err := s.DB().BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			if err := fn(tx); err != nil {
				tx.Rollback()
				return err
			}
			return tx.Commit()
		})
		return a
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	ob, err := outbox.NewPostgres(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	wire(a, t, ob, func(fn func(pgx.Tx) error) error { return pgx.BeginFunc(ctx, pool, fn) })
	return a
}

// wire sets a's functions on ob, whose transactions inTx runs.
func wire[TTx any](a *appOutbox, t *testing.T, ob *outbox.Outbox[TTx], inTx func(func(TTx) error) error) {
	ctx := context.Background()
	if err := ob.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	a.enqueue = func(t *testing.T, msg outbox.Message) {
		if err := inTx(func(tx TTx) error { return ob.EnqueueTx(ctx, tx, msg) }); err != nil {
			t.Fatal(err)
		}
	}
	a.start = func(t *testing.T) func() {
		if err := ob.Start(ctx); err != nil {
			t.Fatal(err)
		}
		return func() {
			if err := ob.Stop(ctx); err != nil {
				t.Error(err)
			}
		}
	}
	a.get = func(t *testing.T, key, kind string) outbox.Delivery {
		d, err := ob.Delivery(ctx, key, kind)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
}

// waitState waits until the message of key reaches state.
func (a *appOutbox) waitState(t *testing.T, key string, state outbox.State) outbox.Delivery {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		d := a.get(t, key, "charge")
		if d.State == state {
			return d
		}
		if time.Now().After(deadline) {
			t.Fatalf("message %s is %s after 20s, want %s", key, d.State, state)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestOutboxCommands: a charge the provider refused until its last attempt
// is listed dead, shown, redelivered from the command line, and delivered
// by the application's own workers once the provider is back; the
// commands refuse what they cannot do with a reason.
func TestOutboxCommands(t *testing.T) {
	t.Parallel()
	dbs := map[string]string{"sqlite": "sqlite:" + filepath.Join(t.TempDir(), "app.db")}
	if testenv.PostgresURL(t) != "" {
		dbs["postgres"] = pgdb.URL(t, testenv.PostgresURL(t))
	}
	for name, dsn := range dbs {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			a := newAppOutbox(t, dsn)
			key := outbox.KeyFor("0:POST /v1/payments", "order-42", "charge")
			a.enqueue(t, outbox.Message{Key: key, Kind: "charge", Fence: 7, Payload: []byte(`{"amount":4200}`)})
			stop := a.start(t)
			a.waitState(t, key, outbox.Dead)
			stop()

			out, _, err := run("outbox", "dead", "--store", dsn, "--json")
			var dead []deliveryView
			if err != nil || json.Unmarshal([]byte(out), &dead) != nil || len(dead) != 1 ||
				dead[0].Key != key || dead[0].Kind != "charge" || dead[0].State != outbox.Dead || dead[0].Fence != 7 ||
				!strings.Contains(dead[0].LastError, "provider unavailable") {
				t.Fatalf("outbox dead --json: %v\n%s", err, out)
			}
			out, _, err = run("outbox", "dead", "--store", dsn)
			if err != nil || !strings.Contains(out, key) || !strings.Contains(out, "provider unavailable: 503") {
				t.Fatalf("outbox dead: %v\n%s", err, out)
			}
			if out, stderr, err := run("outbox", "dead", "--store", dsn, "--queue", "other"); err != nil || out != "" ||
				!strings.Contains(stderr, "no dead-lettered messages") {
				t.Fatalf("outbox dead of another queue: %v %q %q", err, out, stderr)
			}
			out, _, err = run("outbox", "show", "--store", dsn, "--kind", "charge", key)
			if err != nil || !strings.Contains(out, "state:") || !strings.Contains(out, "dead") {
				t.Fatalf("outbox show: %v\n%s", err, out)
			}

			a.up.Store(true)
			out, _, err = run("outbox", "redeliver", "--store", dsn, "--kind", "charge", "--json", key)
			var d deliveryView
			if err != nil || json.Unmarshal([]byte(out), &d) != nil || d.State != outbox.Pending || d.Fence != 7 {
				t.Fatalf("outbox redeliver: %v\n%s", err, out)
			}
			stop = a.start(t)
			got := a.waitState(t, key, outbox.Delivered)
			stop()
			if got.DownstreamID != "ch_"+key[len(key)-4:] || a.calls.Load() != 2 {
				t.Fatalf("after the redelivery: %+v, %d calls to the provider", got, a.calls.Load())
			}
			if out, _, err := run("outbox", "dead", "--store", dsn, "--json"); err != nil || strings.TrimSpace(out) != "[]" {
				t.Fatalf("dead letters after the redelivery: %v %s", err, out)
			}
			out, _, err = run("outbox", "show", "--store", dsn, "--kind", "charge", "--json", key)
			if err != nil || json.Unmarshal([]byte(out), &d) != nil || d.State != outbox.Delivered || d.DownstreamID != got.DownstreamID {
				t.Fatalf("outbox show after delivery: %v\n%s", err, out)
			}

			for _, c := range []struct {
				args  []string
				usage bool
				want  string
			}{
				{[]string{"redeliver", "--kind", "charge", key}, false, "is delivered, not dead"},
				{[]string{"show", "--kind", "charge", "idem_nothing"}, false, "message not found"},
				{[]string{"show", key}, true, "--kind is required"},
				{[]string{"show", "--kind", "charge", key, "again"}, true, "want one KEY"},
				{[]string{"redeliver", "--kind", "charge", "--max-attempts", "0", key}, true, "--max-attempts must be positive"},
				{[]string{"dead", "--limit", "0"}, true, "--limit must be from 1 to 10000"},
			} {
				args := append([]string{"outbox", c.args[0], "--store", dsn}, c.args[1:]...)
				var stderr strings.Builder
				err := Run(context.Background(), args, new(strings.Builder), &stderr)
				msg := ""
				if err != nil {
					msg = err.Error()
				}
				if err == nil || errors.Is(err, ErrUsage) != c.usage || !strings.Contains(msg+stderr.String(), c.want) {
					t.Errorf("idem %s: %v (usage error %v)\n%s", strings.Join(args, " "), err, errors.Is(err, ErrUsage), stderr.String())
				}
			}
		})
	}
}

// TestOutboxCommandsRefuseOtherDatabases: the outbox lives in PostgreSQL
// or SQLite; a SQLite file that does not exist is not created.
func TestOutboxCommandsRefuseOtherDatabases(t *testing.T) {
	t.Parallel()
	missing := filepath.Join(t.TempDir(), "none.db")
	for _, c := range []struct {
		store string
		usage bool
		want  string
	}{
		{"memory:", true, "an outbox lives in PostgreSQL or SQLite"},
		{"redis://127.0.0.1:6379/0", true, "an outbox lives in PostgreSQL or SQLite"},
		{"sqlite:" + missing, false, "does not exist"},
		{"ftp://x", true, "unsupported store DSN"},
	} {
		var stderr strings.Builder
		err := Run(context.Background(), []string{"outbox", "dead", "--store", c.store}, new(strings.Builder), &stderr)
		msg := ""
		if err != nil {
			msg = err.Error()
		}
		if err == nil || errors.Is(err, ErrUsage) != c.usage || !strings.Contains(msg+stderr.String(), c.want) {
			t.Errorf("--store %s: %v\n%s", c.store, err, stderr.String())
		}
	}
	if _, err := os.Stat(missing); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the command created %s: %v", missing, err)
	}
}
