package cache

import (
	"context"
	"fmt"

	"github.com/idem-go/idem/store"
)

var (
	_ store.Queue        = (*Store)(nil)
	_ store.QueueRefuser = (*Store)(nil)
)

// queue returns the backing store's queue.
func (s *Store) queue() (store.Queue, error) {
	q, why := store.AsQueue(s.Store)
	if q == nil {
		return nil, fmt.Errorf("idem/cache: %s", why)
	}
	return q, nil
}

// QueueUnsupported says why the cache keeps no pending requests: it keeps
// them exactly when its backing store does, so that an asynchronous
// engine or a worker over a cache whose backing store keeps none is
// refused when it is made instead of failing at every request.
func (s *Store) QueueUnsupported() string {
	if _, why := store.AsQueue(s.Store); why != "" {
		return "behind the replay cache, " + why
	}
	return ""
}

// ReservePending answers replays from the cache, as Reserve does, and
// everything else from the backing store.
func (s *Store) ReservePending(ctx context.Context, p store.PendingParams) (store.ReserveResult, error) {
	if err := p.Validate(); err != nil {
		return store.ReserveResult{}, err
	}
	q, err := s.queue()
	if err != nil {
		return store.ReserveResult{}, err
	}
	now := s.cfg.Clock()
	if rec, ok := s.lookup(ctx, p.Scope, p.Key, now); ok && rec.Fingerprint == p.Fingerprint {
		return store.ReserveResult{Outcome: store.Existing, Record: rec}, nil
	}
	res, err := q.ReservePending(ctx, p)
	if err == nil && res.Outcome == store.Existing && res.Record.State == store.StateCompleted {
		s.fill(ctx, res.Record, now)
	}
	return res, err
}

// Claim is the backing store's.
func (s *Store) Claim(ctx context.Context, p store.ClaimParams) ([]store.Record, error) {
	q, err := s.queue()
	if err != nil {
		return nil, err
	}
	return q.Claim(ctx, p)
}

// ExpirePending is the backing store's: the records it ends were pending,
// so the cache holds no entry of them.
func (s *Store) ExpirePending(ctx context.Context, p store.ExpirePendingParams) ([]store.Record, error) {
	q, err := s.queue()
	if err != nil {
		return nil, err
	}
	return q.ExpirePending(ctx, p)
}
