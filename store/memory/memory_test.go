package memory_test

import (
	"testing"

	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/memory"
	"github.com/idem-go/idem/store/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, storetest.Harness{
		NewDatabase: func(t *testing.T) storetest.Opener {
			var s *memory.Store
			return func(t *testing.T, clock store.Clock) store.Store {
				// One map per database: a second handle is the same store.
				if s == nil {
					s = memory.New(memory.Config{Clock: clock})
				}
				return s
			}
		},
	})
}
