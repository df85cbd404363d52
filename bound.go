package idem

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/idem-go/idem/internal/plural"
	"github.com/idem-go/idem/store"
)

// activeBound is the bound on the records active across the whole store
// (Config.StoreMaxActive). The store counts them (store.ActiveCounter) at
// most every Config.StoreActiveRecount; between two counts the bound adds
// the records this engine created, so that one instance never passes it on
// its own. See Config.StoreMaxActive for its precision across instances.
type activeBound struct {
	max   int
	every time.Duration
	count func(ctx context.Context, limit int) (int, error)

	mu sync.Mutex
	// n is the last count plus the records created here since; at is
	// when it was counted, zero before the first count. made counts the
	// records created here: those created while a count ran are added to
	// it (some may be in it already: the bound errs on the side of
	// refusing until the next count).
	n        int
	at       time.Time
	made     int
	counting bool
}

// newActiveBound is the bound of set over s, nil without one; set passed
// checkActiveBound.
func newActiveBound(s store.Store, set *settings) *activeBound {
	c, ok := s.(store.ActiveCounter)
	if set.StoreMaxActive <= 0 || !ok {
		return nil
	}
	return &activeBound{max: set.StoreMaxActive, every: set.StoreActiveRecount, count: c.CountActive}
}

// checkActiveBound refuses StoreMaxActive over a store that cannot count
// its active records.
func checkActiveBound(s store.Store, set *settings) error {
	if set.StoreMaxActive <= 0 {
		return nil
	}
	if _, ok := s.(store.ActiveCounter); !ok {
		return fmt.Errorf("idem: StoreMaxActive: the %s store cannot count the records active across it (store.ActiveCounter); use a SQL store or leave the bound unset", StoreName(s))
	}
	if r, ok := s.(store.ActiveCountRefuser); ok {
		if why := r.ActiveCountUnsupported(); why != "" {
			return fmt.Errorf("idem: StoreMaxActive: %s; use a SQL store or leave the bound unset", why)
		}
	}
	if r, ok := s.(store.CapRefuser); ok {
		if why := r.TenantCapUnsupported(); why != "" {
			return fmt.Errorf("idem: StoreMaxActive: %s", why)
		}
	}
	return nil
}

// full reports whether the store holds the bound's number of active
// records, counting them again when the last count is older than every
// (one caller counts, the others meanwhile use the last count). wait is
// how long until the next count. count runs the store call.
func (b *activeBound) full(now time.Time, count func(func(context.Context) error) error) (full bool, wait time.Duration, err error) {
	b.mu.Lock()
	if b.at.IsZero() || (now.Sub(b.at) >= b.every && !b.counting) {
		b.counting = true
		made := b.made
		b.mu.Unlock()
		var n int
		err = count(func(ctx context.Context) (err error) {
			n, err = b.count(ctx, b.max)
			return err
		})
		b.mu.Lock()
		b.counting = false
		if err == nil {
			b.n, b.at = n+b.made-made, now
		}
	}
	defer b.mu.Unlock()
	if err != nil {
		return false, 0, err
	}
	return b.n >= b.max, max(0, b.every-now.Sub(b.at)), nil
}

// created counts a record this engine made active since the last count.
func (b *activeBound) created() {
	b.mu.Lock()
	b.n++
	b.made++
	b.mu.Unlock()
}

// detail is the detail of the bound's refusal.
func (b *activeBound) detail() string {
	return "the store holds " + plural.Count(b.max, "request", "requests") + " waiting for a worker, in progress or awaiting reconciliation"
}
