package postgres_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-go/idem/internal/testkit/pgdb"
	"github.com/idem-go/idem/internal/testkit/testenv"
	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/postgres"
	"github.com/idem-go/idem/store/storetest"
	_ "github.com/jackc/pgx/v5/stdlib"
)

// queryModes are four of pgx's five values of default_query_exec_mode;
// TestConformance runs the fifth, cache_statement, pgx's default.
var queryModes = []string{"cache_describe", "describe_exec", "exec", "simple_protocol"}

// smallPool sizes the pools of the suites that run beside TestConformance:
// the server's connections are shared with every other test.
const smallPool = 4

// conformance runs the store suite on stores opened on u with cfg, each
// test in a schema of its own: named in the URL's search_path as a
// deployment without Config.Schema does, or with searchPath false in
// Config.Schema (a pooler refuses search_path as a startup parameter).
func conformance(t *testing.T, u string, cfg postgres.Config, searchPath bool) {
	storetest.Run(t, storetest.Harness{
		NewDatabase: func(t *testing.T) storetest.Opener {
			schema, url := pgdb.Schema(t, u), u
			if searchPath {
				url = testenv.WithParam(t, u, "search_path", schema)
			}
			return func(t *testing.T, clock store.Clock) store.Store {
				c := cfg
				if !searchPath {
					c.Schema = schema
				}
				c.Clock = clock
				s, err := postgres.Open(context.Background(), url, c)
				if err != nil {
					t.Fatalf("open: %v", err)
				}
				t.Cleanup(func() { s.Close() })
				return s
			}
		},
		Durable:     true,
		Shared:      true,
		NoTenantCap: !cfg.TenantCap,
		ReapWidth:   cfg.Partitions,
	})
}

// TestConformanceQueryModes runs the store suite in each of pgx's query
// modes, named in the URL as a user would: the modes that send parameters
// without asking the server for their types (exec, simple_protocol) must
// store every column as the others do.
func TestConformanceQueryModes(t *testing.T) {
	base := testURL(t)
	for _, mode := range queryModes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			conformance(t, testenv.WithParam(t, base, "default_query_exec_mode", mode), postgres.Config{MaxConns: smallPool, TenantCap: true}, false)
		})
	}
}

// TestConformancePgbouncer runs the store suite through pgbouncer in
// transaction and in session pooling mode, with the plain URL.
func TestConformancePgbouncer(t *testing.T) {
	for _, db := range []string{testenv.PgbouncerTx, testenv.PgbouncerSession} {
		t.Run(db, func(t *testing.T) {
			t.Parallel()
			u := testenv.PgbouncerURL(t, db)
			// A session pool holds a server connection per client
			// connection: the suite's small pools keep it within the
			// pooler's server connections.
			conformance(t, u, postgres.Config{MaxConns: smallPool, TenantCap: true}, false)
		})
	}
}

// TestOpenChoosesTheModeForAPooler checks the mode Open gives its pool: the
// cached statements of pgx's default on a direct connection, unnamed
// statements behind a pooler, and whatever the URL names in either case.
func TestOpenChoosesTheModeForAPooler(t *testing.T) {
	direct := testURL(t)
	pooled := testenv.PgbouncerURL(t, testenv.PgbouncerTx)
	for _, c := range []struct {
		name, url string
		want      pgx.QueryExecMode
	}{
		{"direct", direct, pgx.QueryExecModeCacheStatement},
		{"pgbouncer", pooled, pgx.QueryExecModeCacheDescribe},
		{"pgbouncer, mode named", testenv.WithParam(t, pooled, "default_query_exec_mode", "exec"), pgx.QueryExecModeExec},
		{"direct, mode named", testenv.WithParam(t, direct, "default_query_exec_mode", "simple_protocol"), pgx.QueryExecModeSimpleProtocol},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, err := postgres.Open(t.Context(), c.url, postgres.Config{Schema: pgdb.Schema(t, c.url), MaxConns: 2})
			if err != nil {
				t.Fatalf("open: %v", err)
			}
			defer s.Close()
			if got := s.Pool().Config().ConnConfig.DefaultQueryExecMode; got != c.want {
				t.Fatalf("query mode %v, want %v", got, c.want)
			}
		})
	}
}

