package idem

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idem-go/idem/internal/fingerprint"
	"github.com/idem-go/idem/internal/header"
	"github.com/idem-go/idem/store"
)

// Engine runs the idempotency protocol over a store. It is safe for
// concurrent use; one Engine serves every route, and With derives engines
// with per-route settings that share the store and the metrics.
//
// Run is the protocol, whatever the transport; Middleware and Handle adapt
// it to net/http, package grpcidem to gRPC.
type Engine struct {
	store  store.Store
	cfg    settings
	hasher *fingerprint.Hasher
	log    *slog.Logger
	obs    Observer
	sname  string // the store's name in Step.Store
	clk    clock
	// limiter is the tenants' rate of new keys, nil without one.
	limiter *tenantLimiter
	// global is the Engine's rate of new keys, whatever the tenant (one
	// bucket, tenant ""), nil without one.
	global *tenantLimiter
	// bound is the bound on the records active across the store, nil
	// without one.
	bound *activeBound
	// breaker is the store's circuit breaker, nil when disabled.
	breaker *breaker
	// dur watches the store's durability, nil when the store has no check.
	dur *durability
	// reads shares the store reads of duplicates waiting for one record
	// (see await); engines made by With share it.
	reads *sharedReads
	// reuse shares scopes and stored headers between calls (see reuse);
	// engines made by With share it.
	reuse *reuse
	// beats queues the executions' first renewals; each engine has its
	// own (their leases differ).
	beats *heartbeats
	// lost remembers the reservations whose answer the store lost, to be
	// read back (see lost.go); engines made by With share it.
	lost *lostReservations
}

// New returns an engine over s.
func New(s store.Store, cfg Config) (*Engine, error) {
	if s == nil {
		return nil, errors.New("idem: a store is required")
	}
	set, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if err := checkAsync(s, &set); err != nil {
		return nil, err
	}
	if err := checkCap(s, &set); err != nil {
		return nil, err
	}
	if err := checkActiveBound(s, &set); err != nil {
		return nil, err
	}
	dur, err := newDurability(s, &set)
	if err != nil {
		return nil, err
	}
	obs := observerOr(set.Observer)
	return &Engine{store: s, cfg: set, hasher: fingerprint.New(set.Secret), log: set.Logger,
		obs: obs, sname: StoreName(s), clk: wallClock{},
		limiter: newTenantLimiter(set.TenantRate, set.TenantBurst), global: newTenantLimiter(set.NewKeyRate, set.NewKeyBurst),
		bound: newActiveBound(s, &set), breaker: newBreaker(&set, obs), dur: dur, reads: &sharedReads{m: map[string]*sharedRead{}},
		reuse: newReuse(), beats: newHeartbeats(set.Lease), lost: newLostReservations()}, nil
}

// With returns an engine for a route that needs other settings (an optional
// key, selected fields, another lease policy ...). It shares e's store and
// metrics; modify receives a copy of e's configuration.
func (e *Engine) With(modify func(*Config)) (*Engine, error) {
	cfg := e.cfg.Config
	cfg.Methods = append([]string(nil), cfg.Methods...)
	cfg.Fields = append([]string(nil), cfg.Fields...)
	cfg.AsyncKeepHeaders = append([]string(nil), cfg.AsyncKeepHeaders...)
	cfg.AsyncDropHeaders = append([]string(nil), cfg.AsyncDropHeaders...)
	if e.cfg.Config.KeyRequired == nil {
		cfg.KeyRequired = Bool(e.cfg.keyRequired)
	}
	modify(&cfg)
	set, err := cfg.withDefaults()
	if err == nil {
		err = checkCap(e.store, &set)
	}
	if err == nil {
		err = checkActiveBound(e.store, &set)
	}
	if err != nil {
		return nil, err
	}
	if err := checkAsync(e.store, &set); err != nil {
		return nil, err
	}
	if set.RequireDurable && e.dur == nil {
		return nil, errNoDurabilityCheck(e.sname)
	}
	d := *e
	d.cfg = set
	d.beats = newHeartbeats(set.Lease)
	d.hasher = fingerprint.New(set.Secret)
	d.log = set.Logger
	d.obs = observerOr(set.Observer)
	if set.TenantRate != e.cfg.TenantRate || set.TenantBurst != e.cfg.TenantBurst {
		d.limiter = newTenantLimiter(set.TenantRate, set.TenantBurst)
	}
	if set.NewKeyRate != e.cfg.NewKeyRate || set.NewKeyBurst != e.cfg.NewKeyBurst {
		d.global = newTenantLimiter(set.NewKeyRate, set.NewKeyBurst)
	}
	if set.StoreMaxActive != e.cfg.StoreMaxActive || set.StoreActiveRecount != e.cfg.StoreActiveRecount {
		d.bound = newActiveBound(e.store, &set)
	}
	return &d, nil
}

// Store returns the engine's store.
func (e *Engine) Store() store.Store { return e.store }

// Logger returns the logger the engine reports its events to, for
// integrations that log next to it.
func (e *Engine) Logger() *slog.Logger { return e.log }

