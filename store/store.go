package store

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"
)

// State is the lifecycle state of a record.
type State string

const (
	// StateInProgress: a worker holds the lease until LockedUntil.
	StateInProgress State = "in_progress"
	// StateCompleted: the response is stored and replayed to every retry.
	StateCompleted State = "completed"
	// StateFailedRetryable: the request is proven not to have executed; a
	// retry with the same fingerprint takes execution rights again.
	StateFailedRetryable State = "failed_retryable"
	// StateUnknown: the request may or may not have executed. Only the
	// reconciliation pipeline or an operator moves it on.
	StateUnknown State = "unknown"
	// StateExpired: soft-expired past ExpiresAt (kept for audit). Reserve
	// treats it as absent.
	StateExpired State = "expired"
)

// Valid reports whether s is one of the states (pending included).
func (s State) Valid() bool {
	switch s {
	case StateInProgress, StateCompleted, StateFailedRetryable, StateUnknown, StateExpired, StatePending:
		return true
	}
	return false
}

// Active reports whether a record in state s counts against its tenant's
// cap of active records (ReserveParams.MaxActive): every state but the
// terminal ones and expired, so a request that may still run or whose
// outcome is still open counts, whatever its state is named.
func (s State) Active() bool {
	return s != StateCompleted && s != StateFailedRetryable && s != StateExpired
}

// Terminal reports whether s is completed or failed_retryable: the states the
// reaper may delete once they pass ExpiresAt.
func (s State) Terminal() bool {
	return s == StateCompleted || s == StateFailedRetryable
}

// LeasePolicy decides what happens to an in_progress record whose lease
// expired (its holder died or was cut off).
type LeasePolicy string

const (
	// LeaseUnknown (the default) moves the record to unknown: the request may
	// have had effects, so nobody re-executes it until it is reconciled.
	LeaseUnknown LeasePolicy = "unknown"
	// LeaseRetry lets the next retry take the record over with a new fence
	// and execute the request again from the start.
	LeaseRetry LeasePolicy = "retry"
	// LeaseResume lets the next retry take the record over with a new fence
	// and continue from the last committed RecoveryPoint.
	LeaseResume LeasePolicy = "resume"
)

// Valid reports whether p is a known policy.
func (p LeasePolicy) Valid() bool {
	return p == LeaseUnknown || p == LeaseRetry || p == LeaseResume
}

// Response is a stored HTTP response.
type Response struct {
	Status int
	// Header holds only the headers that may be replayed (no Set-Cookie, no
	// hop-by-hop headers); the engine filters them before storing.
	Header http.Header
	// Body is the exact bytes written by the handler. Nil when BodyOmitted.
	Body []byte
	// BodyOmitted is true when the body was larger than the stored-size
	// limit: the record keeps status and headers and the replay says that the
	// body was not kept.
	BodyOmitted bool
}

