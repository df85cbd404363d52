package store

import "time"

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

// Decide applies the rules of [Store.Reserve] to an existing record at now,
// in the order of its doc comment. Stores that decide in Go use it; the SQL
// and Lua stores that decide inside one statement or script spell the same
// rules in their own language, and the conformance suite holds all of them
// to one behaviour.
func Decide(r *Record, p *ReserveParams, now time.Time) Action {
	switch {
	case r.State == StateExpired || (r.State.Terminal() && !now.Before(r.ExpiresAt)):
		return ActCreate
	case r.Fingerprint != p.Fingerprint:
		return ActExisting
	case r.State == StateFailedRetryable:
		return ActReclaim
	case r.LeaseExpired(now):
		if r.LeasePolicy == LeaseUnknown {
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