// TTL returns how long the engine keeps a completed answer (Config.TTL
// with its default applied), for services that settle records as the
// engine would.
func (e *Engine) TTL() time.Duration { return e.cfg.TTL }

// StoreTimeout returns the bound on each of the engine's store calls
// (Config.StoreTimeout with its default applied).
func (e *Engine) StoreTimeout() time.Duration { return e.cfg.StoreTimeout }

// Request names the operation a record belongs to: the record's scope is
// built from it. Operators and resolvers use it to find a request's record.
type Request struct {
	// Tenant is the authenticated caller; Method and Route the operation.
	Tenant string
	Method string
	Route  string
}

// Scope returns the record scope of the request: tenant, method and route,
// length-prefixed so that no two triples share a scope.
func (r *Request) Scope() string {
	return strconv.Itoa(len(r.Tenant)) + ":" + r.Tenant + r.Method + " " + r.Route
}

// ParseScope splits a record scope built by Request.Scope into its tenant,
// method and route, for resolvers and operators that need to know which
// operation a record belongs to.
func ParseScope(scope string) (tenant, method, route string, ok bool) {
	n, rest, found := strings.Cut(scope, ":")
	size, err := strconv.Atoi(n)
	if !found || err != nil || size < 0 || size > len(rest) {
		return "", "", "", false
	}
	tenant, rest = rest[:size], rest[size:]
	method, route, found = strings.Cut(rest, " ")
	if !found || method == "" {
		return "", "", "", false
	}
	return tenant, method, route, true
}

// Call is one request as the protocol sees it, whatever carried it: the
// HTTP middleware, the gRPC interceptor, the proxy and framework adapters
// translate their requests into a Call and hand it to Run.
type Call struct {
	// Tenant, Method and Route name the operation; with the key they
	// identify the record (see Request.Scope). Route is the route pattern
	// ("/v1/orders/{id}"), not the concrete path, so that operators find
	// one scope per operation. Method should be upper case.
	Tenant string
	Method string
	Route  string

	// Target is the concrete request target: for HTTP the escaped path
	// and, when there is one, '?' and the raw query ((*url.URL).RequestURI);
	// for gRPC the full method name. It is part of the fingerprint, the
	// query compared as its decoded pairs sorted by name, so the same key
	// sent to another resource or with another query is a different request
	// (KeyReused), never a replay of the first one's answer.
	Target string

	// Keys are the raw values of the idempotency key, one per field line
	// (r.Header["Idempotency-Key"], gRPC metadata). Run parses them: none
	// is a missing key, several a repeated one; quoted (RFC 8941 sf-string)
	// and bare spellings of one value are the same key.
	Keys []string

	// KeyRequired overrides Config.KeyRequired for this call when set: a
	// call without a key is then refused (true) or run outside the
	// protocol (false).
	KeyRequired *bool

	// ContentType and Body are the request content, fingerprinted
	// canonically (JCS for JSON, sorted pairs for forms, raw bytes
	// otherwise). Run does not limit Body: the transport bounds what it
	// reads (Config.MaxBodyBytes for HTTP).
	ContentType string
	Body        []byte

	// ContentEncoding is the request's Content-Encoding, the codings Body
	// is in (r.Header's values joined with commas). The fingerprint sees
	// the content: Run undoes gzip and deflate, at most
	// Config.MaxBodyBytes of it (a larger content is body-too-large, an
	// undecodable body invalid-body), so a retry compressed into other
	// bytes is the same request; a body in another coding is fingerprinted
	// as the bytes sent. Body itself is left as it came.
	ContentEncoding string

	// ReadBody, when set and Body is nil, produces the body once the key
	// is known to be valid, so that calls passing through without a key
	// do not pay for it. Its error refuses the call (body-unreadable).
	ReadBody func() ([]byte, error)

	// Header is the request's header. Only an asynchronous route
	// (Config.Async) reads it: the headers a worker needs are kept with the
	// pending request (see Config.AsyncKeepHeaders).
	Header map[string][]string
}

// Outcome is what becomes of a record once its operation returned.
type Outcome int

const (
	// ByStatus applies the response policy to Response.Status: 2xx, 3xx
	// and 4xx are kept, except 408, 425 and 429; 5xx and those three are
	// released (all are kept with Config.StoreServerErrors).
	ByStatus Outcome = iota
	// Keep stores the response; every retry gets it replayed.
	Keep
	// Release frees the key for another attempt: only for failures certain
	// to have had no effect.
	Release
	// Unknown sends the record to reconciliation: the operation may or may
	// not have had its effect, and retries are refused until it is settled.
	Unknown
)

var outcomeNames = [...]string{"by_status", "keep", "release", "unknown"}

func (o Outcome) String() string {
	if o >= 0 && int(o) < len(outcomeNames) {
		return outcomeNames[o]
	}
	return "invalid"
}

