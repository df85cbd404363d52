package storeurl_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idem-go/idem/cmd/idem/internal/storeurl"
	"github.com/idem-go/idem/internal/testkit/testenv"
	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/cache"
)

func TestParseCache(t *testing.T) {
	t.Parallel()
	c, err := storeurl.ParseCache("redis://u:p%40ss@cache.internal:6380/3?prefix=app1:&max_ttl=90s&dial_timeout=2s")
	if err != nil {
		t.Fatal(err)
	}
	o := c.Options
	if o.Addr != "cache.internal:6380" || o.DB != 3 || o.Username != "u" || o.Password != "p@ss" ||
		o.DialTimeout != 2*time.Second || c.Prefix != "app1:" || c.MaxTTL != 90*time.Second {
		t.Errorf("parsed %+v %+v", c, o)
	}
	if c, err := storeurl.ParseCache("rediss://cache:6379/0"); err != nil || c.Options.TLSConfig == nil || c.Prefix != "" || c.MaxTTL != 0 {
		t.Errorf("rediss: %+v %v", c, err)
	}
	for dsn, want := range map[string]string{
		"memory:":                             "must be a Redis URL",
		"redis+cluster://a:1,b:2":             "must be a Redis URL",
		"sqlite:x.db":                         "must be a Redis URL",
		"redis://h:6379/0?max_ttl=-1s":        "max_ttl",
		"redis://h:6379/0?max_ttl=never":      "max_ttl",
		"redis://h:6379/x":                    "database number",
		"redis://h:6379/0?bogus=1":            "bogus",
		"redis://u:secret@h:6379/0?bogus=1":   "bogus",
		"redis://u:secret@h:6379/0\x7f":       "invalid",
		"redis://u:secret@h:6379/0?max_ttl=":  "", // empty: the default
		"redis://u:secret@h:6379/0?bogus=%zz": "parameters",
	} {
		_, err := storeurl.ParseCache(dsn)
		switch {
		case want == "" && err != nil:
			t.Errorf("%q: %v", dsn, err)
		case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
			t.Errorf("%q: %v, want %q", dsn, err, want)
		case err != nil && strings.Contains(err.Error(), "secret"):
			t.Errorf("%q: the error repeats the password: %v", dsn, err)
		}
	}
	if _, err := storeurl.Open(context.Background(), "memory:", storeurl.Options{Cache: "memcached://x"}); err == nil {
		t.Error("Open accepted a cache that is not Redis")
	}
}

