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

// Store is a map behind one mutex: every transition is trivially atomic.
// A response's headers are kept by reference: the engine hands over
// ownership of them at Complete and never modifies them afterwards. Its
// body is copied into the record's own text (see entry). Callers must not
// modify the records they get back.
type Store struct {
	clock store.Clock
	mu    sync.Mutex
	// scopes holds the records by scope (see records); last is the
	// scope of the last call.
	scopes map[string]*records
	last   *records
	// cold holds the completed records the collector never traces.
	cold cold
	// tenants indexes the records by tenant, for the cap on active
	// records (ReserveParams.MaxActive). It is built at the first capped
	// call and kept from then on; nil until then, so a store that never
	// sees a cap does not pay for it.
	tenants map[string]map[id]*entry
	// header is the header of the last answer stored. An answer with the
	// same header shares it (see Complete).
	header map[string][]string
	// tenant is that of the last record created (see put).
	tenant string
}

// New returns an empty store.
func New(cfg Config) *Store {
	c := cfg.Clock
	if c == nil {
		c = time.Now
	}
	return &Store{clock: c, scopes: make(map[string]*records), cold: newCold()}
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
	e, rs, slot := s.lookup(k)
	r, exists := s.read(e, rs, slot)
	act := storekit.ActCreate
	if exists {
		act = storekit.Decide(&r, &p, now)
	}
	if err := storekit.CheckCap(&p, act, s.counter(p.Tenant)); err != nil {
		return store.ReserveResult{}, err
	}
	fresh := func(fence int64) store.ReserveResult {
		t := at(now)
		n := s.put(k, exists, p.Tenant, &entry{
			key: p.Key, fp: p.Fingerprint, state: stInProgress, fence: fence, owner: p.Owner, policy: policyOf(p.LeasePolicy),
			lockedUntil: at(after(now, p.Lease)), attempts: 1, createdAt: t, updatedAt: t, expiresAt: at(after(now, p.TTL)),
		})
		return store.ReserveResult{Outcome: store.Created, Record: n.record()}
	}
	if !exists {
		return fresh(storekit.NextFence(0, now)), nil
	}
	if act == storekit.ActCreate {
		return fresh(storekit.NextFence(r.Fence, now)), nil
	}
	if e == nil && act != storekit.ActExisting {
		e = s.thaw(rs, slot)
	}
	switch act {
	case storekit.ActReclaim:
		e.take(now, p.Lease, p.TTL, p.Owner, true)
		return store.ReserveResult{Outcome: store.Reclaimed, Record: e.record()}, nil
	case storekit.ActTakeOver:
		e.take(now, p.Lease, p.TTL, p.Owner, false)
		return store.ReserveResult{Outcome: store.TakenOver, Record: e.record()}, nil
	case storekit.ActLeaseExpired:
		e.toUnknown(now, "lease_expired")
		r = e.record()
	}
	return store.ReserveResult{Outcome: store.Existing, Record: r}, nil
}

// put stores the new record n under k for tenant, in place of the record
// there was if replace: a new key costs the caller's lookup and one
// insertion, no lookup of its own.
func (s *Store) put(k id, replace bool, tenant string, n *entry) *entry {
	if replace {
		s.forget(k)
	}
	// The records of one scope share its string (see insert), and mostly
	// the tenant of the last one: equal strings share one copy, so that a
	// store of many records holds fewer objects for the garbage collector
	// to trace.
	if s.tenant != tenant {
		s.tenant = tenant
	}
	n.tenant = s.tenant
	s.insert(k, n)
	if s.tenants != nil {
		s.index(id{n.scope, n.key}, n)
	}
	return n
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
			for e := range s.all(false) {
				if !e.frozen { // cold records are never active
					s.index(id{e.scope, e.key}, e)
				}
			}
		}
		n := 0
		for _, e := range s.tenants[tenant] {
			if e.state.Active() {
				n++
			}
		}
		return n, nil
	}
}

// forget removes the record k, if it is there.
func (s *Store) forget(k id) {
	if e := s.hot(k); e != nil {
		s.unindex(k, e.tenant)
	}
	s.remove(k)
}

// unindex removes the record k of tenant from the tenant index.
func (s *Store) unindex(k id, tenant string) {
	if t := s.tenants[tenant]; t != nil {
		delete(t, k)
		if len(t) == 0 {
			delete(s.tenants, tenant)
		}
	}
}

// rekey keys the maps by e's own key, after pack gave it a new string: an
// assignment to an equal key replaces the key the map holds, so that the
// maps keep no other copy of it.
func (s *Store) rekey(e *entry) {
	k := id{e.scope, e.key}
	s.insert(k, e)
	if t := s.tenants[e.tenant]; t != nil {
		t[k] = e
	}
}

func (e *entry) take(now time.Time, lease, ttl time.Duration, owner int64, reclaim bool) {
	if reclaim {
		e.expiresAt = at(after(now, ttl))
	}
	e.state = stInProgress
	e.fence = storekit.NextFence(e.fence, now)
	e.owner = owner
	e.attempts++
	e.lockedUntil = at(after(now, lease))
	e.setError("")
	if e.more != nil {
		e.more.reconciles = 0 // a new execution: its own reconciliation, if any
	}
	e.updatedAt = at(now)
}