// Result is what an operation run by Run returns.
type Result struct {
	// Response is the answer to store. Headers are filtered through
	// httpfield.Replayable before they are stored; a body longer than
	// Config.MaxResponseBytes is not kept (BodyOmitted).
	Response store.Response
	// Outcome decides what becomes of the record; ByStatus (the zero
	// value) applies the response policy.
	Outcome Outcome
	// Reason says why for Release and Unknown; it is kept in the record
	// for operators.
	Reason string
	// Streamed reports that the answer was sent to the client (in whole or
	// in part) before Run stored it, so that a failure to store it can no
	// longer change what the client got.
	Streamed bool
}

// Verdict is what Run did with a call.
type Verdict int

const (
	// Executed: the operation ran under the key and its outcome was
	// recorded. The adapter sends the operation's answer.
	Executed Verdict = iota
	// Passed: the call had no key and none was required (or it was
	// already inside a protected call); the operation ran outside the
	// protocol.
	Passed
	// Replayed: the operation completed before; Answer.Response is the
	// stored answer, to send with Idempotent-Replayed: true.
	Replayed
	// KeyReused: the key was first used with a different request; nothing
	// ran and the first request's record is untouched.
	KeyReused
	// InProgress: another execution holds the key; retry later.
	InProgress
	// OutcomeUnknown: the operation may or may not have run; retries are
	// refused until reconciliation settles it.
	OutcomeUnknown
	// Invalid: the call was refused before anything was reserved (key
	// missing, malformed or repeated, body unreadable or invalid for its
	// type, scope too long); Answer.Problem says which.
	Invalid
	// Unavailable: the store failed; the operation did not run.
	Unavailable
	// Accepted: the route is asynchronous (Config.Async) and the request
	// is recorded as pending, or is waiting for a worker or being run by
	// one: 202 Accepted with Retry-After and Answer.Location. The operation
	// did not run in this call.
	Accepted
	// Limited: the tenant is over its rate of new keys or its cap of
	// active records, or the Engine over its rate of new keys (429,
	// Retry-After), or the store holds Config.StoreMaxActive active records
	// (503, Retry-After); nothing was reserved and the operation did not
	// run.
	Limited
)

var verdictNames = [...]string{"executed", "passed", "replayed", "key_reused", "in_progress", "unknown", "invalid", "unavailable", "accepted", "limited"}

func (v Verdict) String() string {
	if v >= 0 && int(v) < len(verdictNames) {
		return verdictNames[v]
	}
	return "invalid_verdict"
}

// Answer tells the adapter what to send.
type Answer struct {
	Verdict Verdict
	// Response is the stored answer of a Replayed call. It belongs to the
	// store's record: do not modify it.
	Response *store.Response
	// Problem is set for every verdict other than Executed, Passed and
	// Replayed: the refusal or deferral to render (WriteProblem does it for
	// HTTP).
	Problem Problem
	// Err is the store's failure for Unavailable.
	Err error
	// Location is the status resource of an Accepted call (see
	// StatusHandler).
	Location string
	// Expires is when the key's record expires, for a Replayed answer and
	// an Executed one whose answer was stored (zero otherwise): from then
	// on the key is free and a retry runs the operation again. For an
	// executed answer it is the completion's start plus Config.TTL, at
	// most the store's own figure (counted from a moment later).
	Expires time.Time
}

// ErrStore wraps every store failure the engine met; the engine fails
// closed on it (503 before the handler runs).
var ErrStore = errors.New("idem: store unavailable")

// Run runs one call under the idempotency protocol: it parses the key,
// fingerprints the call, reserves the key (waiting for an in-flight
// original with Config.Wait) and then, according to what the store holds:
//
//   - a new key, or one released by a failure: runs fn with a context that
//     carries the Execution (FromContext), renews the lease while fn runs,
//     and records fn's Result; Verdict Executed. A panic in fn marks the
//     record unknown and goes on up. The record is settled before Run
//     returns: the answer the adapter then sends is the one every retry
//     replays (unless the store stayed unreachable until the lease would
//     lapse; the record then becomes unknown, logged and counted).
//   - a completed record: Replayed, with the stored answer.
//   - the key used with another request: KeyReused (Config.KeyReusedStatus).
//   - an execution still holding the key: InProgress (Config.InProgressStatus,
//     Retry-After).
//   - an outcome being reconciled: OutcomeUnknown (409, Retry-After).
//   - a key missing where required, malformed or repeated, an invalid body,
//     a scope the store cannot hold: Invalid (400, 414).
//   - a store failure, or the store's circuit breaker open: Unavailable
//     (503, Retry-After); fn does not run.
//   - a tenant over Config.TenantRate or Config.TenantMaxActive, the
//     Engine over Config.NewKeyRate: Limited (429, Retry-After); the store
//     at Config.StoreMaxActive: Limited (503, Retry-After); nothing is
//     reserved and fn does not run.
//
// A call without a key on a route where it is optional, and a call made
// inside an operation already running under a key, run fn directly:
// Passed.
func (e *Engine) Run(ctx context.Context, c Call, fn func(ctx context.Context) Result) Answer {
	return e.run(ctx, &c, funcOp(fn))
}

