// Package storekit is what a store author uses to implement the contract of
// package store: the rules of Reserve as a function (Decide, CheckCap,
// ApplyPending), the fence (NextFence), the conversion of durations to the
// stores' resolution (Micros, RoundUp), the stored form of a pending request
// (EncodeRequest, DecodeRequest) and the pieces of List for stores that
// filter or page in Go (Match, Takes, Select, Page, CompareList).
//
// The engine never imports it: the contract says what a store does, this
// package helps a store do it. A store written outside this repository needs
// these two packages and the conformance suite (storetest), nothing else.
package storekit

import (
	"time"

	"github.com/idem-go/idem/store"
)

// Action is what Reserve does to an existing record.
type Action int

const (
	// ActExisting returns the record untouched (Existing).
	ActExisting Action = iota
	// ActCreate replaces the record with a new one (Created): it is
	// soft-expired, or terminal past ExpiresAt.
	ActCreate
	// ActReclaim takes a failed_retryable record with the same
	// fingerprint back to in_progress (Reclaimed).
	ActReclaim
	// ActTakeOver hands an expired lease under policy retry or resume to
	// the caller (TakenOver).
	ActTakeOver
	// ActLeaseExpired moves an expired lease under policy unknown to
	// unknown and returns it (Existing).
	ActLeaseExpired
)

// Decide applies the rules of [store.Store.Reserve] to an existing record
// at now, in the order of its doc comment. Stores that decide in Go use it; the SQL
// and Lua stores that decide inside one statement or script spell the same
// rules in their own language, and the conformance suite holds all of them
// to one behaviour.
func Decide(r *store.Record, p *store.ReserveParams, now time.Time) Action {
	switch {
	case r.State == store.StateExpired || (r.State.Terminal() && !now.Before(r.ExpiresAt)):
		return ActCreate
	case r.Fingerprint != p.Fingerprint:
		return ActExisting
	case r.State == store.StateFailedRetryable:
		return ActReclaim
	case r.LeaseExpired(now):
		if r.LeasePolicy == store.LeaseUnknown {
			return ActLeaseExpired
		}
		return ActTakeOver
	}
	return ActExisting
}

// Activates reports whether Reserve taking action a (on an existing
// record; an absent one is always created) makes a record active that was
// not: the moves the tenant cap (ReserveParams.MaxActive) refuses.
func (a Action) Activates() bool { return a == ActCreate || a == ActReclaim }

// CheckCap applies p's tenant cap (MaxActive) to action a, what Reserve or
// ReservePending would do to the record (ActCreate for an absent one):
// when the cap is set and a makes a record active, it counts the tenant's
// active records with active and fails with store.ErrOverCap at the cap.
// Stores that decide in Go call it in the same atomic step as the write;
// active is not called when the cap cannot refuse.
func CheckCap(p *store.ReserveParams, a Action, active func() (int, error)) error {
	if p.MaxActive <= 0 || !a.Activates() {
		return nil
	}
	n, err := active()
	switch {
	case err != nil:
		return err
	case n >= p.MaxActive:
		return store.ErrOverCap
	}
	return nil
}

// NextFence returns the fence a record gets when it is created, taken over,
// reclaimed or recreated at now, given the fence of its existing row (0
// when there is none): the store clock in microseconds since the Unix
// epoch, and at least prev+1, by the rule of Fences in package store.
// Stores issue the fence in the same statement as the transition, from the
// clock the transition uses (the database's or the injected store.Clock);
// SQL and Lua stores spell this rule in their own language.
func NextFence(prev int64, now time.Time) int64 {
	f := max(now.UnixMicro(), 1)
	if f <= prev {
		f = prev + 1
	}
	return f
}
