package idem_test

import (
	"testing"

	"github.com/idem-go/idem/internal/testkit/enginetest"
)

// BenchmarkMiddleware runs the middleware's benchmark on the memory store;
// the integration module runs it on every other store.
func BenchmarkMiddleware(b *testing.B) { enginetest.BenchMiddleware(b, enginetest.BenchMemory) }