// operation is what run executes: the exported Run's function, or an
// adapter that reads its body lazily (once the key is known to be valid)
// and needs no closure per request.
type operation interface {
	// body returns the request body when the Call does not hold it.
	body(limit int64) ([]byte, error)
	// pass runs the operation outside the protocol.
	pass(ctx context.Context)
	// run runs the operation under the key; ctx carries the Execution.
	run(ctx context.Context) Result
	// reserveCtx returns storage for the context of the call's first
	// Reserve, allocated with the adapter's own per-request state, or nil
	// to allocate it apart. It is used once: a reservation retried after
	// waiting allocates its own.
	reserveCtx() *callCtx
	// execution returns storage for the Execution the first reservation
	// starts, allocated with what the adapter needs to run the call, or
	// nil to allocate it apart. It is asked only when the call runs.
	execution() *Execution
}

type funcOp func(ctx context.Context) Result

func (funcOp) body(int64) ([]byte, error)       { return nil, nil }
func (f funcOp) pass(ctx context.Context)       { f(ctx) }
func (f funcOp) run(ctx context.Context) Result { return f(ctx) }
func (funcOp) reserveCtx() *callCtx             { return nil }
func (funcOp) execution() *Execution            { return nil }

var errBodyTooLarge = errors.New("body too large")

func (e *Engine) run(ctx context.Context, c *Call, op operation) Answer {
	if FromContext(ctx) != nil {
		// Already inside a protected call (nested middleware, an
		// in-process chain): the outer execution answers for it.
		return pass(ctx, op)
	}
	key, a, ok := e.parseKey(ctx, c, op)
	if !ok {
		return a
	}
	id, a, ok := e.identify(ctx, c, op, key)
	if !ok {
		return a
	}
	t, refused := e.admit(ctx, &id)
	if refused != nil {
		return *refused
	}
	d, err := e.reserve(ctx, c, op, &id)
	if refused := e.admitted(ctx, t, &id, d, err); refused != nil {
		return *refused
	}
	if err != nil {
		return e.unavailable(ctx, &id, err)
	}
	return e.answer(ctx, c, op, &id, &d)
}

// callID is what identifies a call's record and request: the tenant and
// route it belongs to, its scope and key, and its fingerprint.
type callID struct {
	tenant, route, scope, key, fp string
}

// pass runs the operation outside the protocol.
func pass(ctx context.Context, op operation) Answer {
	op.pass(ctx)
	return Answer{Verdict: Passed}
}

// parseKey reads the call's idempotency key. ok is false when the call
// does not go on under the protocol: a is then its answer (Passed when the
// key is missing and not required, after running the operation).
func (e *Engine) parseKey(ctx context.Context, c *Call, op operation) (key string, a Answer, ok bool) {
	key, err := header.Parse(c.Keys)
	switch {
	case errors.Is(err, header.ErrMissing):
		required := e.cfg.keyRequired
		if c.KeyRequired != nil {
			required = *c.KeyRequired
		}
		if !required {
			return "", pass(ctx, op), false
		}
		return "", e.refuse(ctx, probKeyMissing, ""), false
	case errors.Is(err, header.ErrRepeated):
		return "", e.refuse(ctx, probKeyRepeated, ""), false
	case err != nil:
		return "", e.refuse(ctx, probKeyMalformed, err.Error()), false
	}
	return key, Answer{}, true
}

// identify reads the call's body once its key is known to be valid, and
// names its record (scope) and request (fingerprint). ok is false when
// the call is refused: a is the refusal.
func (e *Engine) identify(ctx context.Context, c *Call, op operation, key string) (id callID, a Answer, ok bool) {
	if c.Body == nil {
		var body []byte
		var err error
		if c.ReadBody != nil {
			body, err = c.ReadBody()
		} else {
			body, err = op.body(e.cfg.MaxBodyBytes)
		}
		switch {
		case errors.Is(err, errBodyTooLarge):
			return id, e.refuse(ctx, probBodyTooLarge, "the limit is "+strconv.FormatInt(e.cfg.MaxBodyBytes, 10)+" bytes"), false
		case err != nil:
			return id, e.refuse(ctx, probBodyUnreadable, err.Error()), false
		}
		c.Body = body
	}
	req := Request{Tenant: c.Tenant, Method: c.Method, Route: c.Route}
	id = callID{tenant: c.Tenant, route: c.Route, scope: e.reuse.scope(&req), key: key}
	if err := store.CheckID(id.scope, key); err != nil {
		return id, e.refuseID(ctx, err), false
	}
	fp, err := e.fingerprint(c)
	switch {
	case errors.Is(err, errDecodedTooLarge):
		return id, e.refuse(ctx, probBodyTooLarge, "the limit is "+strconv.FormatInt(e.cfg.MaxBodyBytes, 10)+" bytes of decoded content"), false
	case err != nil:
		return id, e.refuse(ctx, probInvalidBody, err.Error()), false
	}
	id.fp = fp
	return id, Answer{}, true
}

