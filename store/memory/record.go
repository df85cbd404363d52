package memory

import (
	"time"
	"unsafe"

	"github.com/idem-go/idem/store"
)

// entry is one record as the store changes it: every record in flight,
// and the completed ones not kept cold (see cold), which holds most of a
// day's answers where the collector does not trace them. An entry is laid
// out for the collector all the same: its pointers come first (the
// collector scans an object up to its last pointer), times are integers
// (a time.Time is 24 bytes with a pointer the collector checks), and a
// completed record's key, fingerprint and body share one allocation (see
// pack): a completed entry is two objects, the entry and its text, where
// store.Record fields would make four and twice the bytes. The response is
// kept in the entry, so that completing it allocates nothing but its text
// and the records handed out point to it (see record). What most records
// never set is kept apart (see extra).
type entry struct {
	key, fp string
	scope   string
	tenant  string // ReserveParams.Tenant at creation
	more    *extra // nil while all its fields are zero
	resp    store.Response
	state   stateCode
	policy  policyCode
	hasResp bool // resp is the record's Response
	packed  bool // key, fp and resp.Body are views of one allocation
	// frozen: a view of a cold record (see Store.all), not stored itself
	frozen   bool
	attempts int32
	fence    int64
	// owner is Record.Owner; a cold (terminal) record keeps none.
	owner int64

	lockedUntil, createdAt, updatedAt, completedAt, expiresAt micros
}

// extra holds the fields of a record that only some records set: a
// recovery point, an error, a kept request, and those of reconciliation.
type extra struct {
	recoveryPoint  string
	lastError      string
	request        *store.PendingRequest
	reconciles     int // ReconcileAttempts
	reconcileAfter micros
	deadLetteredAt micros
}

// none is the extra of an entry that has none; never written.
var none extra

// rare returns e's extra for reading.
func (e *entry) rare() *extra {
	if e.more == nil {
		return &none
	}
	return e.more
}

// x returns e's extra for writing.
func (e *entry) x() *extra {
	if e.more == nil {
		e.more = new(extra)
	}
	return e.more
}

// setError sets e's LastError, and setRequest its Request, allocating no
// extra for a zero value.
func (e *entry) setError(s string) {
	if s != "" || e.more != nil {
		e.x().lastError = s
	}
}

func (e *entry) setRequest(r *store.PendingRequest) {
	if r != nil || e.more != nil {
		e.x().request = r
	}
}

// settle clears the reconciliation times of a record that leaves unknown.
func (e *entry) settle() {
	if e.more != nil {
		e.more.reconcileAfter, e.more.deadLetteredAt = 0, 0
	}
}

// stateCode is a record's state as its index in states, and policyCode
// its lease policy as its index in policies: a byte, not a string.
type (
	stateCode  uint8
	policyCode uint8
)

const (
	stInProgress stateCode = iota + 1
	stCompleted
	stFailedRetryable
	stUnknown
	stExpired
	stPending
)

const leaseUnknown policyCode = 1

var (
	states   = [...]store.State{"", store.StateInProgress, store.StateCompleted, store.StateFailedRetryable, store.StateUnknown, store.StateExpired, store.StatePending}
	policies = [...]store.LeasePolicy{"", store.LeaseUnknown, store.LeaseRetry, store.LeaseResume}
)

func (c stateCode) Active() bool   { return states[c].Active() }
func (c stateCode) Terminal() bool { return states[c].Terminal() }

// stateOf and policyOf return the code of a state and of a lease policy.
// The store sets only the states it names and accepts only valid
// policies (ReserveParams.Validate), so every value has one.
func stateOf(s store.State) stateCode {
	for i, v := range states {
		if v == s {
			return stateCode(i)
		}
	}
	panic("memory: a record in state " + string(s) + ", which the store does not name")
}

func policyOf(p store.LeasePolicy) policyCode {
	for i, v := range policies {
		if v == p {
			return policyCode(i)
		}
	}
	panic("memory: lease policy " + string(p) + ", which ReserveParams.Validate refuses")
}

// micros is a time as whole microseconds (store.Resolution) since
// January 1 of year 1, UTC: 0 is the zero time.Time, and every time a store
// can hold fits.
type micros int64

// unixToInternal is the number of seconds from January 1 of year 1 to the
// Unix epoch.
const unixToInternal int64 = (1969*365 + 1969/4 - 1969/100 + 1969/400) * 24 * 60 * 60

