package cache_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/testkit/testenv"
	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/cache"
	"github.com/idem-go/idem/store/sqlite"
	"github.com/idem-go/idem/store/storetest"
	goredis "github.com/redis/go-redis/v9"
)

func redisClient(t *testing.T) (goredis.UniversalClient, string) {
	t.Helper()
	rdb := goredis.NewClient(&goredis.Options{Addr: testenv.RedisAddr(t), DB: testenv.RedisDB(t)})
	prefix := testenv.Name("idem:cachetest:") + ":"
	t.Cleanup(func() {
		ctx := context.Background()
		if keys, err := rdb.Keys(ctx, prefix+"*").Result(); err == nil && len(keys) > 0 {
			rdb.Del(ctx, keys...)
		}
		rdb.Close()
	})
	return rdb, prefix
}

var quiet = slog.New(slog.DiscardHandler)

// The cache is a store: it passes the whole conformance suite over SQLite.
func TestConformance(t *testing.T) {
	rdb, prefix := redisClient(t)
	storetest.Run(t, storetest.Harness{
		Durable: true,
		Shared:  true,
		NewDatabase: func(t *testing.T) storetest.Opener {
			path := filepath.Join(t.TempDir(), "idem.db")
			p := testenv.Name(prefix) + ":"
			return func(t *testing.T, clock store.Clock) store.Store {
				s, err := sqlite.Open(context.Background(), path, sqlite.Config{Clock: clock})
				if err != nil {
					t.Fatal(err)
				}
				c := cache.New(s, rdb, cache.Config{Prefix: p, Clock: clock, Logger: quiet})
				t.Cleanup(func() { c.Close() })
				return c
			}
		},
	})
}

type fixture struct {
	clock   *storetest.Clock
	backing *sqlite.Store
	rdb     goredis.UniversalClient
	c       *cache.Store
	prefix  string
}

func newFixture(t *testing.T) *fixture {
	rdb, prefix := redisClient(t)
	f := &fixture{clock: storetest.NewClock(), rdb: rdb, prefix: prefix}
	s, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "idem.db"), sqlite.Config{Clock: f.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	f.backing = s
	f.c = cache.New(s, rdb, cache.Config{Prefix: prefix, Clock: f.clock.Now, MaxTTL: time.Minute, Logger: quiet})
	return f
}

func params(fp string) store.ReserveParams {
	return store.ReserveParams{Scope: "s", Key: "k", Fingerprint: fp, Lease: 30 * time.Second, TTL: time.Hour, LeasePolicy: store.LeaseUnknown}
}

// stored reserves and completes (s, k) through the cache.
func (f *fixture) stored(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	res, err := f.c.Reserve(ctx, params("fp"))
	if err != nil || res.Outcome != store.Created {
		t.Fatal(res.Outcome, err)
	}
	resp := store.Response{Status: 201, Body: []byte(`{"id":1}`)}
	if err := f.c.Complete(ctx, store.CompleteParams{FenceParams: store.FenceParams{Scope: "s", Key: "k", Fence: res.Record.Fence}, Response: resp}); err != nil {
		t.Fatal(err)
	}
}

// completed stores (s, k) through the cache and replays it once so the
// entry is written.
func (f *fixture) completed(t *testing.T) {
	f.stored(t)
	ctx := context.Background()
	if res, err := f.c.Reserve(ctx, params("fp")); err != nil || res.Record.State != store.StateCompleted {
		t.Fatal(res, err)
	}
}

// cached reports whether the cache holds an entry (an invalidation's
// tombstone is none).
func (f *fixture) cached(t *testing.T) bool {
	keys, err := f.rdb.Keys(context.Background(), f.prefix+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if v, err := f.rdb.Get(context.Background(), k).Result(); err == nil && v != cache.Tombstone {
			return true
		}
	}
	return false
}

func TestReplayServedFromCache(t *testing.T) {
	f := newFixture(t)
	f.completed(t)
	if !f.cached(t) {
		t.Fatal("no cache entry after a replay")
	}
	// Prove the answer comes from Redis: remove the record from the backing
	// store behind the cache's back.
	if err := f.backing.Delete(context.Background(), store.DeleteParams{Scope: "s", Key: "k"}); err != nil {
		t.Fatal(err)
	}
	res, err := f.c.Reserve(context.Background(), params("fp"))
	if err != nil || res.Outcome != store.Existing || string(res.Record.Response.Body) != `{"id":1}` {
		t.Fatalf("cached replay: %v %+v %v", res.Outcome, res.Record.Response, err)
	}
	// That staleness is bounded by MaxTTL (1 minute here).
	f.clock.Advance(time.Minute)
	res, err = f.c.Reserve(context.Background(), params("fp"))
	if err != nil || res.Outcome != store.Created {
		t.Fatalf("after MaxTTL the backing store answers: %v %v", res.Outcome, err)
	}
}