// reserve reserves the key, as a pending request on an asynchronous
// route, and with Config.Wait waits for an in-flight original to settle.
func (e *Engine) reserve(ctx context.Context, c *Call, op operation, id *callID) (d decision, err error) {
	if e.cfg.Async {
		return e.accept(ctx, c, id.scope, id.key, id.fp)
	}
	d, err = e.begin(ctx, op.reserveCtx(), op, id.tenant, id.scope, id.route, id.key, id.fp)
	if err == nil && d.verdict == InProgress && e.cfg.Wait > 0 {
		d, err = e.await(ctx, id.tenant, id.scope, id.route, id.key, id.fp, e.cfg.Wait)
	}
	return d, err
}

// unavailable answers a call whose reservation failed: the store's own
// limits refuse the client's request (not an outage); any other failure
// is the store's, and nothing ran (fail closed).
func (e *Engine) unavailable(ctx context.Context, id *callID, err error) Answer {
	if errors.Is(err, store.ErrInvalidParams) {
		return e.refuseID(ctx, err)
	}
	if ctx.Err() != nil {
		e.log.Info("idem: the caller left before the key was reserved", "scope", id.scope, "key", id.key, "err", err)
	} else {
		e.log.Error("idem: store failed before the operation ran; refused", "scope", id.scope, "key", id.key, "err", err)
	}
	return Answer{Verdict: Unavailable, Problem: e.problem(probStore, 0), Err: err}
}

// answer carries out what the reservation decided: runs the operation
// (settling its record before returning), or replays, refuses or defers.
func (e *Engine) answer(ctx context.Context, c *Call, op operation, id *callID, d *decision) Answer {
	switch d.verdict {
	case Executed:
		d.exec.call = callRef{target: c.Target, header: c.Header, body: c.Body}
		e.execute(ctx, d.exec, op)
		return Answer{Verdict: Executed, Expires: d.exec.expiresAt()}
	case Replayed:
		return e.replay(ctx, id, &d.rec)
	case KeyReused:
		e.log.Warn("idem: key reused with a different request", "scope", id.scope, "key", id.key)
		return Answer{Verdict: KeyReused, Problem: e.problem(probKeyReused, e.cfg.KeyReusedStatus)}
	case OutcomeUnknown:
		return Answer{Verdict: OutcomeUnknown, Problem: e.problem(probUnknown, 0)}
	case Accepted:
		return Answer{Verdict: Accepted, Problem: e.problem(probAccepted, 0), Location: e.StatusLocation(c.Method, c.Route, id.key)}
	default:
		return Answer{Verdict: InProgress, Problem: e.problem(probInProgress, e.cfg.InProgressStatus)}
	}
}

// replay answers with a completed record's stored answer.
func (e *Engine) replay(ctx context.Context, id *callID, rec *store.Record) Answer {
	_, end := e.obs.Step(ctx, Step{Name: StepReplay, Store: e.sname, Scope: id.scope, Route: id.route, Fence: rec.Fence})
	if rec.Response == nil {
		err := fmt.Errorf("%w: the completed record of key %q has no answer", ErrStore, id.key)
		e.log.Error("idem: completed record without an answer; refused", "scope", id.scope, "key", id.key)
		end(StepEnd{Outcome: reserveOutcome[Replayed], Fence: rec.Fence, Err: err})
		return Answer{Verdict: Unavailable, Problem: e.problem(probStore, 0), Err: err}
	}
	end(StepEnd{Outcome: reserveOutcome[Replayed], Fence: rec.Fence})
	return Answer{Verdict: Replayed, Response: rec.Response, Expires: rec.ExpiresAt}
}

// refuse answers a call that cannot enter the protocol, and counts it.
func (e *Engine) refuse(ctx context.Context, p *problemType, detail string) Answer {
	e.obs.Reserve(ctx, "rejected")
	pr := e.problem(p, 0)
	pr.Detail = detail
	return Answer{Verdict: Invalid, Problem: pr}
}

// refuseID answers a scope or key the store cannot hold: too long (a long
// path where the route is the path) or bytes that are not UTF-8.
func (e *Engine) refuseID(ctx context.Context, err error) Answer {
	if errors.Is(err, store.ErrTooLong) {
		return e.refuse(ctx, probScopeTooLong, "")
	}
	return e.refuse(ctx, probScopeInvalid, "")
}

// Fingerprint returns the fingerprint Run computes for c (Body as given;
// ReadBody is not called), for tools that write records themselves.
func (e *Engine) Fingerprint(c Call) (string, error) { return e.fingerprint(&c) }

// fingerprint hashes what identifies the call's request: method, route,
// concrete target and canonical body (restricted to Config.Fields). An
// empty body is an empty body whatever its declared type: clients often
// label a body-less POST application/json.
func (e *Engine) fingerprint(c *Call) (string, error) {
	body, coding, err := decodeContent(c.ContentEncoding, c.Body, e.cfg.MaxBodyBytes)
	if err != nil {
		return "", err
	}
	contentType := c.ContentType
	if len(body) == 0 {
		contentType = ""
	}
	return e.hasher.Sum(fingerprint.Input{
		Method: c.Method, Route: c.Route, Target: c.Target,
		ContentType: contentType, ContentEncoding: coding, Body: body, Fields: e.cfg.Fields,
	})
}

