package postgres_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/postgres"
)

// TestTerminatedConnectionIsRetryable kills the store's only connection
// from the server side, as a failover or an administrator would: the next
// call fails as retryable, with the driver's error still reachable, and the
// one after it succeeds on a new connection.
func TestTerminatedConnectionIsRetryable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := newSchema(t)
	cfg, err := pgxpool.ParseConfig(testURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s, err := postgres.New(ctx, pool, postgres.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	p := reserveParams("k")
	if _, err := s.Reserve(ctx, p); err != nil {
		t.Fatal(err)
	}
	var pid uint32
	if err := pool.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	var killed bool
	if err := adminConn(t).QueryRow(ctx, "SELECT pg_terminate_backend($1)", pid).Scan(&killed); err != nil || !killed {
		t.Fatalf("pg_terminate_backend: %v %v", killed, err)
	}
	_, err = s.Get(ctx, p.Scope, p.Key)
	if !store.IsRetryable(err) {
		t.Fatalf("Get on a terminated connection: %v, want a retryable error", err)
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code != "57P01" {
		t.Fatalf("driver error %s, want 57P01 (or a broken connection)", pgErr.Code)
	}
	if _, err := s.Get(ctx, p.Scope, p.Key); err != nil {
		t.Fatalf("Get on a new connection: %v", err)
	}
}

// TestRefusedConnectionIsRetryable points a store at a port nobody
// listens on; a canceled context and definite answers stay final.
func TestRefusedConnectionIsRetryable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:1/test?sslmode=disable&connect_timeout=5")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s, err := postgres.New(ctx, pool, postgres.Config{SkipMigrate: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Reserve(ctx, reserveParams("k")); !store.IsRetryable(err) {
		t.Fatalf("Reserve with the server down: %v, want a retryable error", err)
	}
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := s.Reserve(canceled, reserveParams("k")); err == nil || store.IsRetryable(err) {
		t.Fatalf("Reserve with a canceled context: %v, want a final error", err)
	}
	live := openStore(t, newSchema(t), nil)
	if err := live.Complete(ctx, store.CompleteParams{FenceParams: store.FenceParams{Scope: "s", Key: "k", Fence: 1},
		Response: okResponse()}); !errors.Is(err, store.ErrLeaseLost) || store.IsRetryable(err) {
		t.Fatalf("Complete of a missing record: %v, want a final ErrLeaseLost", err)
	}
}