func TestDifferentFingerprintGoesToTheStore(t *testing.T) {
	f := newFixture(t)
	f.completed(t)
	res, err := f.c.Reserve(context.Background(), params("other"))
	if err != nil || res.Outcome != store.Existing || res.Record.Fingerprint != "fp" {
		t.Fatalf("mismatch: %v %+v %v", res.Outcome, res.Record, err)
	}
}

func TestCacheLossChangesNoAnswer(t *testing.T) {
	f := newFixture(t)
	f.completed(t)
	ctx := context.Background()
	keys, _ := f.rdb.Keys(ctx, f.prefix+"*").Result()
	f.rdb.Del(ctx, keys...) // a flush
	res, err := f.c.Reserve(ctx, params("fp"))
	if err != nil || res.Outcome != store.Existing || res.Record.State != store.StateCompleted {
		t.Fatalf("after a flush: %v %v", res.Outcome, err)
	}
	// Redis down: answers still come, from SQLite.
	down := f.down(t)
	res, err = down.Reserve(ctx, params("fp"))
	if err != nil || res.Outcome != store.Existing || string(res.Record.Response.Body) != `{"id":1}` {
		t.Fatalf("with Redis down: %v %v", res.Outcome, err)
	}
	p := params("fp")
	p.Key = "new"
	if res, err := down.Reserve(ctx, p); err != nil || res.Outcome != store.Created {
		t.Fatalf("new key with Redis down: %v %v", res.Outcome, err)
	}
	// But a Delete that cannot drop its cache entry says so.
	if err := down.Delete(ctx, store.DeleteParams{Scope: "s", Key: "new"}); err == nil {
		t.Fatal("Delete with Redis down reported success")
	}
}

func TestOperatorDeleteDropsTheEntry(t *testing.T) {
	f := newFixture(t)
	f.completed(t)
	if err := f.c.Delete(context.Background(), store.DeleteParams{Scope: "s", Key: "k"}); err != nil {
		t.Fatal(err)
	}
	if f.cached(t) {
		t.Fatal("cache entry survived an operator delete")
	}
	res, err := f.c.Reserve(context.Background(), params("fp"))
	if err != nil || res.Outcome != store.Created {
		t.Fatalf("after delete: %v %v", res.Outcome, err)
	}
	if err := f.c.Delete(context.Background(), store.DeleteParams{Scope: "s", Key: "missing"}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("delete of a missing key: %v", err)
	}
}

func TestEntryNeverOutlivesTheRecord(t *testing.T) {
	f := newFixture(t)
	f.c = cache.New(f.backing, f.rdb, cache.Config{Prefix: f.prefix, Clock: f.clock.Now, MaxTTL: 48 * time.Hour, Logger: quiet})
	f.completed(t)
	ttl, err := f.rdb.TTL(context.Background(), mustOneKey(t, f)).Result()
	if err != nil || ttl <= 0 || ttl > time.Hour {
		t.Fatalf("entry TTL %v (record retention 1h): %v", ttl, err)
	}
	f.clock.Advance(time.Hour)
	res, err := f.c.Reserve(context.Background(), params("fp"))
	if err != nil || res.Outcome != store.Created {
		t.Fatalf("past the record's expiry: %v %v", res.Outcome, err)
	}
}

func mustOneKey(t *testing.T, f *fixture) string {
	keys, err := f.rdb.Keys(context.Background(), f.prefix+"*").Result()
	if err != nil || len(keys) != 1 {
		t.Fatalf("cache keys %v %v", keys, err)
	}
	return keys[0]
}