// decision is what begin found.
type decision struct {
	verdict Verdict // Executed, Replayed, KeyReused, InProgress or OutcomeUnknown
	rec     store.Record
	exec    *Execution // set when verdict is Executed
	created bool       // the reservation created the record (a new key)
}

// begin reserves the key and decides what to do. With Executed the caller
// owns an Execution whose lease is renewed in the background until it is
// finished. cctx, when not nil, is unused storage for the Reserve call's
// context; op, when not nil, provides the Execution's.
func (e *Engine) begin(ctx context.Context, cctx *callCtx, op operation, tenant, scope, route, key, fp string) (decision, error) {
	if cctx == nil {
		cctx = new(callCtx)
	}
	p := store.ReserveParams{
		Scope: scope, Key: key, Fingerprint: fp,
		Lease: e.cfg.Lease, TTL: e.cfg.TTL, LeasePolicy: e.cfg.LeasePolicy,
		Tenant: tenant, MaxActive: e.cfg.TenantMaxActive, Owner: newOwner(),
	}
	e.lostBefore(ctx, scope, key)
	res, start, end, err := e.reserveStep(ctx, cctx, scope, route, func(ctx context.Context) (store.ReserveResult, error) {
		return e.store.Reserve(ctx, p)
	})
	if err != nil {
		e.lostReserve(ctx, &p, err, start)
		return decision{}, err
	}
	d := decide(fp, &res)
	outcome := reserveOutcome[d.verdict]
	if d.verdict == Executed {
		var x *Execution
		if op != nil {
			x = op.execution()
		}
		d.exec = e.newExecution(x, res, start)
		switch res.Outcome {
		case store.Reclaimed:
			outcome = "failed_retry"
		case store.TakenOver:
			outcome = "taken_over"
			e.log.Warn("idem: took over an expired lease", "scope", scope, "key", key,
				"fence", res.Record.Fence, "recovery_point", res.Record.RecoveryPoint)
		default:
			outcome = "created"
			d.created = true
		}
	}
	e.reserveDone(ctx, end, tenant, outcome, res.Record.Fence)
	if d.verdict == Executed {
		return d, nil
	}
	if d.verdict == OutcomeUnknown && res.Record.LastError == "lease_expired" && res.Record.ReconcileAttempts == 0 {
		e.log.Info("idem: record outcome unknown", "scope", scope, "key", key, "reason", res.Record.LastError)
	}
	return d, nil
}

// newOwner draws the ReserveParams.Owner of one reservation: random, never
// 0, the Owner of the records no Reserve started (pending ones, which a
// worker claims).
func newOwner() int64 {
	for {
		if o := rand.Int64(); o != 0 {
			return o
		}
	}
}

// reserveStep runs call, the reservation of begin or accept, as the
// engine's reserve step: its span, the store call's timeout and timing, and
// its failure, counted and ended here. On success the caller names the
// outcome and ends the step with reserveDone.
func (e *Engine) reserveStep(ctx context.Context, cctx *callCtx, scope, route string,
	call func(context.Context) (store.ReserveResult, error)) (res store.ReserveResult, start time.Time, end func(StepEnd), err error) {
	sctx, end := e.obs.Step(ctx, Step{Name: StepReserve, Store: e.sname, Scope: scope, Route: route})
	start, err = e.callAt(cctx, sctx, opReserve, false, func(ctx context.Context) (err error) {
		res, err = call(ctx)
		return err
	})
	if err != nil {
		e.reserveFailed(ctx, end, err)
	}
	return res, start, end, err
}

// reserveDone counts a reservation's outcome and ends its step.
func (e *Engine) reserveDone(ctx context.Context, end func(StepEnd), tenant, outcome string, fence int64) {
	e.obs.Reserve(ctx, outcome)
	e.tenantObs(ctx, tenant, outcome)
	end(StepEnd{Outcome: outcome, Fence: fence, Attempts: 1})
}

// reserveFailed ends the reserve step of begin or accept that failed with
// err. A refusal of the call (parameters the store refuses, the tenant's
// cap) is counted by the caller, which answers it; a failure is counted
// here.
func (e *Engine) reserveFailed(ctx context.Context, end func(StepEnd), err error) {
	switch {
	case errors.Is(err, store.ErrInvalidParams):
		end(StepEnd{Outcome: "rejected", Attempts: 1, Err: err})
	case errors.Is(err, store.ErrOverCap):
		end(StepEnd{Outcome: outcomeOverCap, Attempts: 1})
	default:
		e.obs.Reserve(ctx, "store_error")
		end(StepEnd{Outcome: "store_error", Attempts: 1, Err: err})
	}
}

// reserveOutcome names the verdicts of a reservation that found a record
// in the idem.reserve.outcomes metric ("" for the others). An array, not a
// map: it is read on every request. Sized as verdictNames, which names
// every verdict.
var reserveOutcome = [len(verdictNames)]string{
	Replayed: "replay", KeyReused: "key_reused", InProgress: "in_progress", OutcomeUnknown: "unknown",
}

