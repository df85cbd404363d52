package storekit

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/idem-go/idem/store"
)

// pendingJSON is the stored form of a PendingRequest (the queue is kept
// in a column or field of its own, to claim by it).
type pendingJSON struct {
	Method    string      `json:"method"`
	Target    string      `json:"target"`
	Header    http.Header `json:"header,omitempty"`
	Body      []byte      `json:"body,omitempty"`
	BodyBytes int         `json:"body_bytes,omitempty"`
	Fence     int64       `json:"fence,omitempty"`
}

// EncodeRequest is the stored form of r without its queue, the same bytes
// in every store. A nil r is none: nil, stored as NULL (the summary that
// ReleaseParams.Request may leave out).
func EncodeRequest(r *store.PendingRequest) ([]byte, error) {
	if r == nil {
		return nil, nil
	}
	return json.Marshal(pendingJSON{Method: r.Method, Target: r.Target, Header: r.Header, Body: r.Body,
		BodyBytes: r.BodyBytes, Fence: r.Fence})
}

// DecodeRequest reads what EncodeRequest wrote, with the queue kept
// beside it.
func DecodeRequest(queue string, b []byte) (*store.PendingRequest, error) {
	var j pendingJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return nil, fmt.Errorf("idem/store: stored request: %w", err)
	}
	return &store.PendingRequest{Queue: queue, Method: j.Method, Target: j.Target, Header: j.Header, Body: j.Body,
		BodyBytes: j.BodyBytes, Fence: j.Fence}, nil
}

// SortRecords orders a batch by the time by returns, then by scope and
// key: stores whose UPDATE ... RETURNING promises no order sort what
// Claim (by CreatedAt) and ExpirePending (by LockedUntil) return.
func SortRecords(rs []store.Record, by func(*store.Record) time.Time) {
	slices.SortFunc(rs, func(a, b store.Record) int {
		if c := by(&a).Compare(by(&b)); c != 0 {
			return c
		}
		if c := strings.Compare(a.Scope, b.Scope); c != 0 {
			return c
		}
		return strings.Compare(a.Key, b.Key)
	})
}

// ByCreated orders claimed records by their acceptance.
func ByCreated(r *store.Record) time.Time { return r.CreatedAt }

// ByDeadline orders pending records by their claim deadline.
func ByDeadline(r *store.Record) time.Time { return r.LockedUntil }

// ApplyPending is ReservePending's transition computed in Go, for stores
// that read the record, decide and write it back under a lock (the memory
// and MySQL stores): given the existing record (nil when there is none)
// and the instant now, it returns the outcome, the record as it must be
// stored, and whether it must be written at all. It applies the tenant
// cap as Reserve does (CheckCap, counting with active, which
// must see the tenant's records as of the write): store.ErrOverCap means nothing
// may be written. Outcome Created is a new record, which belongs to
// p.Tenant; any other write keeps the tenant of the record.
func ApplyPending(prev *store.Record, p *store.PendingParams, now time.Time, active func() (int, error)) (out store.ReserveOutcome, r store.Record, write bool, err error) {
	act := ActCreate
	if prev != nil {
		act = Decide(prev, &p.ReserveParams, now)
		r = *prev
	}
	if err := CheckCap(&p.ReserveParams, act, active); err != nil {
		return store.Existing, store.Record{}, false, err
	}
	req := p.Request
	after := func(d time.Duration) time.Time { return now.Add(RoundUp(d)) }
	switch act {
	case ActExisting:
		return store.Existing, r, false, nil
	case ActLeaseExpired:
		r.State, r.LastError, r.ReconcileAfter, r.UpdatedAt = store.StateUnknown, "lease_expired", now, now
		return store.Existing, r, true, nil
	case ActCreate:
		var fence int64
		if prev != nil {
			fence = prev.Fence
		}
		return store.Created, store.Record{
			Scope: p.Scope, Key: p.Key, Fingerprint: p.Fingerprint, State: store.StatePending,
			Fence: NextFence(fence, now), LeasePolicy: p.LeasePolicy, LockedUntil: after(p.Lease),
			CreatedAt: now, UpdatedAt: now, ExpiresAt: after(p.TTL), Request: &req,
		}, true, nil
	case ActReclaim:
		out = store.Reclaimed
		r.ExpiresAt = after(p.TTL)
	default: // ActTakeOver
		out = store.TakenOver
	}
	r.State = store.StatePending
	r.Fence = NextFence(r.Fence, now)
	r.LockedUntil = after(p.Lease)
	r.LastError = ""
	r.ReconcileAttempts = 0 // a new execution: its own reconciliation, if any
	r.Owner = 0             // and no Reserve started it
	r.UpdatedAt = now
	r.Response, r.CompletedAt = nil, time.Time{}
	r.Request = &req
	return out, r, true, nil
}
