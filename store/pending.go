package store

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"
	"unicode/utf8"

	"github.com/idem-go/idem/internal/httpfield"
)

// Asynchronous acceptance. A request on an asynchronous route is not run
// while its client waits: ReservePending records it as pending (accepted,
// not yet claimed) together with what is needed to run it later, and a
// worker claims it (pending -> in_progress, with a lease and a new fence)
// and settles it through the ordinary lease-holder transitions (Complete,
// Release, MarkUnknown, Extend):
//
//	absent ──ReservePending──▶ pending ──Claim──▶ in_progress ──Complete──▶ completed
//	                              └──ExpirePending (never claimed in time)──▶ completed (timeout answer)
//
// The pending record is itself the queue: one write accepts the request,
// there is no second table or list to keep consistent with the record,
// and a claim is one guarded transition like every other, so every store
// keeps the same semantics (SKIP LOCKED in PostgreSQL and MySQL, the
// single writer of SQLite, a Lua script in Redis).

// StatePending: the request is accepted and kept with the record
// (Record.Request); no worker has claimed it yet. LockedUntil is the
// claim deadline: past it, ExpirePending ends the record with a timeout
// answer. Reserve treats a pending record like a live in_progress one
// (Existing).
const StatePending State = "pending"

// Limits of a pending request, whatever the store.
const (
	// MaxQueueBytes bounds a queue's name.
	MaxQueueBytes = 200
	// MaxPendingRequestBytes bounds the encoded request kept with a
	// pending record (method, target, headers and body). The engine bounds
	// the body further by its MaxBodyBytes.
	MaxPendingRequestBytes = 32 << 20
	// MaxRequestSummaryBytes bounds a request summary given to
	// MarkUnknown (ReleaseParams.Request), counted as for a pending
	// request.
	MaxRequestSummaryBytes = 16 << 10
)

// PendingRequest is a request kept with a pending record, to be run by the
// worker that claims it.
type PendingRequest struct {
	// Queue names the workers that may claim it (one per kind of work:
	// a proxy's upstream, a set of handlers).
	Queue string
	// Method, Target (path and query), Header and Body are the request as
	// the worker must replay it. Header holds only what the engine chose
	// to keep (no credentials unless configured).
	Method string
	Target string
	Header http.Header
	Body   []byte
	// BodyBytes and Fence are set on a request summary only (see
	// ReleaseParams.Request), never on a request a worker runs. BodyBytes
	// is the size of the whole body when Body holds only its beginning
	// (zero when Body is whole). Fence is the execution the summary
	// describes: a record that ran again since keeps the summary of an
	// older execution until it is marked unknown with a new one.
	BodyBytes int
	Fence     int64
}

// PendingParams records a request as pending.
type PendingParams struct {
	// ReserveParams identify the record as for Reserve. Lease is how long
	// the request may wait for a worker (LockedUntil = now + Lease while
	// pending); TTL and LeasePolicy are as for Reserve (the policy applies
	// to the worker's lease once claimed).
	ReserveParams
	Request PendingRequest
}

// ClaimParams selects the pending requests a worker takes.
type ClaimParams struct {
	// Queue is the queue to claim from. Required.
	Queue string
	// Limit bounds the batch. Must be positive.
	Limit int
	// Lease is the worker's lease on each claimed record (LockedUntil =
	// now + Lease). Must be positive.
	Lease time.Duration
}

// ExpirePendingParams ends pending records whose claim deadline passed.
type ExpirePendingParams struct {
	// Limit bounds the batch. Must be positive.
	Limit int
	// Response is the answer stored on each expired record (a timeout,
	// 408). Required.
	Response Response
	// TTL, when positive, resets ExpiresAt = now + TTL; zero keeps the
	// ExpiresAt set when the request was accepted.
	TTL time.Duration
}