func (e *entry) toUnknown(now time.Time, why string) {
	e.state = stUnknown
	e.x().lastError = why
	e.more.reconcileAfter = at(now)
	e.updatedAt = at(now)
}

// leaseExpired is store.Record.LeaseExpired.
func (e *entry) leaseExpired(now micros) bool {
	return e.state == stInProgress && !now.before(e.lockedUntil)
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
	r := s.hot(id{fp.Scope, fp.Key}) // a cold record is never in progress
	if r == nil || r.state != stInProgress || r.fence != fp.Fence {
		return store.ErrLeaseLost
	}
	// Stamped first: Complete may hand the record to the cold records,
	// after which r is no longer the store's.
	r.updatedAt = at(now)
	f(r, now)
	return nil
}

// Complete implements store.Store.
func (s *Store) Complete(ctx context.Context, p store.CompleteParams) error {
	return s.held(ctx, p.Validate(), p.FenceParams, func(r *entry, now time.Time) {
		p.Response.Header = s.share(p.Response.Header)
		s.complete(r, now, p.Response, p.TTL, true)
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

// complete makes e a completed record of resp, made cold if freeze and it
// is of a kind kept cold: then e is no longer the store's, and the caller
// must not change it further.
func (s *Store) complete(e *entry, now time.Time, resp store.Response, ttl time.Duration, freeze bool) {
	e.state = stCompleted
	e.setRequest(nil)
	e.answer(resp)
	e.completedAt = at(now)
	if ttl > 0 {
		e.expiresAt = at(after(now, ttl))
	}
	if freeze && s.freeze(e) {
		return
	}
	if e.pack() {
		s.rekey(e)
	}
}

// Release implements store.Store.
func (s *Store) Release(ctx context.Context, p store.ReleaseParams) error {
	return s.held(ctx, p.Validate(), p.FenceParams, func(r *entry, now time.Time) {
		r.state = stFailedRetryable
		r.setError(p.Error)
		r.setRequest(nil)
	})
}

// MarkUnknown implements store.Store.
func (s *Store) MarkUnknown(ctx context.Context, p store.ReleaseParams) error {
	return s.held(ctx, p.Validate(), p.FenceParams, func(r *entry, now time.Time) {
		r.toUnknown(now, p.Error)
		if p.Request != nil {
			req := *p.Request
			r.x().request = &req
		}
	})
}

// Checkpoint implements store.Store.
func (s *Store) Checkpoint(ctx context.Context, p store.CheckpointParams) error {
	return s.held(ctx, p.Validate(), p.FenceParams, func(r *entry, now time.Time) {
		if p.RecoveryPoint != "" || r.more != nil {
			r.x().recoveryPoint = p.RecoveryPoint
		}
	})
}

// Extend implements store.Store.
func (s *Store) Extend(ctx context.Context, p store.ExtendParams) error {
	return s.held(ctx, p.Validate(), p.FenceParams, func(r *entry, now time.Time) {
		r.lockedUntil = at(after(now, p.Lease))
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
	r, ok := s.read(s.lookup(id{scope, key}))
	if !ok {
		return store.Record{}, store.ErrNotFound
	}
	return r, nil
}

// Delete implements store.Store.
func (s *Store) Delete(ctx context.Context, p store.DeleteParams) error {
	if err := p.Validate(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	k := id{p.Scope, p.Key}
	e, _, slot := s.lookup(k)
	var fence int64
	switch {
	case e != nil:
		fence = e.fence
	case slot >= 0:
		fence = s.cold.at(slot).fence
	default:
		return store.ErrNotFound
	}
	switch {
	case p.Fence > 0 && fence != p.Fence:
		return store.ErrLeaseLost
	case e != nil && e.state == stInProgress:
		return store.ErrStateConflict
	}
	s.forget(k)
	return nil
}

// scan visits, under the lock and oldest first by the time by returns, at
// most limit records for which keep holds. The memory store is for tests
// and small services, so a full scan is fine.
func (s *Store) scan(ctx context.Context, valid error, limit int, keep func(e *entry, now micros) bool,
	by func(*entry) micros, visit func(e *entry, now time.Time)) error {
	if valid != nil {
		return valid
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	now := s.now()
	t := at(now)
	s.mu.Lock()
	defer s.mu.Unlock()
	var rs []*entry
	for e := range s.all(false) {
		if keep(e, t) {
			if e.frozen {
				c := *e
				e = &c
			}
			rs = append(rs, e)
		}
	}
	sort.Slice(rs, func(i, j int) bool {
		ti, tj := by(rs[i]), by(rs[j])
		if ti != tj {
			return ti < tj
		}
		if rs[i].scope != rs[j].scope {
			return rs[i].scope < rs[j].scope
		}
		return rs[i].key < rs[j].key
	})
	for _, e := range rs[:min(limit, len(rs))] {
		if e.frozen {
			e = s.find(id{e.scope, e.key})
		}
		visit(e, now)
	}
	return nil
}

// SweepExpiredLeases implements store.Store.
func (s *Store) SweepExpiredLeases(ctx context.Context, p store.SweepParams) ([]store.Record, error) {
	var out []store.Record
	grace := micros(storekit.Micros(p.Grace))
	err := s.scan(ctx, p.Validate(), p.Limit, func(e *entry, now micros) bool {
		return e.leaseExpired(now-grace) && e.policy == leaseUnknown
	}, func(e *entry) micros { return e.lockedUntil }, func(e *entry, now time.Time) {
		e.toUnknown(now, "lease_expired")
		out = append(out, e.record())
	})
	return out, err
}

// Reap implements store.Store.
func (s *Store) Reap(ctx context.Context, p store.ReapParams) (store.ReapResult, error) {
	var res store.ReapResult
	grace := micros(storekit.Micros(p.Grace))
	err := s.scan(ctx, p.Validate(), p.Limit, func(e *entry, now micros) bool {
		// Pending records are ended by ExpirePending at their deadline,
		// as in every other store, never abandoned here.
		return e.state != stExpired && e.state != stPending && !now.before(e.expiresAt) &&
			(e.state != stInProgress || e.leaseExpired(now-grace))
	}, func(e *entry) micros { return e.expiresAt }, func(e *entry, now time.Time) {
		switch {
		case e.state.Terminal() && p.Soft:
			e.state = stExpired
			e.updatedAt = at(now)
			res.Deleted++
		case e.state.Terminal():
			s.forget(id{e.scope, e.key})
			res.Deleted++
		default: // in_progress whose holder died, or unknown: abandoned
			s.complete(e, now, p.Abandoned, p.AbandonedTTL, false)
			e.expiresAt = at(after(now, p.AbandonedTTL)) // even for a zero ttl
			e.settle()
			e.setError("abandoned")
			e.updatedAt = at(now)
			res.Abandoned++
		}
	})
	return res, err
}

// ListUnknown implements store.Store.
func (s *Store) ListUnknown(ctx context.Context, p store.ListUnknownParams) ([]store.Record, error) {
	var out []store.Record
	err := s.scan(ctx, p.Validate(), p.Limit, func(e *entry, now micros) bool {
		return e.state == stUnknown &&
			(!p.DueOnly || (!now.before(e.rare().reconcileAfter) && e.rare().deadLetteredAt == 0))
	}, func(e *entry) micros { return e.rare().reconcileAfter }, func(e *entry, now time.Time) {
		out = append(out, e.record())
	})
	return out, err
}

// anyAttempts is what Resolve passes to unknown for the attempts: a
// settlement holds whatever the reconcilers counted.
const anyAttempts = -1

// unknown runs f on the unknown record p names, whose fence must be
// p.Fence and, unless attempts is anyAttempts, whose ReconcileAttempts
// must be attempts (Defer).
func (s *Store) unknown(ctx context.Context, p store.FenceParams, attempts int, f func(e *entry, now time.Time)) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	e, _, slot := s.lookup(id{p.Scope, p.Key})
	if e == nil && slot >= 0 {
		// Completed, so refused below: judged without making it an entry.
		if s.cold.at(slot).fence != p.Fence {
			return store.ErrLeaseLost
		}
		return store.ErrStateConflict
	}
	switch {
	case e == nil:
		return store.ErrNotFound
	case e.fence != p.Fence:
		return store.ErrLeaseLost
	case e.state != stUnknown:
		return store.ErrStateConflict
	case attempts != anyAttempts && e.rare().reconciles != attempts:
		return store.ErrStateConflict
	}
	f(e, now)
	e.updatedAt = at(now)
	return nil
}

// Resolve implements store.Store.
func (s *Store) Resolve(ctx context.Context, p store.ResolveParams) error {
	if err := p.Validate(); err != nil {
		return err
	}
	return s.unknown(ctx, p.FenceParams, anyAttempts, func(e *entry, now time.Time) {
		e.settle()
		if p.To == store.StateCompleted {
			s.complete(e, now, *p.Response, p.TTL, false)
			e.setError("")
			return
		}
		e.state = stFailedRetryable
		e.setRequest(nil)
		if p.TTL > 0 {
			e.expiresAt = at(after(now, p.TTL))
		}
	})
}

// Defer implements store.Store.
func (s *Store) Defer(ctx context.Context, p store.DeferParams) error {
	if err := p.Validate(); err != nil {
		return err
	}
	return s.unknown(ctx, p.FenceParams, p.Attempts, func(e *entry, now time.Time) {
		m := e.x()
		m.reconciles++
		m.lastError = p.Error
		if p.DeadLetter {
			m.deadLetteredAt = at(now)
			return
		}
		m.reconcileAfter = at(after(now, p.Delay))
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
	for e := range s.all(false) {
		if n == limit {
			break
		}
		if e.state.Active() {
			n++
		}
	}
	return n, nil
}
