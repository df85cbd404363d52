// Package memory is an in-process idem store for tests and single-process
// services. It keeps nothing across a restart; use the sqlite store for an
// embedded durable one.
package memory

import (
	"context"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/storekit"
)

var _ store.Store = (*Store)(nil)

// Config configures a memory store.
type Config struct {
	// Clock overrides the process clock (tests). Defaults to time.Now.
	Clock store.Clock
}

type id struct{ scope, key string }

// entry is a record with room for its response, so completing it does not
// allocate.
type entry struct {
	store.Record
	resp   store.Response
	tenant string // ReserveParams.Tenant at creation
}

// Store is a map behind one mutex: every transition is trivially atomic.
// Responses are kept by reference: the engine hands over ownership of the
// body and headers at Complete and never modifies them afterwards, and
// callers must not modify the records they get back.
type Store struct {
	clock store.Clock
	mu    sync.Mutex
	recs  map[id]*entry
	// tenants indexes the records by tenant, for the cap on active
	// records (ReserveParams.MaxActive). It is built at the first capped
	// call and kept from then on; nil until then, so a store that never
	// sees a cap does not pay for it.
	tenants map[string]map[id]*entry
	// header is the header of the last answer stored. An answer with the
	// same header shares it (see Complete).
	header map[string][]string
	// scope and tenant are those of the last record created (see put).
	scope, tenant string
}

// New returns an empty store.
func New(cfg Config) *Store {
	c := cfg.Clock
	if c == nil {
		c = time.Now
	}
	return &Store{clock: c, recs: make(map[id]*entry)}
}

// now reads the clock at the resolution every store keeps, so that the
// memory store answers what a durable one would.
func (s *Store) now() time.Time { return s.clock().UTC().Truncate(store.Resolution) }

// after is now plus d rounded up as every store rounds durations.
func after(now time.Time, d time.Duration) time.Time { return now.Add(storekit.RoundUp(d)) }

// Reserve implements store.Store.
func (s *Store) Reserve(ctx context.Context, p store.ReserveParams) (store.ReserveResult, error) {
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
	var r *store.Record
	if e := s.recs[k]; e != nil {
		r = &e.Record
	}
	act := storekit.ActCreate
	if r != nil {
		act = storekit.Decide(r, &p, now)
	}
	if err := storekit.CheckCap(&p, act, s.counter(p.Tenant)); err != nil {
		return store.ReserveResult{}, err
	}
	fresh := func(fence int64) store.ReserveResult {
		n := s.put(k, r != nil, p.Tenant, store.Record{
			Scope: p.Scope, Key: p.Key, Fingerprint: p.Fingerprint,
			State: store.StateInProgress, Fence: fence, LeasePolicy: p.LeasePolicy,
			LockedUntil: after(now, p.Lease), Attempts: 1,
			CreatedAt: now, UpdatedAt: now, ExpiresAt: after(now, p.TTL),
		})
		return store.ReserveResult{Outcome: store.Created, Record: n.Record}
	}
	if r == nil {
		return fresh(storekit.NextFence(0, now)), nil
	}
	switch act {
	case storekit.ActCreate:
		return fresh(storekit.NextFence(r.Fence, now)), nil
	case storekit.ActReclaim:
		s.take(r, now, p.Lease, p.TTL, true)
		return store.ReserveResult{Outcome: store.Reclaimed, Record: *r}, nil
	case storekit.ActTakeOver:
		s.take(r, now, p.Lease, p.TTL, false)
		return store.ReserveResult{Outcome: store.TakenOver, Record: *r}, nil
	case storekit.ActLeaseExpired:
		toUnknown(r, now, "lease_expired")
	}
	return store.ReserveResult{Outcome: store.Existing, Record: *r}, nil
}

