package postgres_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/idem-go/idem/store"
)

// BenchmarkPendingCapped measures an asynchronous acceptance under a
// tenant cap no request reaches against one without: each iteration
// accepts a request (ReservePending), claims the oldest pending one and
// completes it, so the tenant's active records stay few.
func BenchmarkPendingCapped(b *testing.B) {
	for _, max := range []int{0, 1_000_000} {
		b.Run(fmt.Sprint("max=", max), func(b *testing.B) {
			s := benchStore(b)
			ctx := context.Background()
			var seq atomic.Int64
			b.SetParallelism(benchParallelism)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					p := store.PendingParams{ReserveParams: reserveParams(fmt.Sprint("new-", seq.Add(1))),
						Request: store.PendingRequest{Queue: "bench", Method: "POST", Target: "/v1/reports"}}
					p.Tenant, p.MaxActive = "acme", max
					if r, err := s.ReservePending(ctx, p); err != nil || r.Outcome != store.Created {
						b.Fatalf("reserve pending: %v %v", r.Outcome, err)
					}
					got, err := s.Claim(ctx, store.ClaimParams{Queue: "bench", Limit: 1, Lease: p.Lease})
					if err != nil {
						b.Fatal(err)
					}
					for _, r := range got {
						if err := s.Complete(ctx, store.CompleteParams{FenceParams: store.FenceParams{Scope: r.Scope, Key: r.Key, Fence: r.Fence},
							Response: benchResponse}); err != nil {
							b.Fatal(err)
						}
					}
				}
			})
		})
	}
}