func at(t time.Time) micros {
	if t.IsZero() {
		return 0
	}
	return micros((t.Unix()+unixToInternal)*1e6 + int64(t.Nanosecond()/1e3))
}

// time returns m as a UTC time.Time, as the store read it from its clock.
func (m micros) time() time.Time {
	if m == 0 {
		return time.Time{}
	}
	return time.Unix(int64(m)/1e6-unixToInternal, int64(m)%1e6*1e3).UTC()
}

func (m micros) before(n micros) bool { return m < n }

// record returns the record e holds. Its response, when it has one, is
// the entry's own: callers must not modify it (see Store).
func (e *entry) record() store.Record {
	r := e.fields()
	switch {
	case e.frozen:
		r.Response = e.response()
	case e.hasResp:
		r.Response = &e.resp
	}
	return r
}

// response returns a copy of e's response, for a view of a cold record:
// the view's own field is not the record's, and is not kept.
func (e *entry) response() *store.Response {
	resp := e.resp
	return &resp
}

// fields returns the record e holds without its response.
func (e *entry) fields() store.Record {
	m := e.rare()
	return store.Record{
		Scope: e.scope, Key: e.key, Fingerprint: e.fp, State: states[e.state], Fence: e.fence, LeasePolicy: policies[e.policy],
		Owner: e.owner, LockedUntil: e.lockedUntil.time(), RecoveryPoint: m.recoveryPoint, LastError: m.lastError,
		Attempts: int(e.attempts), CreatedAt: e.createdAt.time(), UpdatedAt: e.updatedAt.time(),
		CompletedAt: e.completedAt.time(), ExpiresAt: e.expiresAt.time(),
		ReconcileAfter: m.reconcileAfter.time(), ReconcileAttempts: m.reconciles,
		DeadLetteredAt: m.deadLetteredAt.time(), Request: m.request,
	}
}

// set makes e hold r, a record built by storekit, keeping e's text where
// r's key, fingerprint and response are those e already holds. It reports
// whether e.key is a new string, which the store's maps must then be
// keyed by.
func (e *entry) set(r *store.Record) (rekeyed bool) {
	e.scope, e.state, e.policy, e.fence, e.owner = r.Scope, stateOf(r.State), policyOf(r.LeasePolicy), r.Fence, r.Owner
	e.attempts = int32(r.Attempts)
	e.lockedUntil, e.createdAt, e.updatedAt = at(r.LockedUntil), at(r.CreatedAt), at(r.UpdatedAt)
	e.completedAt, e.expiresAt = at(r.CompletedAt), at(r.ExpiresAt)
	m := extra{
		recoveryPoint: r.RecoveryPoint, lastError: r.LastError, request: r.Request, reconciles: r.ReconcileAttempts,
		reconcileAfter: at(r.ReconcileAfter), deadLetteredAt: at(r.DeadLetteredAt),
	}
	switch {
	case m != none:
		*e.x() = m
	case e.more != nil:
		e.more = nil
	}
	if r.Key != e.key || r.Fingerprint != e.fp {
		e.key, e.fp, e.packed = r.Key, r.Fingerprint, false
	}
	e.hasResp = r.Response != nil
	if r.Response != nil && r.Response != &e.resp {
		e.answer(*r.Response)
	}
	return e.pack()
}

// answer makes resp e's response. The body is packed with the key and
// fingerprint by pack.
func (e *entry) answer(resp store.Response) {
	e.resp, e.hasResp, e.packed = resp, true, false
}

// pack puts the key, the fingerprint and the body of a completed record
// into one allocation, so that the record costs the collector one object
// more than its entry, not three. It reports whether it did: the store's
// maps must then be keyed by the new e.key, so that they hold no other
// copy of it. The text is never written after it is built, so the strings
// over it are immutable as Go requires, and the body handed out is a
// slice of it with its capacity capped, as the engine's own buffer was.
func (e *entry) pack() bool {
	if e.packed || !e.hasResp {
		return false
	}
	body := e.resp.Body
	text := make([]byte, 0, len(e.key)+len(e.fp)+len(body))
	text = append(append(append(text, e.key...), e.fp...), body...)
	if len(text) == 0 {
		e.packed = true
		return false
	}
	nk, nf := len(e.key), len(e.key)+len(e.fp)
	e.key = unsafe.String(&text[0], nk)
	if len(e.fp) > 0 {
		e.fp = unsafe.String(&text[nk], len(e.fp))
	}
	if body != nil {
		e.resp.Body = text[nf:len(text):len(text)]
	}
	e.packed = true
	return true
}