// A cache that does not answer at open only logs: replays come from the
// store, and the store still works.
func TestOpenWithUnreachableCache(t *testing.T) {
	t.Parallel()
	var logs strings.Builder
	s, err := storeurl.Open(context.Background(), "memory:", storeurl.Options{
		Cache:  "redis://127.0.0.1:1/0?dial_timeout=100ms&max_retries=-1&min_retry_backoff=-1",
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if !strings.Contains(logs.String(), "replay cache does not answer") {
		t.Errorf("no warning: %q", logs.String())
	}
	// Reservations never need the cache; a Delete must report the entry
	// it could not drop.
	ctx := context.Background()
	p := store.ReserveParams{Scope: "s", Key: "k", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour, LeasePolicy: store.LeaseUnknown}
	res, err := s.Reserve(ctx, p)
	if err != nil || res.Outcome != store.Created {
		t.Fatal(res.Outcome, err)
	}
	fence := store.FenceParams{Scope: "s", Key: "k", Fence: res.Record.Fence}
	if err := s.Release(ctx, store.ReleaseParams{FenceParams: fence, Error: "test"}); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, store.DeleteParams{Scope: "s", Key: "k"}); err == nil || !strings.Contains(err.Error(), "could not drop the cache entry") {
		t.Errorf("Delete with the cache down: %v", err)
	}
	if _, err := s.Get(ctx, "s", "k"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("the record outlived the Delete: %v", err)
	}
}

func TestOpenWithCache(t *testing.T) {
	t.Parallel()
	redisURL := testenv.RedisURL(t)
	ctx := context.Background()
	prefix := fmt.Sprintf("idem:test:storeurl:%d:", time.Now().UnixNano())
	rdb := goredis.NewClient(&goredis.Options{Addr: testenv.RedisAddr(t), DB: testenv.RedisDB(t)})
	defer rdb.Close()
	entries := func() []string {
		keys, err := rdb.Keys(ctx, prefix+"*").Result()
		if err != nil {
			t.Fatal(err)
		}
		return keys
	}
	defer func() {
		if keys := entries(); len(keys) > 0 {
			rdb.Del(ctx, keys...)
		}
	}()

	dsn := "sqlite:" + filepath.Join(t.TempDir(), "idem.db")
	s, err := storeurl.Open(ctx, dsn, storeurl.Options{Migrate: true, Cache: redisURL + "?prefix=" + prefix})
	if err != nil {
		t.Fatal(err)
	}
	p := completeAndReplay(t, s)
	if keys := entries(); len(keys) != 1 {
		t.Fatalf("cache entries %v, want 1 under %s", keys, prefix)
	}
	if err := s.Delete(ctx, store.DeleteParams{Scope: "s", Key: "k"}); err != nil {
		t.Fatal(err)
	}
	for _, k := range entries() {
		if v, err := rdb.Get(ctx, k).Result(); err == nil && v != cache.Tombstone {
			t.Errorf("Delete left the entry %s", k)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// Close closed the backing store and the cache's client.
	if err := s.Ping(ctx); err == nil {
		t.Error("the store answers after Close")
	}
	if _, err := s.Reserve(ctx, p); err == nil || errors.Is(err, store.ErrInvalidParams) {
		t.Errorf("Reserve after Close: %v", err)
	}
}

// A cache that stops answering without refusing (hung, or cut off by a
// network that drops packets) costs a request at most the cache's
// Timeout: the client made here respects contexts, so that the bound
// holds within a connection's reads too. Before, each read waited for
// go-redis's ReadTimeout (3s), and the store call, within the engine's
// deadline, failed.
func TestOpenWithStalledCache(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l := testenv.NewLink(t, testenv.RedisAddr(t))
	prefix := testenv.Name("idem:test:storeurl:") + ":"
	t.Cleanup(func() {
		rdb := goredis.NewClient(&goredis.Options{Addr: testenv.RedisAddr(t), DB: testenv.RedisDB(t)})
		defer rdb.Close()
		if keys, err := rdb.Keys(ctx, prefix+"*").Result(); err == nil && len(keys) > 0 {
			rdb.Del(ctx, keys...)
		}
	})
	dsn := "sqlite:" + filepath.Join(t.TempDir(), "idem.db")
	cacheURL := fmt.Sprintf("redis://%s/%d?prefix=%s", l.Addr(), testenv.RedisDB(t), prefix)
	s, err := storeurl.Open(ctx, dsn, storeurl.Options{Migrate: true, Cache: cacheURL,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	p := completeAndReplay(t, s) // the replay writes the entry
	l.Stall()
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	start := time.Now()
	res, err := s.Reserve(rctx, p)
	if err != nil || res.Record.State != store.StateCompleted || time.Since(start) > time.Second {
		t.Fatalf("replay with the cache stalled: %v %v after %v, want the store's answer within 1s",
			res.Record.State, err, time.Since(start).Round(time.Millisecond))
	}
}

// completeAndReplay completes key "k" of scope "s" through s and replays it
// once, which through a cache writes its entry; it returns the key's
// reservation.
func completeAndReplay(t *testing.T, s store.Store) store.ReserveParams {
	t.Helper()
	ctx := context.Background()
	p := store.ReserveParams{Scope: "s", Key: "k", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour, LeasePolicy: store.LeaseUnknown}
	res, err := s.Reserve(ctx, p)
	if err != nil || res.Outcome != store.Created {
		t.Fatal(res.Outcome, err)
	}
	if err := s.Complete(ctx, store.CompleteParams{FenceParams: store.FenceParams{Scope: "s", Key: "k", Fence: res.Record.Fence},
		Response: store.Response{Status: 200, Body: []byte("ok")}}); err != nil {
		t.Fatal(err)
	}
	if res, err := s.Reserve(ctx, p); err != nil || res.Record.State != store.StateCompleted {
		t.Fatal(res, err)
	}
	return p
}
