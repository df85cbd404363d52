package postgres

import (
	"context"
	"errors"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-go/idem/store"
)

// Poolers.
//
// A connection pooler such as pgbouncer in transaction mode hands each
// transaction of a client connection to whichever server connection is
// free. Everything a server connection keeps between transactions is then
// shared by strangers: session settings, session advisory locks and named
// prepared statements. The store keeps no session state (its settings and
// locks are transaction-scoped: set_config(..., true) and
// pg_advisory_xact_lock), but pgx's default query mode,
// QueryExecModeCacheStatement, prepares every statement under a name once
// per client connection and then only executes it by name. Behind a
// transaction pooler that name is missing on the next server connection
// (SQLSTATE 26000) or, after a restart of the client, already taken by the
// previous process's statement of the same text (42P05).
//
// So the store looks for a pooler when it starts: a pooler answers the
// connection with its own cancel key, so the process id the client was given
// differs from the one the server reports for the session
// (pg_backend_pid()). Behind one, Open runs its pool in
// QueryExecModeCacheDescribe, which sends each statement unnamed, in the same
// single round trip, with result types described once per connection and
// then cached in the client. That is safe in transaction and session
// pooling alike. A URL that names default_query_exec_mode keeps the mode it
// names.

// poolerSafe reports whether a query mode keeps nothing on the server
// between round trips.
func poolerSafe(m pgx.QueryExecMode) bool {
	switch m {
	case pgx.QueryExecModeCacheDescribe, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol:
		return true
	}
	return false
}

// behindPooler reports whether conn reaches PostgreSQL through a pooler. The
// probe runs in the simple protocol, so it prepares nothing.
func behindPooler(ctx context.Context, conn *pgx.Conn) (bool, error) {
	var pid uint32
	if err := conn.QueryRow(ctx, "SELECT pg_backend_pid()", pgx.QueryExecModeSimpleProtocol).Scan(&pid); err != nil {
		return false, err
	}
	return pid != conn.PgConn().PID(), nil
}

// choosePoolMode sets the query mode of a pool that Open is about to create:
// QueryExecModeCacheDescribe behind a pooler, unless the URL names a mode.
func choosePoolMode(ctx context.Context, url string, pcfg *pgxpool.Config) error {
	if strings.Contains(url, "default_query_exec_mode") {
		return nil
	}
	conn, err := pgx.ConnectConfig(ctx, pcfg.ConnConfig.Copy())
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	pooled, err := behindPooler(ctx, conn)
	if err != nil {
		return err
	}
	if pooled {
		pcfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
	}
	return nil
}

// errPoolerMode is New's refusal of a pool that prepares named statements
// through a pooler.
var errPoolerMode = errors.New("idem/postgres: the pool reaches PostgreSQL through a connection pooler " +
	"(pgbouncer or similar), and its query mode prepares named statements, which a pooler in transaction " +
	"mode hands to other clients' connections; set default_query_exec_mode=cache_describe in the URL " +
	"(or pgx.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe), or let postgres.Open make the pool")

// checkPoolMode refuses a caller's pool whose query mode a pooler would
// break. A pool that cannot connect yet is let through when skip is set
// (the store then connects lazily, as pgxpool does); otherwise the error is
// returned, as the migration would have returned it.
func checkPoolMode(ctx context.Context, pool *pgxpool.Pool, skip bool) error {
	if poolerSafe(pool.Config().ConnConfig.DefaultQueryExecMode) {
		return nil
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		if skip {
			return nil
		}
		return wrap(ctx, "open", err)
	}
	defer conn.Release()
	pooled, err := behindPooler(ctx, conn.Conn())
	switch {
	case err != nil && skip:
		return nil
	case err != nil:
		return wrap(ctx, "open", err)
	case pooled:
		return errors.Join(store.ErrInvalidParams, errPoolerMode)
	}
	return nil
}

// poolerHint explains the server errors that mean a named prepared
// statement went missing or was taken by another client: a pooler in
// transaction mode with a query mode that prepares statements.
func poolerHint(pgErr *pgconn.PgError) string {
	switch pgErr.Code {
	case "26000", "42P05": // invalid_sql_statement_name, duplicate_prepared_statement
		return " (a connection pooler such as pgbouncer in transaction mode is likely between idem and " +
			"PostgreSQL, with a query mode that prepares named statements; use default_query_exec_mode=cache_describe " +
			"in the URL, or leave default_query_exec_mode out and let the store choose)"
	}
	return ""
}