// Record is one idempotency record, identified by (Scope, Key).
type Record struct {
	Scope string
	Key   string
	// Fingerprint identifies the request's content (method, route, body).
	Fingerprint string
	State       State
	// Fence is the lease token (see Fences in the package documentation):
	// the store clock in microseconds since the Unix epoch when the record
	// is created, and strictly greater than the previous fence at every
	// takeover, reclaim or recreation over an expired row. Complete, Release, MarkUnknown,
	// Checkpoint and Extend must present the current fence.
	Fence int64
	// LeasePolicy is fixed at reservation; the sweeper and takeovers use it.
	LeasePolicy LeasePolicy
	// LockedUntil is the end of the current lease (meaningful in_progress).
	LockedUntil time.Time
	// RecoveryPoint is the last committed phase ("" before the first).
	RecoveryPoint string
	// Response is set for completed records, nil otherwise.
	Response *Response
	// LastError says why the record left in_progress for failed_retryable
	// or unknown; "abandoned" on a record the reaper closed; "" otherwise
	// (a reclaim, takeover or resolution to completed clears it).
	LastError string
	// Attempts counts executions started (1 after the first reserve).
	Attempts    int
	CreatedAt   time.Time
	UpdatedAt   time.Time
	CompletedAt time.Time // zero unless completed
	// ExpiresAt is when a terminal record stops being replayed.
	ExpiresAt time.Time
	// ReconcileAfter is when an unknown record is next due for
	// reconciliation; zero for other states.
	ReconcileAfter time.Time
	// ReconcileAttempts counts the reconciler's attempts (Defer) on the
	// current execution's unknown outcome: a new execution of the key (a
	// creation, a reclaim, a takeover) starts from 0. A Defer names the
	// count it was shown (DeferParams.Attempts), so that an attempt is
	// counted once however many reconcilers made it.
	ReconcileAttempts int
	// DeadLetteredAt is when the reconciler gave up on an unknown record
	// (Defer with DeadLetter); zero otherwise. A dead-lettered record stays
	// unknown: ListUnknown with DueOnly never returns it again, an operator
	// still sees it (ListUnknown without DueOnly) and Resolve settles it
	// (which clears DeadLetteredAt).
	DeadLetteredAt time.Time
	// Owner is the ReserveParams.Owner of the Reserve that started the
	// record's current execution (a creation, a reclaim, a takeover or a
	// replacement of an expired record). It is kept while the record is
	// in_progress or unknown; a store may drop it once the record is
	// terminal, and it is 0 on a record no such Reserve started (a pending
	// record, one a worker claimed). The engine tells by it whether a
	// reservation whose answer it never got is its own (see
	// ReserveParams.Owner).
	Owner int64
	// Request is the request kept with an asynchronous record (see
	// [Queue]), or the summary of its request a record was marked unknown
	// with (see ReleaseParams.Request). Claim and ReservePending return
	// it; Get returns it for every record that is neither pending nor in
	// progress (a worker's request can be large, and is the worker's). It
	// is kept while a worker may run it and while an unknown outcome waits
	// to be settled; every transition to a terminal state (Complete,
	// Release, Resolve, ExpirePending, the reaper's abandon) clears it, as
	// its headers may name the caller, so Get of a terminal record returns
	// none.
	Request *PendingRequest
}

// DeadLettered reports whether the reconciler gave up on the record.
func (r *Record) DeadLettered() bool { return !r.DeadLetteredAt.IsZero() }

// LeaseExpired reports whether an in_progress record's lease ended by now.
func (r *Record) LeaseExpired(now time.Time) bool {
	return r.State == StateInProgress && !now.Before(r.LockedUntil)
}

// ReserveParams asks for execution rights on (Scope, Key).
type ReserveParams struct {
	Scope       string
	Key         string
	Fingerprint string
	// Lease is how long the winner holds the record before it must Extend.
	Lease time.Duration
	// TTL sets ExpiresAt = now + TTL on a new or reclaimed record (a
	// takeover keeps the record's ExpiresAt).
	TTL time.Duration
	// LeasePolicy is stored on a new record. An existing record keeps the
	// policy it was created with: that stored policy decides what happens
	// when its lease expires, whatever a later request asks.
	LeasePolicy LeasePolicy
	// Tenant is the caller the record is counted against; stored on a new
	// record (a record keeps the tenant it was created with). "" is a
	// tenant like any other.
	Tenant string
	// Owner identifies this call among the Reserves of the key: any
	// number the caller chooses, unlikely to repeat (the engine draws a
	// random one per request, never 0, the Owner of the records no Reserve
	// started). It is stored on the record when this Reserve gives the
	// caller the lease (Record.Owner), and changes nothing else: a Reserve
	// that finds the record in progress under its own Owner answers
	// Existing like any other. A caller whose Reserve failed without an
	// answer (a connection lost during the commit, a timeout) reads the
	// record back, and by its Owner knows whether the reservation was made
	// for it, and so that no handler ran under it. ReservePending ignores
	// it.
	Owner int64
	// MaxActive, when positive, caps the tenant's active records (see
	// State.Active): a Reserve (or ReservePending) that would create a
	// record or reclaim a failed_retryable one while the tenant already
	// holds MaxActive active records fails with ErrOverCap and changes
	// nothing. The count and the write are one atomic step across every
	// process sharing the store. Zero means no cap; replays, in-flight duplicates and takeovers are
	// never refused by it.
	MaxActive int
}

// ReserveOutcome says what a Reserve did.
type ReserveOutcome int

const (
	// Existing: the caller did not get execution rights. Record is the
	// record as it is now (completed, in_progress with a live lease,
	// unknown, or any state with a different fingerprint). The engine
	// decides 422 / 409 / replay from it.
	Existing ReserveOutcome = iota
	// Created: a new record (a fence from the store clock, greater than the
	// expired record's when it replaces one); the caller holds the lease.
	Created
	// Reclaimed: a failed_retryable record with the same fingerprint was
	// taken back to in_progress with a new fence. It keeps its
	// RecoveryPoint and LeasePolicy, so a request of atomic phases that
	// failed part way resumes after its last committed phase.
	Reclaimed
	// TakenOver: an in_progress record whose lease expired, under policy
	// retry or resume, was taken over with a new fence. RecoveryPoint is
	// kept so a resume continues where the dead holder stopped.
	TakenOver
)

