package cache_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/testkit/enginetest"
	"github.com/idem-go/idem/maintenance"
	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/cache"
	"github.com/idem-go/idem/store/memory"
)

// Asynchronous routes need a backing store that keeps pending requests
// (store.Queue): over one that keeps none, the cache implements the queue
// but must not pass for one that keeps them, or New would accept Async and
// every asynchronous request would fail at run time.
func TestAsyncNeedsABackingStoreWithAQueue(t *testing.T) {
	t.Parallel()
	rdb, prefix := redisClient(t)
	noQueue := struct{ store.Store }{memory.New(memory.Config{})}
	c := cache.New(noQueue, rdb, cache.Config{Prefix: prefix, Logger: quiet})
	const why = "behind the replay cache"
	if _, err := idem.New(c, idem.Config{Async: true, Logger: quiet}); err == nil || !strings.Contains(err.Error(), why) {
		t.Errorf("Async over the cache over a store without a queue: %v, want a refusal naming the reason", err)
	}
	e, err := idem.New(c, idem.Config{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.With(func(c *idem.Config) { c.Async = true }); err == nil || !strings.Contains(err.Error(), why) {
		t.Errorf("With(Async) over the cache over a store without a queue: %v, want a refusal naming the reason", err)
	}
	if _, err := e.NewWorker(idem.WorkerConfig{Handler: http.NotFoundHandler()}); err == nil || !strings.Contains(err.Error(), why) {
		t.Errorf("NewWorker over the cache over a store without a queue: %v, want a refusal naming the reason", err)
	}
	// The sweeper has no pending requests to end there, as over the
	// backing store itself.
	m, err := maintenance.New(c, maintenance.Config{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := m.ExpirePendingOnce(context.Background()); n != 0 || err != nil {
		t.Errorf("ExpirePendingOnce over the cache over a store without a queue: %d %v, want 0 and no error", n, err)
	}

	// Over a store that keeps them, the asynchronous engine and its worker
	// are made and run.
	c = cache.New(memory.New(memory.Config{}), rdb, cache.Config{Prefix: prefix, Logger: quiet})
	a := enginetest.NewAsyncApp(t, c, idem.Config{})
	enginetest.WantAccepted(t, a.Post("acme", "k", `{}`), "")
	if n, err := a.Worker.RunOnce(context.Background()); n != 1 || err != nil {
		t.Fatalf("RunOnce over the cache over the memory store: %d %v, want 1", n, err)
	}
	if got := a.Post("acme", "k", `{}`); got.Status != http.StatusCreated {
		t.Fatalf("replay of the run request over the cache: %d %s, want 201", got.Status, got.Body)
	}
}