// put stores a new record r under k for tenant, in place of the record
// there was if replace: a new key costs the caller's lookup and one
// insertion, no lookup of its own.
func (s *Store) put(k id, replace bool, tenant string, r store.Record) *entry {
	if replace {
		s.forget(k)
	}
	// Every record of one operation has the same scope, and mostly the
	// same tenant as the last one: equal strings share one copy, so that
	// a store of many records holds fewer objects for the garbage
	// collector to trace.
	k.scope = same(&s.scope, k.scope)
	r.Scope = k.scope
	n := &entry{tenant: same(&s.tenant, tenant), Record: r}
	s.recs[k] = n
	if s.tenants != nil {
		s.index(k, n)
	}
	return n
}

// same returns *last if it equals v, else v, which becomes *last.
func same(last *string, v string) string {
	if *last != v {
		*last = v
	}
	return *last
}

// index adds the record e, stored under k, to the tenant index.
func (s *Store) index(k id, e *entry) {
	t := s.tenants[e.tenant]
	if t == nil {
		t = make(map[id]*entry)
		s.tenants[e.tenant] = t
	}
	t[k] = e
}

// counter counts the tenant's active records, for storekit.CheckCap.
// The memory store is for tests and small services: counting the tenant's
// records is fine.
func (s *Store) counter(tenant string) func() (int, error) {
	return func() (int, error) {
		if s.tenants == nil {
			s.tenants = make(map[string]map[id]*entry)
			for k, e := range s.recs {
				s.index(k, e)
			}
		}
		n := 0
		for _, e := range s.tenants[tenant] {
			if e.State.Active() {
				n++
			}
		}
		return n, nil
	}
}

// forget removes the record k from the maps, if it is there.
func (s *Store) forget(k id) {
	e := s.recs[k]
	if e == nil {
		return
	}
	delete(s.recs, k)
	if t := s.tenants[e.tenant]; t != nil {
		delete(t, k)
		if len(t) == 0 {
			delete(s.tenants, e.tenant)
		}
	}
}

func (s *Store) take(r *store.Record, now time.Time, lease, ttl time.Duration, reclaim bool) {
	if reclaim {
		r.ExpiresAt = after(now, ttl)
	}
	r.State = store.StateInProgress
	r.Fence = storekit.NextFence(r.Fence, now)
	r.Attempts++
	r.LockedUntil = after(now, lease)
	r.LastError = ""
	r.UpdatedAt = now
}

func toUnknown(r *store.Record, now time.Time, why string) {
	r.State = store.StateUnknown
	r.LastError = why
	r.ReconcileAfter = now
	r.UpdatedAt = now
}