func (o ReserveOutcome) String() string {
	switch o {
	case Existing:
		return "existing"
	case Created:
		return "created"
	case Reclaimed:
		return "reclaimed"
	case TakenOver:
		return "taken_over"
	}
	return "invalid"
}

// Acquired reports whether the caller now holds the lease.
func (o ReserveOutcome) Acquired() bool { return o != Existing }

// ReserveResult is the answer of Reserve.
type ReserveResult struct {
	Outcome ReserveOutcome
	Record  Record
}

// FenceParams names a record and the fence its caller holds.
type FenceParams struct {
	Scope string
	Key   string
	Fence int64
}

// CompleteParams stores the response of the lease holder.
type CompleteParams struct {
	FenceParams
	Response Response
	// TTL, when positive, resets ExpiresAt = now + TTL (the retention window
	// starts at completion). Zero keeps the ExpiresAt set at reserve.
	TTL time.Duration
}

// ReleaseParams moves a record to failed_retryable (or unknown).
type ReleaseParams struct {
	FenceParams
	// Error is stored in LastError.
	Error string
	// Request, for MarkUnknown only (Release ignores it), is a summary of
	// the request whose outcome is unknown, kept with the record for the
	// operator who settles it: no credentials, a body excerpt, its Queue
	// empty and its Fence that of the execution (see PendingRequest). Nil
	// keeps the request the record holds, as an asynchronous record's.
	// The common path never pays for it: only a record going unknown
	// carries one.
	Request *PendingRequest
}

// CheckpointParams advances the recovery point.
type CheckpointParams struct {
	FenceParams
	RecoveryPoint string
}

// ExtendParams renews a lease: LockedUntil = now + Lease.
type ExtendParams struct {
	FenceParams
	Lease time.Duration
}

// SweepParams selects in_progress records whose lease expired.
type SweepParams struct {
	// Limit bounds the batch. Must be positive.
	Limit int
	// Grace spares leases that ended less than Grace ago: only records with
	// LockedUntil + Grace <= now are swept. A live holder whose renewal
	// failed during a store outage gets Grace to renew once the store is
	// back before the sweeper declares it dead. Zero sweeps every expired
	// lease; negative is invalid. It only delays the sweeper: a retry's
	// Reserve still acts on the expired lease at once.
	Grace time.Duration
}

// ReapParams selects records past ExpiresAt.
type ReapParams struct {
	// Limit bounds the number of records changed in one call. Must be
	// positive.
	Limit int
	// Soft keeps terminal records as StateExpired instead of deleting them.
	Soft bool
	// Abandoned is the response stored on in_progress and unknown records
	// that pass ExpiresAt: they become completed with this response
	// (LastError "abandoned") instead of disappearing, so a client still
	// retrying gets a definite answer. Required.
	Abandoned Response
	// AbandonedTTL is how long an abandoned record stays (ExpiresAt =
	// now + AbandonedTTL).
	AbandonedTTL time.Duration
	// Grace spares in_progress records whose lease ended less than Grace
	// ago, as SweepParams.Grace does: only those with LockedUntil + Grace
	// <= now are abandoned. A live holder whose renewal failed during a
	// store outage renews once the store is back, and a request that ran
	// past ExpiresAt must not have its record closed under it. Unknown and
	// terminal records are not concerned. Zero spares none; negative is
	// invalid.
	Grace time.Duration
}

// ReapResult counts what Reap did.
type ReapResult struct {
	Deleted   int // terminal records deleted (or expired in soft mode)
	Abandoned int // in_progress/unknown records turned into completed
}

// ListUnknownParams selects unknown records due for reconciliation.
type ListUnknownParams struct {
	// DueOnly restricts to ReconcileAfter <= now; false lists every unknown
	// record (for operators).
	DueOnly bool
	// Limit bounds the list. Must be positive.
	Limit int
}

// ResolveParams settles an unknown record about one execution: Fence is
// the record's fence when the settlement was decided (what ListUnknown, Get
// or the resolver was shown). A record whose fence has moved on since ran
// again, and a settlement about the older execution must not touch it.
type ResolveParams struct {
	FenceParams
	// To is StateCompleted (Response required) or StateFailedRetryable.
	To       State
	Response *Response
	// TTL, when positive, resets ExpiresAt = now + TTL.
	TTL time.Duration
}

