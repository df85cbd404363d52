package mysql

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	mysqldrv "github.com/go-sql-driver/mysql"

	"github.com/idem-go/idem/store"
)

// TestKilledConnectionIsRetryable kills, from another session, the
// connection a caller's transaction runs on: the store's next statement in
// it fails as retryable, with the driver's error still reachable.
func TestKilledConnectionIsRetryable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newStore(t)
	tx, err := s.DB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	var id int64
	if err := tx.QueryRowContext(ctx, "SELECT CONNECTION_ID()").Scan(&id); err != nil {
		t.Fatal(err)
	}
	if _, err := s.DB().ExecContext(ctx, "KILL CONNECTION ?", id); err != nil {
		t.Fatal(err)
	}
	_, err = s.ReserveTx(ctx, tx, reserveParams("k"))
	if !store.IsRetryable(err) {
		t.Fatalf("ReserveTx on a killed connection: %v, want a retryable error", err)
	}
	var me *mysqldrv.MySQLError
	if !errors.Is(err, mysqldrv.ErrInvalidConn) && !errors.As(err, &me) {
		t.Fatalf("the driver's error is not reachable: %v", err)
	}
	if _, err := s.Reserve(ctx, reserveParams("k")); err != nil {
		t.Fatalf("Reserve on the pool's other connections: %v", err)
	}
}

// TestRefusedConnectionIsRetryable points a store at a port nobody listens
// on; definite answers stay final.
func TestRefusedConnectionIsRetryable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newStore(t)
	cfg := mysqldrv.NewConfig()
	cfg.Net, cfg.Addr, cfg.User, cfg.DBName = "tcp", "127.0.0.1:1", "root", "test"
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	// New would fail on its probe: this store is what one opened before
	// the server went away looks like.
	down := &Store{db: db, q: db}
	if _, err := down.Get(ctx, "s", "k"); !store.IsRetryable(err) {
		t.Fatalf("Get with the server down: %v, want a retryable error", err)
	}
	if err := s.Delete(ctx, store.DeleteParams{Scope: "s", Key: "missing"}); !errors.Is(err, store.ErrNotFound) || store.IsRetryable(err) {
		t.Fatalf("Delete of a missing record: %v, want a final ErrNotFound", err)
	}
}
