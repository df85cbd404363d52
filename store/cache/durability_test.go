package cache_test

import (
	"strings"
	"testing"

	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/cache"
	"github.com/idem-go/idem/store/memory"
)

// The cache's answers are as durable as its backing store's writes: over a
// store that cannot check its durability, the report says it does not know
// (no replica count, not at risk, not safe) and warns, so that an operator
// never reads a count of replicas nobody saw.
func TestDurabilityOfAnUncheckedBackingStore(t *testing.T) {
	rdb, prefix := redisClient(t)
	c := cache.New(memory.New(memory.Config{}), rdb, cache.Config{Prefix: prefix, Logger: quiet})
	d, err := c.CheckDurability(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if d.State != store.DurabilityUnknown || d.Replicas != -1 || d.AtRisk() || len(d.Warnings) == 0 {
		t.Fatalf("durability over a store without a check: %+v, want unknown with no replica count and a warning", d)
	}
	if s := d.String(); !strings.Contains(s, "replicas=unknown") {
		t.Fatalf("durability summary %q does not say the replicas are unknown", s)
	}
}
