package idem_test

import (
	"github.com/idem-go/idem/internal/testenv"
	"github.com/idem-go/idem/internal/teststores"
	"testing"
)

// freshSchema creates an empty schema dropped at the end of the test.
func freshSchema(t *testing.T, url string) string {
	return testenv.PostgresSchema(t, url)
}

// namedStore opens a fresh store with the given clock (nil: its own).
type namedStore = teststores.Named

// engineStores are the stores the engine's request path is tested
// against: memory, SQLite and, when their variables are set, PostgreSQL
// and MariaDB.
func engineStores(t *testing.T) []namedStore { return teststores.All(t, true) }