// BenchmarkCacheReplay compares replays from the backing store alone
// ("bare") with replays through the cache, in one run, on SQLite and, when
// IDEM_TEST_POSTGRES_URL is set, on PostgreSQL.
func BenchmarkCacheReplay(b *testing.B) {
	rdb := goredis.NewClient(&goredis.Options{Addr: testenv.RedisAddr(b), DB: testenv.RedisDB(b)})
	defer rdb.Close()
	backings := map[string]func(b *testing.B) store.Store{
		"sqlite": func(b *testing.B) store.Store {
			s, err := sqlite.Open(context.Background(), filepath.Join(b.TempDir(), "idem.db"), sqlite.Config{})
			if err != nil {
				b.Fatal(err)
			}
			return s
		},
	}
	if url := os.Getenv(testenv.PostgresEnv); url != "" {
		backings["postgres"] = func(b *testing.B) store.Store { return openPostgresBench(b, url) }
	}
	for name, open := range backings {
		s := open(b)
		ctx := context.Background()
		res, err := s.Reserve(ctx, params("fp"))
		if err != nil {
			b.Fatal(err)
		}
		resp := store.Response{Status: 201, Body: []byte(`{"id":"ch_1","status":"succeeded"}`)}
		if err := s.Complete(ctx, store.CompleteParams{FenceParams: store.FenceParams{Scope: "s", Key: "k", Fence: res.Record.Fence}, Response: resp}); err != nil {
			b.Fatal(err)
		}
		c := cache.New(s, rdb, cache.Config{Prefix: "idem:cachebench:" + name + ":", Logger: quiet})
		for _, v := range []struct {
			leaf string
			s    store.Store
		}{{"bare", s}, {"cached", c}} {
			b.Run(name+"/"+v.leaf, func(b *testing.B) {
				b.ReportAllocs()
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						res, err := v.s.Reserve(ctx, params("fp"))
						if err != nil || res.Record.State != store.StateCompleted {
							b.Fatal(res.Outcome, err)
						}
					}
				})
			})
		}
		c.Delete(ctx, store.DeleteParams{Scope: "s", Key: "k"})
		s.Close()
	}
}

// gate lets the backing Reserve answer, then holds the answer until released.
type gate struct {
	store.Store
	answered, release chan struct{}
}

func (g *gate) Reserve(ctx context.Context, p store.ReserveParams) (store.ReserveResult, error) {
	res, err := g.Store.Reserve(ctx, p)
	if g.answered != nil {
		close(g.answered)
		<-g.release
		g.answered = nil
	}
	return res, err
}

// A replay that read the record from the backing store before an operator's
// Delete through the wrapper writes its entry only after the Delete's
// invalidation: the invalidation's tombstone keeps it out, and the next
// request finds the key free (the old entry used to be written back and
// replayed for up to MaxTTL).
func TestFillAfterDeleteIsKeptOut(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	// Completed in the backing store, no cache entry yet.
	res, err := f.backing.Reserve(ctx, params("fp"))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.backing.Complete(ctx, store.CompleteParams{FenceParams: store.FenceParams{Scope: "s", Key: "k", Fence: res.Record.Fence},
		Response: store.Response{Status: 201, Body: []byte(`{"id":1}`)}}); err != nil {
		t.Fatal(err)
	}
	g := &gate{Store: f.backing, answered: make(chan struct{}), release: make(chan struct{})}
	c := cache.New(g, f.rdb, cache.Config{Prefix: f.prefix, Clock: f.clock.Now, Logger: quiet})
	done := make(chan struct{})
	go func() { defer close(done); c.Reserve(ctx, params("fp")) }() // a replay, read from SQLite
	<-g.answered
	if err := c.Delete(ctx, store.DeleteParams{Scope: "s", Key: "k"}); err != nil { // operator cache-bust through the wrapper
		t.Fatal(err)
	}
	close(g.release)
	<-done
	if _, err := f.backing.Get(ctx, "s", "k"); err == nil {
		t.Fatal("record still in the backing store")
	}
	res, err = c.Reserve(ctx, params("fp"))
	if err != nil || res.Outcome != store.Created {
		t.Fatalf("after a Delete through the cache: %v %s %v, want Created (the backing store has no record)",
			res.Outcome, res.Record.State, err)
	}
}

// A record within a second of its expiry is no longer answered from the
// cache: the backing store judges expiry by its own clock (a database's),
// which may be a little ahead of this process's.
func TestNoCachedAnswerAtTheEdgeOfExpiry(t *testing.T) {
	f := newFixture(t)
	f.c = cache.New(f.backing, f.rdb, cache.Config{Prefix: f.prefix, Clock: f.clock.Now, MaxTTL: 48 * time.Hour, Logger: quiet})
	f.completed(t) // retention 1h
	// Answers from the cache are told apart by removing the record from
	// the backing store behind the cache's back.
	if err := f.backing.Delete(context.Background(), store.DeleteParams{Scope: "s", Key: "k"}); err != nil {
		t.Fatal(err)
	}
	f.clock.Advance(time.Hour - 2*time.Second)
	if res, err := f.c.Reserve(context.Background(), params("fp")); err != nil || res.Outcome != store.Existing {
		t.Fatalf("2s before expiry: %v %v, want the cached answer", res.Outcome, err)
	}
	f.clock.Advance(1500 * time.Millisecond)
	if res, err := f.c.Reserve(context.Background(), params("fp")); err != nil || res.Outcome != store.Created {
		t.Fatalf("0.5s before expiry: %v %v, want the backing store's answer", res.Outcome, err)
	}
}

