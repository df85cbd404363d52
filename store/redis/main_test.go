package redis

import (
	"testing"

	"go.uber.org/goleak"
)

// Every client the tests open must be closed: Close releases the store's
// connections and goroutines.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
