// Package benchdb holds what the benchmark commands share to run on
// scratch PostgreSQL schemas: a schema made and dropped by name, and the
// URL that points a store or a process at it, so that the store's own
// migrations create its tables there.
package benchdb

import (
	"context"
	"fmt"
	"net/url"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Execer runs a statement: a *pgx.Conn or a *pgxpool.Pool.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// CreateSchema creates the schema name, which must not exist yet.
func CreateSchema(ctx context.Context, db Execer, name string) error {
	_, err := db.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{name}.Sanitize())
	return err
}

// DropSchema drops the schema name and all it holds. It runs as a
// benchmark ends, so it has no context to honour and nothing to report.
func DropSchema(db Execer, name string) {
	_, _ = db.Exec(context.Background(), "DROP SCHEMA "+pgx.Identifier{name}.Sanitize()+" CASCADE")
}

// WithSearchPath returns the PostgreSQL URL raw with its search_path set
// to schema: a store opened on it keeps its tables there.
func WithSearchPath(raw, schema string) (string, error) {
	return WithParam(raw, "search_path", schema)
}

// WithParam returns the URL raw with its query parameter k set to v.
func WithParam(raw, k, v string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme == "" {
		return "", fmt.Errorf("setting %s: %q is not a PostgreSQL URL", k, raw)
	}
	q := u.Query()
	q.Set(k, v)
	u.RawQuery = q.Encode()
	return u.String(), nil
}
