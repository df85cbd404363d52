package postgres

import (
	"container/list"
	"testing"
	"time"

	"github.com/idem-go/idem/store"
)

// The replay cache answers a record only until the database's clock,
// which may be ahead of this process's by as much as the last renewal
// measured, says it is within cacheExpiryMargin of its expiry.
func TestReplayCacheAllowsForTheDatabasesClock(t *testing.T) {
	c := &replayCache{s: &Store{}, budget: 1 << 20, byKey: map[cacheID]*list.Element{}}
	c.validUntil.Store(monoNow() + int64(time.Hour))
	now := time.Now()
	rec := store.Record{Scope: "s", Key: "k", Fingerprint: "fp", State: store.StateCompleted,
		ExpiresAt: now.Add(5 * time.Second), Response: &store.Response{Status: 201}}
	c.keep(&rec, 0)
	p := store.ReserveParams{Scope: "s", Key: "k", Fingerprint: "fp"}
	for _, tc := range []struct {
		dbAhead time.Duration
		served  bool
	}{
		{-10 * time.Second, true}, // behind: the database expires it later than this process would
		{0, true},
		{3 * time.Second, true},          // 2s left by the database's clock: more than the margin
		{4500 * time.Millisecond, false}, // 0.5s left: within the margin
		{10 * time.Second, false},        // expired by the database's clock
	} {
		c.measureSkew(now, now.Add(tc.dbAhead))
		if _, _, ok := c.lookup(&p, now); ok != tc.served {
			t.Errorf("database clock %v ahead: served %v, want %v", tc.dbAhead, ok, tc.served)
		}
	}
	// With Config.Clock both sides read one clock: nothing is measured.
	c.s.cfg.Clock = time.Now
	c.skew.Store(0)
	c.measureSkew(now, now.Add(10*time.Second))
	if _, _, ok := c.lookup(&p, now); !ok {
		t.Error("with Config.Clock the database's clock was allowed for")
	}
}
