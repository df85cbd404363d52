// Package pgdb gives each test a fresh, private PostgreSQL schema.
//
// It imports no driver, so that the core module, which holds it, never
// requires one and no store module requires a test-only module: it talks
// to the server through database/sql under the driver name "pgx", which a
// test registers by importing github.com/jackc/pgx/v5/stdlib (a module
// with a PostgreSQL test requires pgx already).
package pgdb

import (
	"context"
	"database/sql"
	"testing"

	"github.com/idem-go/idem/internal/testkit/testenv"
)

// Schema creates an empty schema on the server at url, dropped when
// the test ends, and returns its name.
func Schema(tb testing.TB, url string) string {
	tb.Helper()
	schema := testenv.Name("idem_test_")
	exec := func(q string) error {
		db, err := sql.Open("pgx", url)
		if err != nil {
			return err
		}
		defer db.Close()
		_, err = db.ExecContext(context.Background(), q)
		return err
	}
	// schema is generated hex: quoting it is all it needs.
	ident := `"` + schema + `"`
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
