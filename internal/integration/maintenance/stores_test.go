package maintenance_test

import (
	"testing"

	"github.com/idem-go/idem/internal/integration/teststores"
	"github.com/idem-go/idem/internal/testkit/enginetest"
)

// realStores are the stores the services are tested against: memory,
// SQLite and, when IDEM_TEST_POSTGRES_URL is set, PostgreSQL.
func realStores(t *testing.T) []enginetest.Store { return teststores.All(t, false) }
