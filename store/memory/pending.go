package memory

import (
	"context"
	"time"

	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/storekit"
)

var _ store.Queue = (*Store)(nil)

// ReservePending implements store.Queue.
func (s *Store) ReservePending(ctx context.Context, p store.PendingParams) (store.ReserveResult, error) {
	if err := p.Validate(); err != nil {
		return store.ReserveResult{}, err
	}
	if err := ctx.Err(); err != nil {
		return store.ReserveResult{}, err
	}
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	k := id{p.Scope, p.Key}
	e := s.recs[k]
	var prev *store.Record
	if e != nil {
		prev = &e.Record
	}
	out, r, write, err := storekit.ApplyPending(prev, &p, now, s.counter(p.Tenant))
	switch {
	case err != nil:
		return store.ReserveResult{}, err
	case out == store.Created:
		s.put(k, e != nil, p.Tenant, r)
	case write:
		e.Record = r
	}
	return store.ReserveResult{Outcome: out, Record: r}, nil
}

// Claim implements store.Queue.
func (s *Store) Claim(ctx context.Context, p store.ClaimParams) ([]store.Record, error) {
	var out []store.Record
	err := s.scan(ctx, p.Validate(), p.Limit, func(r *store.Record, now time.Time) bool {
		return r.State == store.StatePending && now.Before(r.LockedUntil) && r.Request != nil && r.Request.Queue == p.Queue
	}, func(r *store.Record) time.Time { return r.CreatedAt }, func(r *entry, now time.Time) {
		r.State = store.StateInProgress
		r.Fence = storekit.NextFence(r.Fence, now)
		r.Attempts++
		r.LockedUntil = after(now, p.Lease)
		r.UpdatedAt = now
		out = append(out, r.Record)
	})
	return out, err
}

// ExpirePending implements store.Queue.
func (s *Store) ExpirePending(ctx context.Context, p store.ExpirePendingParams) ([]store.Record, error) {
	var out []store.Record
	err := s.scan(ctx, p.Validate(), p.Limit, func(r *store.Record, now time.Time) bool {
		return r.State == store.StatePending && !now.Before(r.LockedUntil)
	}, func(r *store.Record) time.Time { return r.LockedUntil }, func(r *entry, now time.Time) {
		r.complete(now, p.Response, p.TTL)
		r.LastError = store.ExpiredPendingError
		r.UpdatedAt = now
		out = append(out, r.Record)
	})
	return out, err
}
