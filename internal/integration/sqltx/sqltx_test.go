package sqltx_test

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"testing"

	"github.com/idem-go/idem/internal/sqltx"
	_ "modernc.org/sqlite"
)

func TestRun(t *testing.T) {
	db, err := sql.Open("sqlite", filepath.Join(t.TempDir(), "t.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	if _, err := db.Exec(`CREATE TABLE t (v INTEGER)`); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	err = sqltx.Run(ctx, db, func(tx *sql.Tx) error {
		tx.Exec(`INSERT INTO t VALUES (1)`)
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("Run returned %v, want the function's error", err)
	}
	if err := sqltx.Run(ctx, db, func(tx *sql.Tx) error {
		_, err := tx.Exec(`INSERT INTO t VALUES (2)`)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	var sum int
	if err := db.QueryRow(`SELECT coalesce(sum(v), 0) FROM t`).Scan(&sum); err != nil || sum != 2 {
		t.Fatalf("committed rows sum to %d (%v), want 2: the failed transaction must roll back", sum, err)
	}
}
