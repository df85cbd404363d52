package redis

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"testing"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idem-go/idem/internal/testkit/testenv"
	"github.com/idem-go/idem/store"
)

// benchTargets opens a store with the server's clock on each available
// deployment: the single node, and a fresh local cluster when enabled.
func benchTargets(b *testing.B) map[string]*Store {
	b.Helper()
	out := map[string]*Store{}
	open := func(name, url string, admin goredis.UniversalClient) {
		s, err := Open(context.Background(), url, Config{Prefix: freshPrefix(b, admin)})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = s.Close() })
		out[name] = s
	}
	if os.Getenv(testenv.RedisEnv) != "" {
		opts, url := redisServer(b)
		admin := goredis.NewClient(opts)
		b.Cleanup(func() { _ = admin.Close() })
		open("single", url, admin)
	}
	if os.Getenv("IDEM_TEST_REDIS_CLUSTER") == "1" {
		cl := startCluster(b, 3)
		open("cluster", cl.url(), cl.client(b))
	}
	if len(out) == 0 {
		b.Skip("neither IDEM_TEST_REDIS_ADDR nor IDEM_TEST_REDIS_CLUSTER=1 is set: skipping Redis benchmarks")
	}
	return out
}

// A new request: one Reserve (created) and one Complete.
func BenchmarkReserveComplete(b *testing.B) {
	for name, s := range benchTargets(b) {
		// Keys are unique across the repeated runs of the benchmark.
		var n atomic.Int64
		b.Run(name, func(b *testing.B) {
			resp := store.Response{Status: 201, Body: make([]byte, 256)}
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					p := reserveParams(fmt.Sprint("bench-", n.Add(1)))
					res, err := s.Reserve(ctx, p)
					if err != nil || res.Outcome != store.Created {
						b.Errorf("reserve: %v %v", res.Outcome, err)
						return
					}
					if err := s.Complete(ctx, store.CompleteParams{FenceParams: fence(res.Record), Response: resp}); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// A replay: one Reserve that finds the completed record.
func BenchmarkReplay(b *testing.B) {
	for name, s := range benchTargets(b) {
		b.Run(name, func(b *testing.B) {
			const keys = 64
			for i := range keys {
				p := reserveParams(fmt.Sprint("replay-", i))
				res, err := s.Reserve(ctx, p)
				if err != nil {
					b.Fatal(err)
				}
				if res.Outcome == store.Created {
					if err := s.Complete(ctx, store.CompleteParams{FenceParams: fence(res.Record), Response: store.Response{Status: 201, Body: make([]byte, 256)}}); err != nil {
						b.Fatal(err)
					}
				}
			}
			var n atomic.Int64
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					res, err := s.Reserve(ctx, reserveParams(fmt.Sprint("replay-", n.Add(1)%keys)))
					if err != nil || res.Record.State != store.StateCompleted {
						b.Errorf("replay: %+v %v", res, err)
						return
					}
				}
			})
		})
	}
}

// The ceiling: a bare round trip (PING) on the same client.
func BenchmarkPing(b *testing.B) {
	for name, s := range benchTargets(b) {
		b.Run(name, func(b *testing.B) {
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if err := s.client.Ping(ctx).Err(); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// countHook counts the commands a client sends.
type countHook struct{ n atomic.Int64 }

func (h *countHook) DialHook(next goredis.DialHook) goredis.DialHook { return next }
func (h *countHook) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmd)
	}
}
func (h *countHook) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmds)
	}
}

// The performance contract: a new request is one round trip to reserve and
// one to complete, a replay is one.
func TestRoundTrips(t *testing.T) {
	t.Parallel()
	opts, _ := redisServer(t)
	client := goredis.NewClient(opts)
	t.Cleanup(func() { _ = client.Close() })
	s, err := New(client, Config{Prefix: freshPrefix(t, client)})
	if err != nil {
		t.Fatal(err)
	}
	// Load the scripts, as the first calls of a process do.
	for _, sc := range []*goredis.Script{scriptReserve, scriptComplete} {
		if err := sc.Load(ctx, client).Err(); err != nil {
			t.Fatal(err)
		}
	}
	hook := &countHook{}
	client.AddHook(hook)
	count := func(what string, want int64, fn func()) {
		t.Helper()
		before := hook.n.Load()
		fn()
		if got := hook.n.Load() - before; got != want {
			t.Errorf("%s: %d round trips, want %d", what, got, want)
		}
	}
	p := reserveParams("rt")
	var rec store.Record
	count("reserve", 1, func() { rec = mustReserve(t, s, p, store.Created) })
	count("complete", 1, func() {
		if err := s.Complete(ctx, store.CompleteParams{FenceParams: fence(rec), Response: store.Response{Status: 200}}); err != nil {
			t.Fatal(err)
		}
	})
	count("replay", 1, func() { mustReserve(t, s, p, store.Existing) })
}