// decide applies the protocol to what Reserve found. The fingerprint is
// checked before the state: a different request is refused even while the
// first is in flight, and the first's record is untouched.
func decide(fp string, res *store.ReserveResult) decision {
	if res.Outcome.Acquired() {
		return decision{verdict: Executed, rec: res.Record}
	}
	r := &res.Record
	switch {
	case r.Fingerprint != fp:
		return decision{verdict: KeyReused, rec: *r}
	case r.State == store.StateCompleted:
		return decision{verdict: Replayed, rec: *r}
	case r.State == store.StateUnknown:
		return decision{verdict: OutcomeUnknown, rec: *r}
	}
	return decision{verdict: InProgress, rec: *r}
}

// await polls a record that is in progress until it leaves that state or
// wait elapses, for the wait-then-replay mode. It returns the last decision.
func (e *Engine) await(ctx context.Context, tenant, scope, route, key, fp string, wait time.Duration) (d decision, err error) {
	ctx, end := e.obs.Step(ctx, Step{Name: StepWait, Store: e.sname, Scope: scope, Route: route})
	attempts := 0
	defer func() {
		se := StepEnd{Attempts: attempts, Err: err}
		if err == nil {
			se.Outcome, se.Fence = reserveOutcome[d.verdict], d.rec.Fence
			if d.exec != nil {
				se.Fence = d.exec.fence
			}
		}
		end(se)
	}()
	deadline := e.clk.Now().Add(wait)
	pause := 5 * time.Millisecond
	for {
		attempts++
		r, err := e.reads.get(ctx, scope, key, func(ctx context.Context) (rec store.Record, err error) {
			err = e.call(ctx, opGet, false, func(ctx context.Context) (err error) {
				rec, err = e.store.Get(ctx, scope, key)
				return err
			})
			return rec, err
		})
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return decision{}, err
		}
		now := e.clk.Now()
		if err != nil || r.State != store.StateInProgress || r.LeaseExpired(now) {
			// Deleted by an operator while we waited, settled, or its holder
			// died: begin applies the store's rules (create, replay,
			// reclaim, takeover or unknown) atomically.
			d, err := e.begin(ctx, nil, nil, tenant, scope, route, key, fp)
			if err != nil || d.verdict != InProgress || d.exec != nil || !e.clk.Now().Add(pause).Before(deadline) {
				return d, err
			}
			// Another duplicate (or a new request) took the key first:
			// its answer is waited for as the first one's was.
		} else if !now.Add(pause).Before(deadline) {
			return decide(fp, &store.ReserveResult{Record: r}), nil
		}
		if err := sleep(ctx, e.clk, pause); err != nil {
			return decision{}, err
		}
		pause = min(pause*2, 250*time.Millisecond)
	}
}

// sharedReads lets the duplicates of one key that wait in this process
// share each store read: a storm of duplicates costs the store one read per
// poll, not one per duplicate.
type sharedReads struct {
	mu sync.Mutex
	m  map[string]*sharedRead // by scope and key: the read under way
}

type sharedRead struct {
	done chan struct{}
	rec  store.Record // read only once done is closed
	err  error
}

// get joins the read of (scope, key) under way, or starts one with read.
// A read runs detached from its starter's cancellation (the others wait
// for it; the engine's store timeout still bounds it); a waiter that
// leaves stops waiting for it.
func (s *sharedReads) get(ctx context.Context, scope, key string, read func(context.Context) (store.Record, error)) (store.Record, error) {
	id := scope + "\x00" + key
	s.mu.Lock()
	r, joined := s.m[id]
	if !joined {
		r = &sharedRead{done: make(chan struct{})}
		s.m[id] = r
	}
	s.mu.Unlock()
	if !joined {
		r.rec, r.err = read(context.WithoutCancel(ctx))
		s.mu.Lock()
		delete(s.m, id)
		s.mu.Unlock()
		close(r.done)
	}
	select {
	case <-r.done:
		return r.rec, r.err
	case <-ctx.Done():
		return store.Record{}, ctx.Err()
	}
}

// execute runs the operation under x and records its outcome.
func (e *Engine) execute(ctx context.Context, x *Execution, op operation) {
	defer func() {
		if p := recover(); p != nil {
			x.markUnknown(ctx, fmt.Sprintf("handler panicked: %v", p))
			panic(p)
		}
	}()
	res := op.run(x.attach(ctx))
	e.settle(ctx, x, &res)
}