// held runs f on the record if the caller holds its lease. valid is the
// parameters' own check.
func (s *Store) held(ctx context.Context, valid error, fp store.FenceParams, f func(r *entry, now time.Time)) error {
	if valid != nil {
		return valid
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.recs[id{fp.Scope, fp.Key}]
	if r == nil || r.State != store.StateInProgress || r.Fence != fp.Fence {
		return store.ErrLeaseLost
	}
	f(r, now)
	r.UpdatedAt = now
	return nil
}

// Complete implements store.Store.
func (s *Store) Complete(ctx context.Context, p store.CompleteParams) error {
	return s.held(ctx, p.Validate(), p.FenceParams, func(r *entry, now time.Time) {
		p.Response.Header = s.share(p.Response.Header)
		r.complete(now, p.Response, p.TTL)
	})
}

// share returns the header of the last answer stored if h equals it, else
// h, which becomes the one to share. The answers of one route mostly carry
// the same few headers, and a header map costs more memory than the rest of
// a small record: sharing it keeps a store of many answers smaller and
// quicker for the garbage collector to trace. Stored headers are never
// modified (see Store), so sharing one is safe.
func (s *Store) share(h map[string][]string) map[string][]string {
	if len(h) == 0 || len(h) != len(s.header) {
		s.header = h
		return h
	}
	for k, v := range h {
		if w, ok := s.header[k]; !ok || !slices.Equal(v, w) {
			s.header = h
			return h
		}
	}
	return s.header
}

func (r *entry) complete(now time.Time, resp store.Response, ttl time.Duration) {
	r.State = store.StateCompleted
	r.Request = nil
	r.resp = resp
	r.Response = &r.resp
	r.CompletedAt = now
	if ttl > 0 {
		r.ExpiresAt = after(now, ttl)
	}
}

// Release implements store.Store.
func (s *Store) Release(ctx context.Context, p store.ReleaseParams) error {
	return s.held(ctx, p.Validate(), p.FenceParams, func(r *entry, now time.Time) {
		r.State = store.StateFailedRetryable
		r.LastError = p.Error
		r.Request = nil
	})
}

// MarkUnknown implements store.Store.
func (s *Store) MarkUnknown(ctx context.Context, p store.ReleaseParams) error {
	return s.held(ctx, p.Validate(), p.FenceParams, func(r *entry, now time.Time) {
		toUnknown(&r.Record, now, p.Error)
		if p.Request != nil {
			req := *p.Request
			r.Request = &req
		}
	})
}

// Checkpoint implements store.Store.
func (s *Store) Checkpoint(ctx context.Context, p store.CheckpointParams) error {
	return s.held(ctx, p.Validate(), p.FenceParams, func(r *entry, now time.Time) {
		r.RecoveryPoint = p.RecoveryPoint
	})
}

// Extend implements store.Store.
func (s *Store) Extend(ctx context.Context, p store.ExtendParams) error {
	return s.held(ctx, p.Validate(), p.FenceParams, func(r *entry, now time.Time) {
		r.LockedUntil = after(now, p.Lease)
	})
}

// Get implements store.Store.
func (s *Store) Get(ctx context.Context, scope, key string) (store.Record, error) {
	if err := store.CheckID(scope, key); err != nil {
		return store.Record{}, err
	}
	if err := ctx.Err(); err != nil {
		return store.Record{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.recs[id{scope, key}]
	if r == nil {
		return store.Record{}, store.ErrNotFound
	}
	return r.Record, nil
}

// Delete implements store.Store.
func (s *Store) Delete(ctx context.Context, scope, key string) error {
	if err := store.CheckID(scope, key); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	k := id{scope, key}
	switch r := s.recs[k]; {
	case r == nil:
		return store.ErrNotFound
	case r.State == store.StateInProgress:
		return store.ErrStateConflict
	}
	s.forget(k)
	return nil
}

// scan visits, under the lock and oldest first by the time by returns, at
// most limit records for which keep holds. The memory store is for tests
// and small services, so a full scan is fine.
func (s *Store) scan(ctx context.Context, valid error, limit int, keep func(r *store.Record, now time.Time) bool,
	by func(*store.Record) time.Time, visit func(r *entry, now time.Time)) error {
	if valid != nil {
		return valid
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	var rs []*entry
	for _, r := range s.recs {
		if keep(&r.Record, now) {
			rs = append(rs, r)
		}
	}
	sort.Slice(rs, func(i, j int) bool {
		ti, tj := by(&rs[i].Record), by(&rs[j].Record)
		if !ti.Equal(tj) {
			return ti.Before(tj)
		}
		if rs[i].Scope != rs[j].Scope {
			return rs[i].Scope < rs[j].Scope
		}
		return rs[i].Key < rs[j].Key
	})
	for _, r := range rs[:min(limit, len(rs))] {
		visit(r, now)
	}
	return nil
}

// SweepExpiredLeases implements store.Store.
func (s *Store) SweepExpiredLeases(ctx context.Context, p store.SweepParams) ([]store.Record, error) {
	var out []store.Record
	err := s.scan(ctx, p.Validate(), p.Limit, func(r *store.Record, now time.Time) bool {
		return r.LeaseExpired(now.Add(-storekit.RoundUp(p.Grace))) && r.LeasePolicy == store.LeaseUnknown
	}, func(r *store.Record) time.Time { return r.LockedUntil }, func(r *entry, now time.Time) {
		toUnknown(&r.Record, now, "lease_expired")
		out = append(out, r.Record)
	})
	return out, err
}

// Reap implements store.Store.
func (s *Store) Reap(ctx context.Context, p store.ReapParams) (store.ReapResult, error) {
	var res store.ReapResult
	err := s.scan(ctx, p.Validate(), p.Limit, func(r *store.Record, now time.Time) bool {
		// Pending records are ended by ExpirePending at their deadline,
		// as in every other store, never abandoned here.
		return r.State != store.StateExpired && r.State != store.StatePending && !now.Before(r.ExpiresAt) &&
			(r.State != store.StateInProgress || r.LeaseExpired(now))
	}, func(r *store.Record) time.Time { return r.ExpiresAt }, func(r *entry, now time.Time) {
		switch {
		case r.State.Terminal() && p.Soft:
			r.State = store.StateExpired
			r.UpdatedAt = now
			res.Deleted++
		case r.State.Terminal():
			s.forget(id{r.Scope, r.Key})
			res.Deleted++
		default: // in_progress whose holder died, or unknown: abandoned
			r.complete(now, p.Abandoned, p.AbandonedTTL)
			r.ExpiresAt = after(now, p.AbandonedTTL) // even for a zero ttl
			r.ReconcileAfter, r.DeadLetteredAt = time.Time{}, time.Time{}
			r.LastError = "abandoned"
			r.UpdatedAt = now
			res.Abandoned++
		}
	})
	return res, err
}

// ListUnknown implements store.Store.
func (s *Store) ListUnknown(ctx context.Context, p store.ListUnknownParams) ([]store.Record, error) {
	var out []store.Record
	err := s.scan(ctx, p.Validate(), p.Limit, func(r *store.Record, now time.Time) bool {
		return r.State == store.StateUnknown &&
			(!p.DueOnly || (!now.Before(r.ReconcileAfter) && !r.DeadLettered()))
	}, func(r *store.Record) time.Time { return r.ReconcileAfter }, func(r *entry, now time.Time) {
		out = append(out, r.Record)
	})
	return out, err
}

// unknown runs f on an unknown record; a positive fence must be the
// record's (Resolve), zero takes any (Defer).
func (s *Store) unknown(ctx context.Context, scope, key string, fence int64, f func(r *entry, now time.Time)) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.recs[id{scope, key}]
	switch {
	case r == nil:
		return store.ErrNotFound
	case fence > 0 && r.Fence != fence:
		return store.ErrLeaseLost
	case r.State != store.StateUnknown:
		return store.ErrStateConflict
	}
	f(r, now)
	r.UpdatedAt = now
	return nil
}

// Resolve implements store.Store.
func (s *Store) Resolve(ctx context.Context, p store.ResolveParams) error {
	if err := p.Validate(); err != nil {
		return err
	}
	return s.unknown(ctx, p.Scope, p.Key, p.Fence, func(r *entry, now time.Time) {
		r.ReconcileAfter = time.Time{}
		r.DeadLetteredAt = time.Time{}
		if p.To == store.StateCompleted {
			r.complete(now, *p.Response, p.TTL)
			r.LastError = ""
			return
		}
		r.State = store.StateFailedRetryable
		r.Request = nil
		if p.TTL > 0 {
			r.ExpiresAt = after(now, p.TTL)
		}
	})
}

// Defer implements store.Store.
func (s *Store) Defer(ctx context.Context, p store.DeferParams) error {
	if err := p.Validate(); err != nil {
		return err
	}
	return s.unknown(ctx, p.Scope, p.Key, 0, func(r *entry, now time.Time) {
		r.ReconcileAttempts++
		r.LastError = p.Error
		if p.DeadLetter {
			r.DeadLetteredAt = now
			return
		}
		r.ReconcileAfter = after(now, p.Delay)
	})
}

// Ping implements store.Store.
func (s *Store) Ping(ctx context.Context) error { return ctx.Err() }

// Close implements store.Store.
func (s *Store) Close() error { return nil }

var _ store.ActiveCounter = (*Store)(nil)

// CountActive implements store.ActiveCounter.
func (s *Store) CountActive(ctx context.Context, limit int) (int, error) {
	if err := store.CheckActiveLimit(limit); err != nil {
		return 0, err
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, r := range s.recs {
		if n == limit {
			break
		}
		if r.State.Active() {
			n++
		}
	}
	return n, nil
}