// TestRestartBehindTransactionPooler is a process that stops and starts
// again behind pgbouncer in transaction mode with one server connection:
// the second store meets the server connection the first one used, with
// whatever the first left on it. With named prepared statements that is
// "prepared statement already exists" at the migration, then at every
// statement.
func TestRestartBehindTransactionPooler(t *testing.T) {
	u := testenv.PgbouncerURL(t, testenv.PgbouncerTxOne)
	schema := pgdb.Schema(t, u)
	ctx := t.Context()
	for run := range 3 {
		s, err := postgres.Open(ctx, u, postgres.Config{Schema: schema, MaxConns: 2})
		if err != nil {
			t.Fatalf("run %d: open: %v", run, err)
		}
		p := reserveParams("restart-" + string(rune('a'+run)))
		res, err := s.Reserve(ctx, p)
		if err != nil || res.Outcome != store.Created {
			s.Close()
			t.Fatalf("run %d: reserve: %+v %v", run, res, err)
		}
		if err := s.Complete(ctx, store.CompleteParams{FenceParams: store.FenceParams{Scope: p.Scope, Key: p.Key,
			Fence: res.Record.Fence}, Response: okResponse()}); err != nil {
			s.Close()
			t.Fatalf("run %d: complete: %v", run, err)
		}
		if run > 0 { // the previous run's answer replays
			prev := reserveParams("restart-" + string(rune('a'+run-1)))
			res, err := s.Reserve(ctx, prev)
			if err != nil || res.Outcome != store.Existing || res.Record.State != store.StateCompleted {
				s.Close()
				t.Fatalf("run %d: replay of run %d: %+v %v", run, run-1, res, err)
			}
		}
		s.Close()
	}
}

// TestNewRefusesNamedStatementsBehindPooler gives New a pool in pgx's
// default mode through a transaction pooler: New refuses it, naming the
// pooler and the fix, instead of failing at the first restart.
func TestNewRefusesNamedStatementsBehindPooler(t *testing.T) {
	u := testenv.PgbouncerURL(t, testenv.PgbouncerTx)
	schema := pgdb.Schema(t, u)
	pool, err := pgxpool.New(t.Context(), u)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	_, err = postgres.New(t.Context(), pool, postgres.Config{Schema: schema})
	if !errors.Is(err, store.ErrInvalidParams) || !strings.Contains(err.Error(), "pgbouncer") ||
		!strings.Contains(err.Error(), "default_query_exec_mode=cache_describe") {
		t.Fatalf("New on a pooled pool in cache_statement mode: %v, want a refusal naming the pooler and the fix", err)
	}
	safe, err := pgxpool.New(t.Context(), testenv.WithParam(t, u, "default_query_exec_mode", "cache_describe"))
	if err != nil {
		t.Fatal(err)
	}
	defer safe.Close()
	s, err := postgres.New(t.Context(), safe, postgres.Config{Schema: schema})
	if err != nil {
		t.Fatalf("New on a pooled pool in cache_describe mode: %v", err)
	}
	s.Close()
}

// TestPoolerErrorNamesTheFix forces named statements through a
// transaction pooler (the URL names the mode, so the store keeps it) and
// restarts: the errors that follow name the pooler and the fix.
func TestPoolerErrorNamesTheFix(t *testing.T) {
	u := testenv.WithParam(t, testenv.PgbouncerURL(t, testenv.PgbouncerTxOne), "default_query_exec_mode", "cache_statement")
	schema := pgdb.Schema(t, u)
	ctx := t.Context()
	var last error
	for run := range 2 {
		s, err := postgres.Open(ctx, u, postgres.Config{Schema: schema, MaxConns: 1})
		if err != nil {
			last = err
			continue
		}
		_, err = s.Get(ctx, "scope", "key")
		if !errors.Is(err, store.ErrNotFound) {
			last = err
		}
		s.Close()
		if run == 0 && last != nil {
			t.Fatalf("first run: %v", last)
		}
	}
	if last == nil {
		t.Fatal("named statements through a transaction pooler worked after a restart; the test no longer shows the failure")
	}
	if msg := last.Error(); !strings.Contains(msg, "pgbouncer") || !strings.Contains(msg, "cache_describe") {
		t.Fatalf("error %q does not name the pooler and the fix", msg)
	}
}