// DeferParams reschedules an unknown record after a reconciliation attempt
// that did not settle it: ReconcileAttempts+1, ReconcileAfter = now + Delay,
// LastError = Error.
//
// Like a settlement, a deferral is about what its caller was shown when it
// listed the record: the execution (Fence) and the attempts counted so far
// (Attempts). A record whose fence has moved on since ran again, and an
// attempt about the older execution must not count against the new one. A
// record whose ReconcileAttempts has moved on was deferred meanwhile by
// another reconciler that listed it too (every instance of a service runs
// one): this attempt is already counted, and counting it twice would
// dead-letter records early.
type DeferParams struct {
	FenceParams
	// Attempts is the record's ReconcileAttempts when the caller listed
	// it.
	Attempts int
	Delay    time.Duration
	Error    string
	// DeadLetter gives up on the record instead of rescheduling it:
	// ReconcileAttempts+1, LastError = Error, DeadLetteredAt = now,
	// ReconcileAfter kept, and Delay is ignored. The record stays unknown
	// and is never due again; only Resolve (an operator) settles it. A
	// later Defer without DeadLetter reschedules it as any unknown record
	// (ReconcileAfter = now + Delay) and leaves it dead-lettered.
	DeadLetter bool
}

// DeleteParams removes a record (an operator's cache-bust).
//
// A delete is about what its caller was shown, like a settlement: Fence,
// when positive, is the record's fence then (what Get, List or the
// console's record page showed). A record whose fence has moved on since
// ran again, perhaps with an answer nobody saw, and a delete decided about
// the older execution must not remove it: the next retry would run the
// request again. Zero deletes whatever execution the record holds.
type DeleteParams struct {
	Scope string
	Key   string
	Fence int64
}

