package postgres_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/idem-go/idem/store"
)

// BenchmarkReserveCompleteCapped is BenchmarkReserveComplete with a tenant
// cap (one tenant, a cap no request reaches): the cost of the advisory
// lock and the count on the reservation.
func BenchmarkReserveCompleteCapped(b *testing.B) {
	s := benchStore(b)
	ctx := context.Background()
	var seq atomic.Int64
	b.SetParallelism(benchParallelism)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			p := reserveParams(fmt.Sprint("new-", seq.Add(1)))
			p.Tenant, p.MaxActive = "acme", 1_000_000
			r, err := s.Reserve(ctx, p)
			if err != nil || r.Outcome != store.Created {
				b.Fatalf("reserve: %v %v", r.Outcome, err)
			}
			err = s.Complete(ctx, store.CompleteParams{
				FenceParams: store.FenceParams{Scope: p.Scope, Key: p.Key, Fence: r.Record.Fence},
				Response:    benchResponse,
			})
			if err != nil {
				b.Fatal(err)
			}
		}
	})
}
