package idem_test

import (
	"testing"

	"github.com/idem-go/idem/internal/testenv"
)

// freshSchema creates an empty schema dropped at the end of the test.
func freshSchema(t *testing.T, url string) string {
	return testenv.PostgresSchema(t, url)
}