// Store keeps idempotency records. Implementations must be safe for
// concurrent use by many goroutines and, for durable stores, by many
// processes sharing one database.
type Store interface {
	// Reserve is the single atomic entry point of a request. In one step it:
	//   - creates an in_progress record when none exists, or when the
	//     existing one is expired or terminal past ExpiresAt (its fence by
	//     the rule of Fences either way);
	//   - returns the existing record untouched (Existing) when its
	//     fingerprint differs, whatever its state;
	//   - reclaims a failed_retryable record with the same fingerprint;
	//   - for an in_progress record whose lease expired: under its stored
	//     policy unknown, moves it to unknown (LastError "lease_expired",
	//     due for reconciliation now) and returns it (Existing);
	//     under retry or resume, takes it over (TakenOver);
	//   - otherwise returns the record (Existing).
	// N concurrent Reserves of one absent key yield exactly one Created; the
	// others get Existing with an in_progress record, never an error.
	// With p.MaxActive positive, a create or reclaim that would take the
	// tenant past its cap fails with ErrOverCap instead (see ReserveParams).
	Reserve(ctx context.Context, p ReserveParams) (ReserveResult, error)

	// Complete stores the response and moves in_progress to completed. It
	// fails with ErrLeaseLost (changing nothing) unless the record is
	// in_progress with fence p.Fence.
	Complete(ctx context.Context, p CompleteParams) error

	// Release moves in_progress to failed_retryable (the request certainly
	// had no effect). ErrLeaseLost as for Complete.
	Release(ctx context.Context, p ReleaseParams) error

	// MarkUnknown moves in_progress to unknown, due for reconciliation now.
	// ErrLeaseLost as for Complete.
	MarkUnknown(ctx context.Context, p ReleaseParams) error

	// Checkpoint sets RecoveryPoint. ErrLeaseLost as for Complete.
	Checkpoint(ctx context.Context, p CheckpointParams) error

	// Extend renews the lease. ErrLeaseLost as for Complete.
	Extend(ctx context.Context, p ExtendParams) error

	// Get returns the record or ErrNotFound.
	Get(ctx context.Context, scope, key string) (Record, error)

	// Delete removes the record (operator cache-bust); with a positive
	// p.Fence, only if that is still the record's fence, checked in the
	// same atomic step as the delete. ErrNotFound when there is none;
	// ErrLeaseLost, changing nothing, when p.Fence is positive and the
	// record's fence is another (it ran again since its caller was shown
	// it, whatever its state); ErrStateConflict, changing nothing, when it
	// is in_progress: its holder may still be running. An in-progress
	// record is swept to unknown once its lease expires, and can be
	// deleted then. A record created after the delete gets a fence from
	// the store clock, greater than every fence of the deleted one (see
	// Fences).
	Delete(ctx context.Context, p DeleteParams) error

	// SweepExpiredLeases moves up to p.Limit in_progress records whose lease
	// expired more than p.Grace ago and whose policy is unknown to unknown (LastError
	// "lease_expired", due for reconciliation now) and returns them. Records under retry or resume
	// stay in_progress for a retry to take over. Safe to run from several
	// instances at once: each record is moved once. A store that moves
	// records in several steps (a cluster's masters) may return, with the
	// failure of a step, those the others moved; Reap counts them likewise.
	SweepExpiredLeases(ctx context.Context, p SweepParams) ([]Record, error)

	// Reap deletes (or soft-expires) up to p.Limit terminal records past
	// ExpiresAt, and turns unknown records past ExpiresAt, and in_progress
	// ones past ExpiresAt whose lease expired more than p.Grace ago too (a
	// holder still renewing its lease is alive), into completed records
	// holding p.Abandoned.
	Reap(ctx context.Context, p ReapParams) (ReapResult, error)

	// ListUnknown returns unknown records, oldest ReconcileAfter first,
	// dead-lettered ones included in that order at their ReconcileAfter
	// (which a dead letter keeps; see DeferParams). With DueOnly it
	// returns only those due (ReconcileAfter <= now) and never a
	// dead-lettered one.
	ListUnknown(ctx context.Context, p ListUnknownParams) ([]Record, error)

	// List returns up to p.Limit records matching p's filters, newest
	// first (see ListParams for the order and keyset paging), and the
	// cursor of the next page: nil when this page is the last. It reads
	// without changing anything. ErrInvalidParams when p.Validate fails.
	List(ctx context.Context, p ListParams) ([]Record, *Cursor, error)

	// Resolve moves an unknown record whose fence is p.Fence to completed
	// or failed_retryable. ErrNotFound when absent; ErrLeaseLost, changing
	// nothing, when its fence is not p.Fence (the settlement is about
	// another execution, whatever the record's state); ErrStateConflict
	// when it has that fence but is not unknown.
	Resolve(ctx context.Context, p ResolveParams) error

	// Defer reschedules the reconciliation of an unknown record whose fence
	// is p.Fence and whose ReconcileAttempts is p.Attempts, or dead-letters
	// it (p.DeadLetter); the record is checked in the same atomic step as
	// it is changed. ErrNotFound when absent; ErrLeaseLost, changing
	// nothing, when its fence is not p.Fence (the attempt is about another
	// execution, whatever the record's state); ErrStateConflict, changing
	// nothing, when it has that fence but is not unknown, or its
	// ReconcileAttempts is not p.Attempts (another reconciler counted this
	// attempt already).
	Defer(ctx context.Context, p DeferParams) error

	// Ping checks that the store is reachable.
	Ping(ctx context.Context) error

	// Close releases the store's resources.
	Close() error
}

var (
	// ErrNotFound: no record for (scope, key).
	ErrNotFound = errors.New("idem/store: record not found")
	// ErrLeaseLost: the caller's fence is no longer current or the record
	// left in_progress (for Resolve, Defer and a fenced Delete: the
	// record's fence is not the caller's); nothing was changed.
	ErrLeaseLost = errors.New("idem/store: lease lost")
	// ErrStateConflict: the record is not in the state the operation needs.
	ErrStateConflict = errors.New("idem/store: record is not in the required state")
	// ErrInvalidParams: the parameters break the contract (empty scope or
	// key, non-positive limit, ...).
	ErrInvalidParams = errors.New("idem/store: invalid parameters")
	// ErrTooLong: a scope or key is longer than MaxScopeBytes or
	// MaxKeyBytes. It matches ErrInvalidParams too.
	ErrTooLong = fmt.Errorf("%w: too long", ErrInvalidParams)
	// ErrOverCap: Reserve would have made a record active while its tenant
	// already holds ReserveParams.MaxActive active records; nothing was
	// changed. A definite answer, not a failure.
	ErrOverCap = errors.New("idem/store: tenant is at its cap of active records")
	// ErrCapUnsupported: the store cannot count a tenant's active records
	// atomically with a reservation, and refuses a Reserve with a positive
	// MaxActive (changing nothing). Such a store implements CapRefuser, so
	// that a configuration asking for a cap fails at start.
	ErrCapUnsupported = errors.New("idem/store: this store does not enforce a cap of active records per tenant")
)

