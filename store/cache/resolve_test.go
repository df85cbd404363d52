package cache_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/cache"
	goredis "github.com/redis/go-redis/v9"
)

// down returns the fixture's backing store behind a cache whose Redis
// refuses every connection.
func (f *fixture) down(t *testing.T) *cache.Store {
	t.Helper()
	dead := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	t.Cleanup(func() { dead.Close() })
	return cache.New(f.backing, dead, cache.Config{Prefix: f.prefix, Clock: f.clock.Now, Logger: quiet})
}

// A settlement through the cache while Redis is down is committed by the
// backing store, and its caller is told so. Reporting a failure instead
// sent the caller (the engine settling its own record, the reconciler, an
// operator, a webhook) into a retry that could never succeed: the record
// is no longer unknown, so every retry got ErrStateConflict, as if someone
// else had settled it, and the reconciler stopped its pass. The tombstone
// it could not write guards nothing here: the cache keeps completed
// records only, and an unknown record was never completed under its fence.
func TestResolveWithRedisDown(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	res, err := f.c.Reserve(ctx, params("fp"))
	if err != nil || res.Outcome != store.Created {
		t.Fatal(res.Outcome, err)
	}
	fp := store.FenceParams{Scope: "s", Key: "k", Fence: res.Record.Fence}
	if err := f.c.MarkUnknown(ctx, store.ReleaseParams{FenceParams: fp, Error: "gateway timeout"}); err != nil {
		t.Fatal(err)
	}
	p := store.ResolveParams{FenceParams: fp, To: store.StateCompleted, Response: &store.Response{Status: 201, Body: []byte(`{"id":1}`)}}
	down := f.down(t)
	if err := down.Resolve(ctx, p); err != nil {
		t.Errorf("Resolve with Redis down: %v, want nil: the backing store committed it (a retry of it gets %v)", err, down.Resolve(ctx, p))
	}
	if r, err := f.backing.Get(ctx, "s", "k"); err != nil || r.State != store.StateCompleted {
		t.Fatalf("backing record after the settlement: %v %v", r.State, err)
	}
	// Definite answers of the backing store still come through.
	if err := down.Resolve(ctx, p); !errors.Is(err, store.ErrStateConflict) {
		t.Errorf("second settlement with Redis down: %v, want ErrStateConflict", err)
	}
	// Redis back: the settled answer is replayed.
	res, err = f.c.Reserve(ctx, params("fp"))
	if err != nil || res.Outcome != store.Existing || res.Record.Response == nil || string(res.Record.Response.Body) != `{"id":1}` {
		t.Fatalf("replay after the settlement: %v %+v %v", res.Outcome, res.Record.Response, err)
	}
}

// Cache failures never fail a request; they go to Config.Logger: the read
// of an entry and its write after the backing store's replay.
func TestCacheFailuresGoToTheLogger(t *testing.T) {
	f := newFixture(t)
	f.completed(t)
	var logs strings.Builder
	dead := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	t.Cleanup(func() { dead.Close() })
	c := cache.New(f.backing, dead, cache.Config{Prefix: f.prefix, Clock: f.clock.Now, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	res, err := c.Reserve(context.Background(), params("fp"))
	if err != nil || res.Outcome != store.Existing || string(res.Record.Response.Body) != `{"id":1}` {
		t.Fatalf("with Redis down: %v %v", res.Outcome, err)
	}
	for _, want := range []string{"idem/cache: read failed", "idem/cache: write failed"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("with Redis down the configured logger got %q, want %q", logs.String(), want)
		}
	}
}

// An operator's Delete through the cache while Redis is down removes the
// record from the backing store and says that the cache entry could not be
// dropped: the entry would answer replays of the deleted record until it
// expires, which must not pass silently.
func TestDeleteWithRedisDownReportsTheEntry(t *testing.T) {
	f := newFixture(t)
	f.completed(t)
	ctx := context.Background()
	if err := f.down(t).Delete(ctx, store.DeleteParams{Scope: "s", Key: "k"}); err == nil {
		t.Fatal("Delete of a cached record with Redis down reported success")
	}
	if _, err := f.backing.Get(ctx, "s", "k"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("backing record after the Delete: %v, want ErrNotFound", err)
	}
}