// Queue is implemented by stores that keep asynchronous requests. Every
// store of this module implements it; the cache wrapper forwards it, and
// keeps them only when its backing store does (QueueRefuser). Whether a
// store keeps them is decided by AsQueue, not by a type assertion.
type Queue interface {
	// ReservePending is Reserve for an asynchronous request, applying the
	// rules of [Store.Reserve] in one atomic step, except that the
	// caller never holds a lease: where Reserve would create, reclaim or
	// take over an in_progress record, ReservePending makes the record
	// pending with p.Request (a new fence; outcome Created, Reclaimed or
	// TakenOver), so that a worker runs it; an expired lease under policy
	// unknown goes to unknown as with Reserve; every other record is
	// returned untouched (Existing), a pending one included. The
	// returned record carries Request when the outcome is not Existing.
	// The tenant cap (ReserveParams.MaxActive) applies as for Reserve, in
	// the same atomic step and to the same moves (a creation, a reclaim):
	// a pending record is active, so pending and in_progress records of a
	// tenant share one count; a store that refuses the cap on Reserve
	// refuses it here too (ErrCapUnsupported).
	ReservePending(ctx context.Context, p PendingParams) (ReserveResult, error)

	// Claim moves up to p.Limit pending records of p.Queue whose claim
	// deadline has not passed, oldest first, to in_progress: a new fence,
	// LockedUntil = now + p.Lease, Attempts+1. It returns them with their
	// Request. Each pending record is claimed by exactly one caller, however
	// many claim at once on however many handles. A store that claims in
	// several steps (a cluster's masters) may return, with the failure of
	// a step, the records the others claimed: they are the caller's to
	// run.
	Claim(ctx context.Context, p ClaimParams) ([]Record, error)

	// ExpirePending ends up to p.Limit pending records whose claim
	// deadline (LockedUntil) passed: they become completed with
	// p.Response and LastError "pending_expired", and are returned (with
	// a failure, those ended before it, as for Claim). Safe to run from
	// several instances at once: each record is ended once.
	ExpirePending(ctx context.Context, p ExpirePendingParams) ([]Record, error)
}

// QueueRefuser is implemented by a store that implements Queue whatever it
// wraps, but keeps pending requests only when what it wraps does (the
// cache wrapper over its backing store): QueueUnsupported says why it
// keeps none, or returns "" when it does, so that a configuration that
// needs a queue fails at start instead of at every asynchronous request.
// Such a store's Queue methods fail when it keeps none.
type QueueRefuser interface {
	QueueUnsupported() string
}

// AsQueue returns s's queue and "" when s keeps pending requests: it
// implements Queue and, if it implements QueueRefuser, QueueUnsupported
// returns "". Otherwise it returns nil and why s keeps none.
func AsQueue(s Store) (Queue, string) {
	q, ok := s.(Queue)
	if !ok {
		return nil, fmt.Sprintf("the %T store keeps no pending requests (store.Queue)", s)
	}
	if r, ok := s.(QueueRefuser); ok {
		if why := r.QueueUnsupported(); why != "" {
			return nil, why
		}
	}
	return q, ""
}

// Validate checks a pending reservation: the reservation's own rules and a
// request a worker can run.
func (p *PendingParams) Validate() error {
	if err := p.ReserveParams.Validate(); err != nil {
		return err
	}
	if err := checkQueue(p.Request.Queue); err != nil {
		return err
	}
	return p.Request.check(MaxPendingRequestBytes)
}

// check checks a request's method, target and headers, and its size
// against limit.
func (r *PendingRequest) check(limit int) error {
	if r.Method == "" || !httpfield.Valid(r.Method, nil) {
		return invalid(fmt.Sprintf("request method %q is not an HTTP token", r.Method))
	}
	if r.Target == "" || !utf8.ValidString(r.Target) || !httpfield.Valid("x", []string{r.Target}) {
		return invalid("request target must be non-empty UTF-8 without control characters")
	}
	for k, v := range r.Header {
		if !httpfield.Valid(k, v) {
			return invalid(fmt.Sprintf("request header %q is not valid", k))
		}
	}
	if r.BodyBytes < 0 || r.Fence < 0 {
		return invalid("body size and fence must not be negative")
	}
	if n := r.size(); n > limit {
		return errors.Join(ErrTooLong, fmt.Errorf("request of %d bytes, the limit is %d", n, limit))
	}
	return nil
}

func (r *PendingRequest) size() int {
	n := len(r.Method) + len(r.Target) + len(r.Body)
	for k, v := range r.Header {
		n += len(k)
		for _, s := range v {
			n += len(s)
		}
	}
	return n
}

func checkQueue(q string) error {
	switch {
	case q == "":
		return invalid("queue is required")
	case len(q) > MaxQueueBytes:
		return errors.Join(ErrTooLong, fmt.Errorf("queue of %d bytes, the limit is %d", len(q), MaxQueueBytes))
	case !httpfield.Valid("x", []string{q}) || !utf8.ValidString(q):
		return invalid("queue must be UTF-8 without control characters")
	}
	return nil
}

// Validate checks a claim.
func (p *ClaimParams) Validate() error {
	if err := checkQueue(p.Queue); err != nil {
		return err
	}
	if err := checkLimit(p.Limit); err != nil {
		return err
	}
	if p.Lease <= 0 {
		return invalid("lease must be positive")
	}
	return nil
}

// Validate checks an expiry pass.
func (p *ExpirePendingParams) Validate() error {
	if err := checkLimit(p.Limit); err != nil {
		return err
	}
	if p.TTL < 0 {
		return invalid("ttl must not be negative")
	}
	return p.Response.Validate()
}

// ExpiredPendingError is the LastError of a pending record that no worker
// claimed before its deadline.
const ExpiredPendingError = "pending_expired"