// CapRefuser is implemented by a store that refuses ReserveParams.MaxActive
// with ErrCapUnsupported; TenantCapUnsupported says why, or returns "" when
// the store, as configured, does count (a store may count only when told
// to, because counting has a cost).
type CapRefuser interface {
	TenantCapUnsupported() string
}

// ActiveCounter is implemented by a store that counts the active records
// (State.Active) it holds across all tenants, for the engine's bound on
// them (idem.Config.StoreMaxActive). Every store of this module but Redis,
// whose records are spread over keys and shards with no index to count
// them by state, implements it; the cache wrapper forwards it. A store
// that also implements CapRefuser counts only while it accepts the tenant
// cap (TenantCapUnsupported returns ""): the PostgreSQL store keeps the
// index it counts with only under postgres.Config.TenantCap. A store that
// also implements ActiveCountRefuser counts only while
// ActiveCountUnsupported returns "".
type ActiveCounter interface {
	// CountActive returns the number of active records, or limit when
	// there are at least limit: a store may stop counting there, so the
	// cost of a call is bounded by limit, not by the table. limit must be
	// positive. The count is a snapshot, not a reservation: records made
	// active after it are not in it.
	CountActive(ctx context.Context, limit int) (int, error)
}

// ActiveCountRefuser is implemented by a store that implements
// ActiveCounter whatever it wraps, but counts only when what it wraps does
// (the cache wrapper over its backing store): ActiveCountUnsupported says
// why it cannot count, or returns "" when it can, so that a configuration
// that needs the count fails at start instead of at every new key. Such a
// store's CountActive fails with ErrCapUnsupported when it cannot count.
type ActiveCountRefuser interface {
	ActiveCountUnsupported() string
}

// Limits every store accepts, whatever its schema, so that one request gets
// one answer on every store.
const (
	// MaxScopeBytes bounds a record's scope.
	MaxScopeBytes = 1024
	// MaxKeyBytes bounds a record's key.
	MaxKeyBytes = 1024
)

// CheckID checks a record's identity as every store must: scope and key
// present, within MaxScopeBytes and MaxKeyBytes, valid UTF-8 without NUL
// (text columns of SQL databases refuse the others, and a store error must
// never stand for a client's bad bytes).
func CheckID(scope, key string) error {
	switch {
	case scope == "" || key == "":
		return errors.Join(ErrInvalidParams, errors.New("scope and key are required"))
	case len(scope) > MaxScopeBytes:
		return errors.Join(ErrTooLong, fmt.Errorf("scope of %d bytes, the limit is %d", len(scope), MaxScopeBytes))
	case len(key) > MaxKeyBytes:
		return errors.Join(ErrTooLong, fmt.Errorf("key of %d bytes, the limit is %d", len(key), MaxKeyBytes))
	case !storableText(scope):
		return errors.Join(ErrInvalidParams, errors.New("scope is not valid UTF-8 without NUL"))
	case !storableText(key):
		return errors.Join(ErrInvalidParams, errors.New("key is not valid UTF-8 without NUL"))
	}
	return nil
}

// storableText reports whether s is valid UTF-8 without NUL. Scopes and
// keys are short and almost always ASCII, checked on every request (by the
// engine and again by the store): one pass over the bytes settles those,
// and only text with a byte above 0x7F is decoded.
func storableText(s string) bool {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == 0:
			return false
		case c >= utf8.RuneSelf:
			return utf8.ValidString(s[i:]) && strings.IndexByte(s[i:], 0) < 0
		}
	}
	return true
}

// Clock returns the current time. Stores use their own clock (the database
// server's) when none is given.
type Clock func() time.Time

// TxStore is implemented by SQL stores: the same transitions run inside the
// caller's transaction T (pgx.Tx, *sql.Tx), so the business write, the key's
// completion and any outbox rows commit together or not at all.
type TxStore[T any] interface {
	// InTx runs fn in a new transaction of the store's database and commits
	// it when fn returns nil (rolls back otherwise).
	InTx(ctx context.Context, fn func(tx T) error) error
	ReserveTx(ctx context.Context, tx T, p ReserveParams) (ReserveResult, error)
	CompleteTx(ctx context.Context, tx T, p CompleteParams) error
	CheckpointTx(ctx context.Context, tx T, p CheckpointParams) error
}
