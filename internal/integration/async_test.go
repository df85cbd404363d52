package integration_test

import (
	"testing"

	"github.com/idem-go/idem/internal/testkit/enginetest"
	"github.com/idem-go/idem/store/storetest"
)

// The asynchronous mode over every real store: SQLite, PostgreSQL and
// MariaDB (and memory) when their servers are configured.
func TestAsyncStores(t *testing.T) {
	for _, ns := range engineStores(t) {
		t.Run(ns.Name, func(t *testing.T) {
			t.Parallel()
			t.Run("flow", func(t *testing.T) { enginetest.AsyncFlow(t, ns.Open(t, nil)) })
			t.Run("tenant cap", func(t *testing.T) { enginetest.AsyncCap(t, ns.Open(t, nil)) })
			t.Run("stop while claiming", func(t *testing.T) { enginetest.AsyncStopWhileClaiming(t, ns.Open(t, nil)) })
			t.Run("tenant rate refund", func(t *testing.T) {
				clock := storetest.NewClock()
				enginetest.AsyncRefund(t, ns.Open(t, clock.Now), clock)
			})
			t.Run("expiry", func(t *testing.T) {
				clock := storetest.NewClock()
				enginetest.AsyncExpiry(t, ns.Open(t, clock.Now), clock)
			})
		})
	}
}
