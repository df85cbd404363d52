package integration_test

import (
	"testing"

	"github.com/idem-go/idem/internal/integration/teststores"
	"github.com/idem-go/idem/internal/testkit/enginetest"
)

// engineStores are the stores the engine's request path is tested
// against: memory, SQLite and, when their variables are set, PostgreSQL
// and MariaDB.
func engineStores(t *testing.T) []enginetest.Store { return teststores.All(t, true) }
