package mysql

import (
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/idem-go/idem/store"
)

// BenchmarkReserveComplete is the path of a new request: Reserve, then
// Complete, on a fresh key each time.
func BenchmarkReserveComplete(b *testing.B) {
	s := openStore(b, newDatabase(b), nil)
	var seq atomic.Int64
	resp := okResponse(`{"id":"pay_123","amount":1000}`)
	b.ReportAllocs()
	// The work waits on the server, not the CPU: run 8 goroutines per P.
	b.SetParallelism(8)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			p := reserveParams(fmt.Sprint("k-", seq.Add(1)))
			res, err := s.Reserve(b.Context(), p)
			if err != nil || res.Outcome != store.Created {
				b.Fatalf("reserve: %v %v", res.Outcome, err)
			}
			if err := s.Complete(b.Context(), store.CompleteParams{FenceParams: fence(res.Record), Response: resp}); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkReplay is the path of a retry of a completed request. "hot" has
// every goroutine replay one key (they queue on its row lock); "spread"
// replays 1000 keys.
func BenchmarkReplay(b *testing.B) {
	for _, keys := range []int{1, 1000} {
		name := "hot"
		if keys > 1 {
			name = "spread"
		}
		b.Run(name, func(b *testing.B) {
			s := openStore(b, newDatabase(b), nil)
			for i := range keys {
				res, err := s.Reserve(b.Context(), reserveParams(fmt.Sprint("k-", i)))
				if err != nil {
					b.Fatal(err)
				}
				if err := s.Complete(b.Context(), store.CompleteParams{FenceParams: fence(res.Record), Response: okResponse(`{"id":"pay_123"}`)}); err != nil {
					b.Fatal(err)
				}
			}
			var seq atomic.Int64
			b.ReportAllocs()
			b.SetParallelism(8)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					p := reserveParams(fmt.Sprint("k-", int(seq.Add(1))%keys))
					res, err := s.Reserve(b.Context(), p)
					if err != nil || res.Outcome != store.Existing || res.Record.State != store.StateCompleted {
						b.Fatalf("replay: %v %v", res.Outcome, err)
					}
				}
			})
		})
	}
}
