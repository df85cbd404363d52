// Package teststores opens the real stores that tests of the engine and of
// the background services run against, each fresh and private to its test:
// memory, SQLite and, when their servers are configured (package testenv),
// PostgreSQL and MariaDB.
package teststores

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/idem-go/idem/internal/testkit/enginetest"
	"github.com/idem-go/idem/internal/testkit/mysqldb"
	"github.com/idem-go/idem/internal/testkit/pgdb"
	"github.com/idem-go/idem/internal/testkit/testenv"
	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/mysql"
	"github.com/idem-go/idem/store/postgres"
	"github.com/idem-go/idem/store/sqlite"
	_ "github.com/jackc/pgx/v5/stdlib"
)

// All returns memory, SQLite, PostgreSQL when IDEM_TEST_POSTGRES_URL is
// set (directly in each of pgx's query modes, and through pgbouncer in
// transaction mode when IDEM_TEST_PGBOUNCER_URL is set) and, with mariadb, MariaDB when IDEM_TEST_MYSQL_DSN is set. A
// missing server is noted (and fails the test under CI=true).
func All(t *testing.T, mariadb bool) []enginetest.Store {
	stores := []enginetest.Store{
		enginetest.Memory,
		{Name: "sqlite", Open: func(t *testing.T, clock store.Clock) store.Store {
			s, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "idem.db"), sqlite.Config{Clock: clock})
			return opened(t, s, err)
		}},
	}
	if url := os.Getenv(testenv.PostgresEnv); url != "" {
		// TenantCap on every variant: the suites cap tenants on every
		// store; the store's own suite covers it off (its default).
		stores = append(stores, pgStore("postgres", url, postgres.Config{TenantCap: true}),
			// Every call on the batched path, through the multi-row
			// statements even alone.
			pgStore("postgres-batched", url, postgres.Config{ForceBatches: true, MaxConns: variantConns, TenantCap: true}))
		// The query modes that a pooler's guide recommends, and the
		// others pgx has, named in the URL as a user would.
		for _, mode := range []string{"cache_describe", "describe_exec", "exec", "simple_protocol"} {
			stores = append(stores, pgStore("postgres-"+mode, testenv.WithParam(t, url, "default_query_exec_mode", mode), postgres.Config{MaxConns: variantConns, TenantCap: true}))
		}
	} else {
		testenv.Without(t, testenv.PostgresEnv+" is not set: tested without PostgreSQL")
	}
	if os.Getenv(testenv.PgbouncerEnv) != "" {
		stores = append(stores, pgStore("postgres-pgbouncer-tx", testenv.PgbouncerURL(t, testenv.PgbouncerTx), postgres.Config{MaxConns: variantConns, TenantCap: true}))
	} else {
		testenv.Without(t, testenv.PgbouncerEnv+" is not set: tested without pgbouncer")
	}
	if !mariadb {
		return stores
	}
	if os.Getenv(testenv.MySQLEnv) != "" {
		stores = append(stores, enginetest.Store{Name: "mariadb", Open: func(t *testing.T, clock store.Clock) store.Store {
			s, err := mysql.Open(context.Background(), mysqldb.Database(t), mysql.Config{Clock: clock})
			return opened(t, s, err)
		}})
	} else {
		testenv.Without(t, testenv.MySQLEnv+" is not set: tested without MariaDB")
	}
	return stores
}

// variantConns sizes the pools of the PostgreSQL variants beyond the
// first: they run beside it, and the server's connections are shared with
// every other test.
const variantConns = 4

// pgStore is the PostgreSQL store on url with cfg, in a schema of its own.
func pgStore(name, url string, cfg postgres.Config) enginetest.Store {
	return enginetest.Store{Name: name, Open: func(t *testing.T, clock store.Clock) store.Store {
		c := cfg
		c.Clock, c.Schema = clock, pgdb.Schema(t, url)
		s, err := postgres.Open(context.Background(), url, c)
		return opened(t, s, err)
	}}
}

// opened closes s when the test ends, or fails the test on err.
func opened[S store.Store](t *testing.T, s S, err error) store.Store {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}
