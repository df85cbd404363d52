package cache_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/testkit/pgcluster"
	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/cache"
	"github.com/idem-go/idem/store/postgres"
)

// Sync is the backing store's: over a PostgreSQL store whose synchronous
// standby stopped, it does not return nil while the standby is away.
func TestSyncIsTheBackingStores(t *testing.T) {
	rdb, prefix := redisClient(t)
	pair := pgcluster.StartPair(t, true)
	ctx := t.Context()
	pg, err := postgres.Open(ctx, pair.Primary.DSN(), postgres.Config{MaxConns: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Close()
	c := cache.New(pg, rdb, cache.Config{Prefix: prefix, Logger: quiet})
	defer c.Close()
	var _ store.Syncer = c
	if err := c.Sync(ctx); err != nil {
		t.Fatalf("sync with the standby streaming: %v", err)
	}
	pair.StopStandby(t)
	sctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if err := c.Sync(sctx); err == nil || !strings.Contains(err.Error(), "sync") {
		t.Fatalf("sync with the standby stopped: %v, want the backing store's failure", err)
	}
}
