package cache

import (
	"context"
	"fmt"

	"github.com/idem-go/idem/store"
)

var _ store.DurabilityChecker = (*Store)(nil)

// CheckDurability reports the backing store's durability: the cache only
// holds copies of what the backing store keeps, so an answer is as durable
// as the backing store's write of it. A backing store without a check is
// reported unknown.
func (s *Store) CheckDurability(ctx context.Context) (store.Durability, error) {
	if c, ok := s.Store.(store.DurabilityChecker); ok {
		return c.CheckDurability(ctx)
	}
	return store.Durability{State: store.DurabilityUnknown, Replicas: -1,
		Warnings: []string{"the store behind the replay cache does not check its durability"}}, nil
}

var _ store.Syncer = (*Store)(nil)

// Sync forwards to the backing store, whose writes the cache's copies
// are: nil at once when it has no such gap between visible and durable.
func (s *Store) Sync(ctx context.Context) error {
	if c, ok := s.Store.(store.Syncer); ok {
		return c.Sync(ctx)
	}
	return nil
}

var (
	_ store.ActiveCounter      = (*Store)(nil)
	_ store.ActiveCountRefuser = (*Store)(nil)
)

// CountActive forwards to the backing store, which holds every record
// (the cache keeps completed answers only).
func (s *Store) CountActive(ctx context.Context, limit int) (int, error) {
	if c, ok := s.Store.(store.ActiveCounter); ok {
		return c.CountActive(ctx, limit)
	}
	return 0, fmt.Errorf("idem/cache: %s: %w", s.ActiveCountUnsupported(), store.ErrCapUnsupported)
}

// ActiveCountUnsupported says why the cache cannot count: it counts
// exactly when its backing store does.
func (s *Store) ActiveCountUnsupported() string {
	if _, ok := s.Store.(store.ActiveCounter); !ok {
		return fmt.Sprintf("the %T store behind the replay cache does not count its active records (store.ActiveCounter)", s.Store)
	}
	if r, ok := s.Store.(store.ActiveCountRefuser); ok {
		return r.ActiveCountUnsupported()
	}
	return ""
}

var _ store.CapRefuser = (*Store)(nil)

// TenantCapUnsupported forwards to the backing store, which counts and
// reserves every record: the cache refuses a cap, or the store-wide bound,
// exactly when its backing store does, so that such a configuration fails
// when the engine is made instead of at every new key.
func (s *Store) TenantCapUnsupported() string {
	if r, ok := s.Store.(store.CapRefuser); ok {
		return r.TenantCapUnsupported()
	}
	return ""
}
