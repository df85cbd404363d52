package idem_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/idem-go/idem/internal/testenv"
	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/memory"
	"github.com/idem-go/idem/store/mysql"
	"github.com/idem-go/idem/store/postgres"
	"github.com/idem-go/idem/store/sqlite"
)

// freshSchema creates an empty schema dropped at the end of the test.
func freshSchema(t *testing.T, url string) string {
	return testenv.PostgresSchema(t, url)
}

// namedStore opens a fresh store with the given clock (nil: its own).
type namedStore struct {
	name string
	open func(t *testing.T, clock store.Clock) store.Store
}

// engineStores are the stores the engine's request path is tested
// against: memory, SQLite and, when their variables are set, PostgreSQL
// and MariaDB.
func engineStores(t *testing.T) []namedStore {
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
	if url := os.Getenv(testenv.PostgresEnv); url != "" {
		stores = append(stores, namedStore{"postgres", func(t *testing.T, clock store.Clock) store.Store {
			s, err := postgres.Open(context.Background(), url, postgres.Config{Clock: clock, Schema: freshSchema(t, url)})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		}})
	} else {
		testenv.Without(t, testenv.PostgresEnv+" is not set: the engine is tested without PostgreSQL")
	}
	if os.Getenv(testenv.MySQLEnv) != "" {
		stores = append(stores, namedStore{"mariadb", func(t *testing.T, clock store.Clock) store.Store {
			s, err := mysql.Open(context.Background(), testenv.MySQLDatabase(t).FormatDSN(), mysql.Config{Clock: clock})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		}})
	} else {
		testenv.Without(t, testenv.MySQLEnv+" is not set: the engine is tested without MariaDB")
	}
	return stores
}