// settle records what the operation did: its declared outcome (a
// completion committed in its own transaction, an uncertain effect), else
// its Result under the response policy.
func (e *Engine) settle(ctx context.Context, x *Execution, res *Result) {
	if x.committed.Load() {
		// The handler's transaction completed the record.
		x.Abandon()
		return
	}
	x.expires.Store(0) // a CompleteParams whose transaction did not commit

	switch d := x.declared.Load(); {
	case d != nil && d.notRun:
		x.release(ctx, d.reason)
		return
	case d != nil:
		x.markUnknown(ctx, d.reason)
		return
	}
	outcome, reason := res.Outcome, res.Reason
	if outcome == ByStatus {
		outcome = Keep
		if !e.storable(res.Response.Status) {
			outcome, reason = Release, "status "+strconv.Itoa(res.Response.Status)
		}
	}
	if outcome == Release && ctx.Err() != nil {
		// A failure returned while the call was torn down (client gone,
		// deadline passed): the operation may have been part way through
		// its effects.
		outcome = Unknown
		reason = fmt.Sprintf("the call ended (%v) before the operation returned a final answer (%s)", ctx.Err(), reasonOr(reason, "released"))
	}
	switch outcome {
	case Release:
		x.release(ctx, reason)
	case Unknown:
		x.markUnknown(ctx, reasonOr(reason, "declared unknown"))
	default:
		resp := res.Response
		resp.Header = e.reuse.replayable(x.scope, resp.Header)
		if !resp.BodyOmitted && len(resp.Body) > e.cfg.MaxResponseBytes {
			resp.Body, resp.BodyOmitted = nil, true
		}
		if resp.Body == nil && !resp.BodyOmitted {
			resp.Body = []byte{}
		}
		x.complete(ctx, resp, res.Streamed)
	}
}

func reasonOr(reason, dflt string) string {
	if reason == "" {
		return dflt
	}
	return reason
}

// storable reports whether a status is the final answer of a request
// (stored and replayed) rather than a failure a retry should run again.
func (e *Engine) storable(status int) bool {
	if e.cfg.StoreServerErrors {
		return true
	}
	switch status {
	case 408, 425, 429: // Request Timeout, Too Early, Too Many Requests
		return false
	}
	return status < 500
}

// call runs one store operation under the store timeout, measuring it and
// wrapping its failure in ErrStore. Definite answers (lease lost, not
// found, wrong state, invalid parameters) pass through unwrapped. A
// detached call ignores the cancellation of ctx (but keeps its values).
func (e *Engine) call(ctx context.Context, op storeOp, detached bool, f func(context.Context) error) error {
	return e.callIn(new(callCtx), ctx, op, detached, f)
}

// callIn is call with the caller providing the (zero) callCtx, so that an
// Execution's final transition needs no allocation of its own.
func (e *Engine) callIn(cctx *callCtx, ctx context.Context, op storeOp, detached bool, f func(context.Context) error) error {
	_, err := e.callAt(cctx, ctx, op, detached, f)
	return err
}

// callAt is callIn that also returns when the call started (a lease
// reserved by it runs from then at the latest).
func (e *Engine) callAt(cctx *callCtx, ctx context.Context, op storeOp, detached bool, f func(context.Context) error) (time.Time, error) {
	start := e.clk.Now()
	probe := false
	// A detached call is a running execution's (its final transition, or
	// the read that tells whether one landed): never refused.
	gate := gated(op) && !detached
	if b := e.breaker; b != nil && gate {
		var wait time.Duration
		var ok bool
		if probe, wait, ok = b.allow(start); !ok {
			return start, &breakerError{wait: wait}
		}
	}
	cctx.init(e.clk, ctx, start.Add(e.cfg.StoreTimeout), detached)
	err := f(cctx)
	cctx.release()
	failed := err != nil && !isAnswer(err)
	var now time.Time
	if _, nop := e.obs.(nopObserver); !nop || failed {
		// Only a failure (the breaker) and an observer use the end.
		now = e.clk.Now()
		e.obs.StoreCall(ctx, opNames[op], now.Sub(start), failed)
	}
	if b := e.breaker; b != nil && gate {
		r := resultOK
		switch {
		case failed && !detached && ctx.Err() != nil:
			r = resultNone // the caller left: nothing learnt about the store
		case failed:
			r = resultFailed
		}
		b.done(ctx, start, now, probe, r)
	}
	if err == nil || isAnswer(err) {
		return start, err
	}
	return start, fmt.Errorf("%w: %s: %w", ErrStore, op, err)
}

// isAnswer reports whether a store error is a definite answer about the
// record or the request (lease lost, not found, wrong state, parameters
// the store refuses) rather than a failure: retrying it cannot help.
func isAnswer(err error) bool {
	return errors.Is(err, store.ErrLeaseLost) || errors.Is(err, store.ErrNotFound) ||
		errors.Is(err, store.ErrStateConflict) || errors.Is(err, store.ErrInvalidParams) ||
		errors.Is(err, store.ErrOverCap)
}

// transient reports whether a failed final transition may succeed if tried
// again: a failure the store marks retryable, or the engine's own per-call
// timeout (final transitions are detached from the caller's context, so a
// deadline there is the store being slow).
func transient(err error) bool {
	return store.IsRetryable(err) || (errors.Is(err, context.DeadlineExceeded) && !isAnswer(err))
}

// observerOr returns o, or an Observer that reports nothing.
func observerOr(o Observer) Observer {
	if o == nil {
		return nopObserver{}
	}
	return o
}
