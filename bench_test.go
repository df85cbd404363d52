package idem_test

import (
	"testing"

	"github.com/idem-go/idem/internal/testkit/enginetest"
)

// BenchmarkMiddleware runs the middleware's benchmark on the memory store;
// the integration module runs it on every other store.
func BenchmarkMiddleware(b *testing.B) { enginetest.BenchMiddleware(b, enginetest.BenchMemory) }

// BenchmarkRetained reports what the memory store keeps per new key (run
// it with -benchtime 200000x).
func BenchmarkRetained(b *testing.B) { enginetest.BenchRetained(b, enginetest.BenchMemory) }
