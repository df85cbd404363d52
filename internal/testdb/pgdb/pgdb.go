// Package pgdb gives each test a fresh, private PostgreSQL schema.
package pgdb

import (
	"context"
	"testing"

	"github.com/idem-go/idem/internal/testkit/testenv"
	"github.com/jackc/pgx/v5"
)

// Schema creates an empty schema on the server at url, dropped when
// the test ends, and returns its name.
func Schema(tb testing.TB, url string) string {
	tb.Helper()
	schema := testenv.Name("idem_test_")
	exec := func(q string) error {
		ctx := context.Background()
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, q)
		return err
	}
	ident := pgx.Identifier{schema}.Sanitize()
	if err := exec("CREATE SCHEMA " + ident); err != nil {
		tb.Fatalf("pgdb: create schema: %v", err)
	}
	tb.Cleanup(func() {
		if err := exec("DROP SCHEMA " + ident + " CASCADE"); err != nil {
			tb.Errorf("pgdb: drop schema %s: %v", schema, err)
		}
	})
	return schema
}

// URL returns url with its search_path set to a fresh schema (see Schema):
// a store opened on it finds its tables the way a deployment without a
// configured schema does.
func URL(tb testing.TB, url string) string {
	tb.Helper()
	return testenv.WithParam(tb, url, "search_path", Schema(tb, url))
}
