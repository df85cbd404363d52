package idem_test

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/testenv"
	"github.com/idem-go/idem/outbox"
	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/memory"
	"github.com/idem-go/idem/store/mysql"
	"github.com/idem-go/idem/store/postgres"
	"github.com/idem-go/idem/store/sqlite"
)

// namedStore opens a fresh store with the given clock.
type namedStore struct {
	name string
	open func(t *testing.T, clock store.Clock) store.Store
}

// realStores are the stores engine-level tests run against: memory, SQLite
// and, when IDEM_TEST_POSTGRES_URL is set, PostgreSQL.
func realStores(t *testing.T) []namedStore {
	stores := []namedStore{
		{"memory", func(t *testing.T, clock store.Clock) store.Store {
			return memory.New(memory.Config{Clock: clock})
		}},
		{"sqlite", func(t *testing.T, clock store.Clock) store.Store {
			s, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "idem.db"), sqlite.Config{Clock: clock})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		}},
	}
	if url := os.Getenv("IDEM_TEST_POSTGRES_URL"); url != "" {
		stores = append(stores, namedStore{"postgres", func(t *testing.T, clock store.Clock) store.Store {
			schema := freshSchema(t, url)
			s, err := postgres.Open(context.Background(), url, postgres.Config{Clock: clock, Schema: schema})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		}})
	} else {
		t.Log("IDEM_TEST_POSTGRES_URL is not set: engine tests run without PostgreSQL")
	}
	return stores
}

// freshSchema creates an empty schema dropped at the end of the test.
func freshSchema(t *testing.T, url string) string {
	return testenv.PostgresSchema(t, url)
}

// Every SQL store can run atomic phases.
var (
	_ idem.PhaseStore[pgx.Tx]  = (*postgres.Store)(nil)
	_ idem.PhaseStore[*sql.Tx] = (*sqlite.Store)(nil)
	_ idem.PhaseStore[*sql.Tx] = (*mysql.Store)(nil)
)

// The outbox runs under a Maintainer.
var _ idem.Service = (*outbox.Outbox[pgx.Tx])(nil)
