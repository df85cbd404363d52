package sqlite_test

import (
	"context"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/sqlite"
)

// BenchmarkStore measures the two paths of the round-trip contract on a file
// in the test's temporary directory (WAL, synchronous=FULL: every completed
// request costs the commits' fsyncs):
//   - ReserveComplete: a new request, Reserve of a fresh key then Complete;
//   - Replay: Reserve of a completed key (what a retry costs);
//   - Get: Get of a completed key;
//   - ReplayWhileWriting, GetWhileWriting: the same while four goroutines
//     run ReserveComplete, which is where the read pool pays: a read never
//     queues behind the writer's fsync.
func BenchmarkStore(b *testing.B) {
	ctx := context.Background()
	s, err := sqlite.Open(ctx, filepath.Join(b.TempDir(), "idem.db"), sqlite.Config{})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	resp := store.Response{Status: 201, Body: []byte(`{"id":"ch_1","amount":100}`)}
	var seq atomic.Int64
	params := func(key string) store.ReserveParams {
		return store.ReserveParams{Scope: "tenant:POST /charges", Key: key, Fingerprint: "fp",
			Lease: 30 * time.Second, TTL: 24 * time.Hour, LeasePolicy: store.LeaseUnknown}
	}
	reserveComplete := func(b *testing.B) {
		res, err := s.Reserve(ctx, params(strconv.FormatInt(seq.Add(1), 10)))
		if err != nil || res.Outcome != store.Created {
			b.Errorf("Reserve: %v %v", res.Outcome, err) // Fatal may not run in RunParallel's goroutines
			return
		}
		err = s.Complete(ctx, store.CompleteParams{
			FenceParams: store.FenceParams{Scope: res.Record.Scope, Key: res.Record.Key, Fence: res.Record.Fence},
			Response:    resp,
		})
		if err != nil {
			b.Error(err)
		}
	}
	b.Run("ReserveComplete", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			reserveComplete(b)
		}
	})
	b.Run("ReserveCompleteParallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				reserveComplete(b)
			}
		})
	})

	reserveComplete(b)
	done := strconv.FormatInt(seq.Load(), 10)
	replay := func(b *testing.B) {
		res, err := s.Reserve(ctx, params(done))
		if err != nil || res.Outcome != store.Existing {
			b.Errorf("Reserve: %v %v", res.Outcome, err)
		}
	}
	get := func(b *testing.B) {
		if _, err := s.Get(ctx, "tenant:POST /charges", done); err != nil {
			b.Error(err)
		}
	}
	for _, c := range []struct {
		name string
		f    func(*testing.B)
	}{{"Replay", replay}, {"Get", get}} {
		name, f := c.name, c.f
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				f(b)
			}
		})
		b.Run(name+"Parallel", func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					f(b)
				}
			})
		})
	}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
					reserveComplete(b)
				}
			}
		}()
	}
	defer func() {
		close(stop)
		wg.Wait()
	}()
	b.Run("ReplayWhileWriting", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			replay(b)
		}
	})
	b.Run("GetWhileWriting", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			get(b)
		}
	})
}