// A Redis that stops answering without refusing (hung, or cut off by a
// network that drops packets) costs a request at most Config.Timeout per
// call: the backing store answers replays and new keys alike within the
// request's deadline. Before, the cache's read used up that deadline, and
// the backing store then failed every request.
func TestStalledRedisFallsThrough(t *testing.T) {
	f := newFixture(t)
	l := testenv.NewLink(t, testenv.RedisAddr(t))
	rdb := goredis.NewClient(&goredis.Options{Addr: l.Addr(), DB: testenv.RedisDB(t), ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	f.c = cache.New(f.backing, rdb, cache.Config{Prefix: f.prefix, Clock: f.clock.Now, MaxTTL: time.Minute, Logger: quiet})
	f.completed(t)
	if !f.cached(t) {
		t.Fatal("no cache entry after a replay")
	}
	l.Stall()
	for key, want := range map[string]store.ReserveOutcome{"k": store.Existing, "new": store.Created} {
		p := params("fp")
		p.Key = key
		// The engine's deadline for a store call (Config.StoreTimeout).
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		start := time.Now()
		res, err := f.c.Reserve(ctx, p)
		cancel()
		if err != nil || res.Outcome != want {
			t.Fatalf("key %q with Redis stalled: %v %v after %v, want %v from the backing store",
				key, res.Outcome, err, time.Since(start).Round(time.Millisecond), want)
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("key %q with Redis stalled: answered after %v", key, d.Round(time.Millisecond))
		}
	}
}

// ReservePending answers replays from the cache as Reserve does: a replay
// of a completed record through ReservePending writes its entry, and the
// next replay is answered from Redis.
func TestPendingReplayServedFromCache(t *testing.T) {
	f := newFixture(t)
	f.stored(t)
	ctx := context.Background()
	p := store.PendingParams{ReserveParams: params("fp"), Request: store.PendingRequest{Queue: "q", Method: "POST", Target: "/v1/charges"}}
	if res, err := f.c.ReservePending(ctx, p); err != nil || res.Outcome != store.Existing || res.Record.State != store.StateCompleted {
		t.Fatalf("pending replay: %v %s %v", res.Outcome, res.Record.State, err)
	}
	if !f.cached(t) {
		t.Fatal("no cache entry after a pending replay")
	}
	// Prove the next answer comes from Redis: remove the record from the
	// backing store behind the cache's back.
	if err := f.backing.Delete(ctx, store.DeleteParams{Scope: "s", Key: "k"}); err != nil {
		t.Fatal(err)
	}
	res, err := f.c.ReservePending(ctx, p)
	if err != nil || res.Outcome != store.Existing || string(res.Record.Response.Body) != `{"id":1}` {
		t.Fatalf("cached pending replay: %v %+v %v", res.Outcome, res.Record.Response, err)
	}
}

// Without Config.MaxTTL, entries and tombstones live at most five minutes:
// a replay writes an entry that Redis drops by then, and so is the
// tombstone of an operator's Delete, so that neither outlives the default.
func TestDefaultMaxTTL(t *testing.T) {
	f := newFixture(t)
	f.c = cache.New(f.backing, f.rdb, cache.Config{Prefix: f.prefix, Clock: f.clock.Now, Logger: quiet})
	f.completed(t)
	ctx := context.Background()
	key := mustOneKey(t, f)
	if ttl, err := f.rdb.TTL(ctx, key).Result(); err != nil || ttl <= 0 || ttl > 5*time.Minute {
		t.Fatalf("entry written with the default MaxTTL lives %v (%v), want at most 5m", ttl, err)
	}
	if err := f.c.Delete(ctx, store.DeleteParams{Scope: "s", Key: "k"}); err != nil {
		t.Fatal(err)
	}
	if v, err := f.rdb.Get(ctx, key).Result(); err != nil || v != cache.Tombstone {
		t.Fatalf("after Delete the entry holds %q (%v), want the tombstone", v, err)
	}
	if ttl, err := f.rdb.TTL(ctx, key).Result(); err != nil || ttl <= 0 || ttl > 5*time.Minute {
		t.Fatalf("tombstone written with the default MaxTTL lives %v (%v), want at most 5m", ttl, err)
	}
}
