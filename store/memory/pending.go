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
	e, rs, slot := s.lookup(k)
	var prev *store.Record
	if r, ok := s.read(e, rs, slot); ok {
		prev = &r
	}
	out, r, write, err := storekit.ApplyPending(prev, &p, now, s.counter(p.Tenant))
	switch {
	case err != nil:
		return store.ReserveResult{}, err
	case out == store.Created:
		n := new(entry)
		n.set(&r)
		s.put(k, prev != nil, p.Tenant, n)
		r.Scope = n.scope
	case write:
		if e == nil {
			e = s.thaw(rs, slot)
		}
		if e.set(&r) {
			s.rekey(e)
		}
	}
	return store.ReserveResult{Outcome: out, Record: r}, nil
}

// Claim implements store.Queue.
func (s *Store) Claim(ctx context.Context, p store.ClaimParams) ([]store.Record, error) {
	var out []store.Record
	err := s.scan(ctx, p.Validate(), p.Limit, func(e *entry, now micros) bool {
		return e.state == stPending && now.before(e.lockedUntil) && e.rare().request != nil && e.rare().request.Queue == p.Queue
	}, func(e *entry) micros { return e.createdAt }, func(e *entry, now time.Time) {
		e.state = stInProgress
		e.fence = storekit.NextFence(e.fence, now)
		e.attempts++
		e.lockedUntil = at(after(now, p.Lease))
		e.updatedAt = at(now)
		out = append(out, e.record())
	})
	return out, err
}

// ExpirePending implements store.Queue.
func (s *Store) ExpirePending(ctx context.Context, p store.ExpirePendingParams) ([]store.Record, error) {
	var out []store.Record
	err := s.scan(ctx, p.Validate(), p.Limit, func(e *entry, now micros) bool {
		return e.state == stPending && !now.before(e.lockedUntil)
	}, func(e *entry) micros { return e.lockedUntil }, func(e *entry, now time.Time) {
		s.complete(e, now, p.Response, p.TTL, false)
		e.setError(store.ExpiredPendingError)
		e.updatedAt = at(now)
		out = append(out, e.record())
	})
	return out, err
}
