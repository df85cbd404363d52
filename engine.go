package idem

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem/internal/fingerprint"
	"github.com/idem-go/idem/store"
)

// Engine runs the idempotency protocol over a store. It is safe for
// concurrent use; one Engine serves every route, and With derives engines
// with per-route settings that share the store and the metrics.
type Engine struct {
	store  store.Store
	cfg    settings
	hasher *fingerprint.Hasher
	log    *slog.Logger
	obs    *observer
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
	obs, err := newObserver(set.MeterProvider)
	if err != nil {
		return nil, err
	}
	return &Engine{store: s, cfg: set, hasher: fingerprint.New(set.Secret), log: set.Logger, obs: obs}, nil
}

// With returns an engine for a route that needs other settings (an optional
// key, selected fields, another lease policy ...). It shares e's store and
// metrics.
func (e *Engine) With(modify func(*Config)) (*Engine, error) {
	cfg := e.cfg.Config
	cfg.Methods = append([]string(nil), cfg.Methods...)
	cfg.Fields = append([]string(nil), cfg.Fields...)
	if e.cfg.Config.KeyRequired == nil {
		cfg.KeyRequired = Bool(e.cfg.keyRequired)
	}
	modify(&cfg)
	set, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	d := *e
	d.cfg = set
	d.hasher = fingerprint.New(set.Secret)
	d.log = set.Logger
	return &d, nil
}

// Store returns the engine's store.
func (e *Engine) Store() store.Store { return e.store }

// Config returns the engine's configuration with every default applied,
// for integrations that answer in other protocols.
func (e *Engine) Config() Config {
	c := e.cfg.Config
	c.KeyRequired = Bool(e.cfg.keyRequired)
	return c
}

// Request identifies one idempotent request for Begin.
type Request struct {
	// Tenant is the authenticated caller; Method and Route the operation.
	// Together they form the record's scope.
	Tenant string
	Method string
	Route  string
	// Key is the client's idempotency key (already validated).
	Key string
	// Fingerprint identifies the request's content; see Engine.Fingerprint.
	Fingerprint string
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

// Fingerprint hashes a request's content as the engine does: method, route
// and the canonical body (JCS for JSON, sorted pairs for forms, raw bytes
// otherwise), restricted to Config.Fields when set.
//
// An empty body is an empty body whatever its declared type: clients often
// label a body-less POST application/json.
func (e *Engine) Fingerprint(method, route, contentType string, body []byte) (string, error) {
	if len(body) == 0 {
		contentType = ""
	}
	return e.hasher.Sum(fingerprint.Input{Method: method, Route: route, ContentType: contentType, Body: body, Fields: e.cfg.Fields})
}

// Verdict is what Begin decided.
type Verdict int

const (
	// Execute: the caller holds the lease and must run the operation, then
	// Complete, Release or MarkUnknown the Execution.
	Execute Verdict = iota
	// Replay: the operation completed; answer with Record.Response.
	Replay
	// InProgress: another execution holds the lease; answer 409.
	InProgress
	// OutcomeUnknown: the operation may or may not have run; answer 409
	// until reconciliation settles it.
	OutcomeUnknown
	// Mismatch: the key was used for a different request; answer
	// Config.MismatchStatus.
	Mismatch
)

var verdictNames = [...]string{"execute", "replay", "in_progress", "unknown", "key_misuse"}

func (v Verdict) String() string {
	if int(v) < len(verdictNames) {
		return verdictNames[v]
	}
	return "invalid"
}

// Decision is the answer of Begin.
type Decision struct {
	Verdict Verdict
	// Record is the record as the store returned it.
	Record store.Record
	// Exec is set when Verdict is Execute.
	Exec *Execution
}

// ErrStore wraps every store failure the engine met; the engine fails
// closed on it (503 before the handler runs).
var ErrStore = errors.New("idem: store unavailable")

// Begin reserves the request's key and decides what to do. With Verdict
// Execute the caller owns an Execution whose lease is renewed in the
// background until it is finished.
func (e *Engine) Begin(ctx context.Context, req Request) (Decision, error) {
	scope := req.Scope()
	p := store.ReserveParams{
		Scope: scope, Key: req.Key, Fingerprint: req.Fingerprint,
		Lease: e.cfg.Lease, TTL: e.cfg.TTL, LeasePolicy: e.cfg.LeasePolicy,
	}
	var res store.ReserveResult
	err := e.call(ctx, opReserve, false, func(ctx context.Context) (err error) {
		res, err = e.store.Reserve(ctx, p)
		return err
	})
	if err != nil {
		e.obs.reserve(ctx, "store_error")
		return Decision{}, err
	}
	d := e.decide(req.Fingerprint, res)
	if d.Verdict == Execute {
		d.Exec = e.newExecution(res)
		switch res.Outcome {
		case store.Reclaimed:
			e.obs.reserve(ctx, "failed_retry")
		case store.TakenOver:
			e.obs.reserve(ctx, "taken_over")
			e.log.Warn("idem: took over an expired lease", "scope", scope, "key", req.Key,
				"fence", res.Record.Fence, "recovery_point", res.Record.RecoveryPoint)
		default:
			e.obs.reserve(ctx, "created")
		}
		return d, nil
	}
	e.obs.reserve(ctx, d.Verdict.String())
	if d.Verdict == OutcomeUnknown && res.Record.LastError == "lease_expired" && res.Record.ReconcileAttempts == 0 {
		e.log.Info("idem: record outcome unknown", "scope", scope, "key", req.Key, "reason", res.Record.LastError)
	}
	return d, nil
}

func (e *Engine) decide(fp string, res store.ReserveResult) Decision {
	if res.Outcome.Acquired() {
		return Decision{Verdict: Execute, Record: res.Record}
	}
	r := res.Record
	switch {
	case r.Fingerprint != fp:
		return Decision{Verdict: Mismatch, Record: r}
	case r.State == store.StateCompleted:
		return Decision{Verdict: Replay, Record: r}
	case r.State == store.StateUnknown:
		return Decision{Verdict: OutcomeUnknown, Record: r}
	}
	return Decision{Verdict: InProgress, Record: r}
}

// Await polls a record that is in progress until it leaves that state or
// wait elapses, for the wait-then-replay mode. It returns the last decision.
func (e *Engine) Await(ctx context.Context, req Request, wait time.Duration) (Decision, error) {
	deadline := time.Now().Add(wait)
	pause := 5 * time.Millisecond
	scope := req.Scope()
	for {
		var r store.Record
		err := e.call(ctx, opGet, false, func(ctx context.Context) (err error) {
			r, err = e.store.Get(ctx, scope, req.Key)
			return err
		})
		switch {
		case errors.Is(err, store.ErrNotFound):
			// Deleted by an operator while we waited: start over.
			return e.Begin(ctx, req)
		case err != nil:
			return Decision{}, err
		}
		if r.State != store.StateInProgress || r.LeaseExpired(time.Now()) {
			// Settled, or its holder died: Begin applies the store's rules
			// (replay, reclaim, takeover or unknown) atomically.
			return e.Begin(ctx, req)
		}
		if !time.Now().Add(pause).Before(deadline) {
			return e.decide(req.Fingerprint, store.ReserveResult{Record: r}), nil
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return Decision{}, ctx.Err()
		case <-t.C:
		}
		pause = min(pause*2, 250*time.Millisecond)
	}
}

// call runs one store operation under the store timeout, measuring it and
// wrapping its failure in ErrStore. Lease and state conflicts are answers,
// not failures, and pass through unwrapped. A detached call ignores the
// cancellation of ctx (but keeps its values).
func (e *Engine) call(ctx context.Context, op storeOp, detached bool, f func(context.Context) error) error {
	return e.callIn(new(callCtx), ctx, op, detached, f)
}

// callIn is call with the caller providing the (zero) callCtx, so that an
// Execution's final transition needs no allocation of its own.
func (e *Engine) callIn(cctx *callCtx, ctx context.Context, op storeOp, detached bool, f func(context.Context) error) error {
	start := time.Now()
	cctx.init(ctx, start.Add(e.cfg.StoreTimeout), detached)
	err := f(cctx)
	cctx.release()
	e.obs.storeOp(ctx, op, time.Since(start), err)
	if err == nil || isAnswer(err) {
		return err
	}
	return fmt.Errorf("%w: %s: %w", ErrStore, op, err)
}

// isAnswer reports whether a store error is a definite answer about the
// record (lease lost, not found, wrong state) rather than a failure.
func isAnswer(err error) bool {
	return errors.Is(err, store.ErrLeaseLost) || errors.Is(err, store.ErrNotFound) ||
		errors.Is(err, store.ErrStateConflict)
}

// Execution is the right to run one request, held through a fenced lease.
// Handlers reach it with FromContext to pass the fence downstream, to
// checkpoint atomic phases, to declare an uncertain outcome, or to complete
// the key inside their own transaction.
type Execution struct {
	e      *Engine
	scope  string
	key    string
	fence  int64
	point  string
	resume bool

	mu        sync.Mutex
	finished  bool
	heartbeat *time.Timer
	lost      atomic.Bool

	uncertain atomic.Pointer[string]
	committed atomic.Bool

	// Storage that would otherwise be allocated per request: the context
	// of the final transition and the middleware's response recorder.
	endCtx callCtx
	rec    recorder
	reqCtx execCtx
}

// execCtx is a request context carrying its Execution, embedded in the
// Execution so that attaching it costs no allocation.
type execCtx struct {
	context.Context
	x *Execution
}

func (c *execCtx) Value(key any) any {
	if key == (ctxKey{}) {
		return c.x
	}
	return c.Context.Value(key)
}

// attach returns ctx carrying x.
func (x *Execution) attach(ctx context.Context) context.Context {
	x.reqCtx = execCtx{Context: ctx, x: x}
	return &x.reqCtx
}

func (e *Engine) newExecution(res store.ReserveResult) *Execution {
	x := &Execution{
		e: e, scope: res.Record.Scope, key: res.Record.Key, fence: res.Record.Fence,
		point: res.Record.RecoveryPoint, resume: res.Outcome == store.TakenOver,
	}
	x.mu.Lock()
	x.heartbeat = time.AfterFunc(e.cfg.Lease/3, x.renew)
	x.mu.Unlock()
	return x
}

// Key returns the client's idempotency key.
func (x *Execution) Key() string { return x.key }

// Scope returns the record's scope.
func (x *Execution) Scope() string { return x.scope }

// Fence returns the lease token: it grows at every takeover, so a
// downstream system that remembers the highest fence it saw can refuse a
// zombie holder's late writes.
func (x *Execution) Fence() int64 { return x.fence }

// RecoveryPoint returns the last committed phase ("" before the first). A
// handler resuming after a takeover starts from here.
func (x *Execution) RecoveryPoint() string { return x.point }

// Resumed reports whether this execution took over a dead holder's lease.
func (x *Execution) Resumed() bool { return x.resume }

// LeaseLost reports whether a renewal found the lease taken: the handler
// should stop, its completion will be refused.
func (x *Execution) LeaseLost() bool { return x.lost.Load() }

func (x *Execution) fenceParams() store.FenceParams {
	return store.FenceParams{Scope: x.scope, Key: x.key, Fence: x.fence}
}

// renew extends the lease and schedules the next renewal.
func (x *Execution) renew() {
	e := x.e
	err := e.call(context.Background(), opExtend, false, func(ctx context.Context) error {
		return e.store.Extend(ctx, store.ExtendParams{FenceParams: x.fenceParams(), Lease: e.cfg.Lease})
	})
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.finished {
		return
	}
	switch {
	case errors.Is(err, store.ErrLeaseLost):
		x.lost.Store(true)
		e.log.Error("idem: lease lost while the handler ran", "scope", x.scope, "key", x.key, "fence", x.fence)
		return
	case err != nil:
		// Keep trying: the lease outlives several failed renewals.
		e.log.Warn("idem: lease renewal failed", "scope", x.scope, "key", x.key, "err", err)
	}
	x.heartbeat.Reset(e.cfg.Lease / 3)
}

// finish stops the heartbeat once; it reports false if already finished.
func (x *Execution) finish() bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.finished {
		return false
	}
	x.finished = true
	x.heartbeat.Stop()
	return true
}

// Checkpoint commits a recovery point outside any transaction. SQL stores
// offer CheckpointTx to commit it with the phase's own writes.
func (x *Execution) Checkpoint(ctx context.Context, point string) error {
	err := x.e.call(ctx, opCheckpoint, true, func(ctx context.Context) error {
		return x.e.store.Checkpoint(ctx, x.CheckpointParams(point))
	})
	if err == nil {
		x.point = point
	}
	return err
}

// CheckpointParams returns the parameters for a store's CheckpointTx, so a
// phase's writes and its recovery point commit together.
func (x *Execution) CheckpointParams(point string) store.CheckpointParams {
	return store.CheckpointParams{FenceParams: x.fenceParams(), RecoveryPoint: point}
}

// Checkpointed records that a CheckpointTx committed point.
func (x *Execution) Checkpointed(point string) { x.point = point }

// Uncertain declares that the operation may have had effects that cannot
// be confirmed (a payment gateway timed out, a commit's outcome was lost):
// the record goes to unknown for reconciliation whatever the response.
func (x *Execution) Uncertain(reason string) { x.uncertain.Store(&reason) }

// CompleteParams returns the parameters for a store's CompleteTx with the
// response the handler is about to send, so the business write and the
// key's completion commit in one transaction. Call Committed after the
// commit succeeded.
func (x *Execution) CompleteParams(resp store.Response) store.CompleteParams {
	resp.Header = replayableHeader(resp.Header)
	return store.CompleteParams{FenceParams: x.fenceParams(), Response: resp, TTL: x.e.cfg.TTL}
}

// Committed records that CompleteTx committed: the engine will not store
// the response again.
func (x *Execution) Committed() { x.committed.Store(true) }

// FinishDeclared finishes the execution as its handler declared, if it
// did: after Committed it only stops the heartbeat (the handler's
// transaction completed the record); after Uncertain it marks the record
// unknown. It reports whether it finished the execution; integrations
// (the middleware, RPC interceptors, queue consumers) call it first and
// apply their response policy only when it returns false.
func (x *Execution) FinishDeclared(ctx context.Context) bool {
	if x.committed.Load() {
		x.Abandon()
		return true
	}
	if r := x.uncertain.Load(); r != nil {
		x.MarkUnknown(ctx, *r)
		return true
	}
	return false
}

// Complete stores the response for replay.
func (x *Execution) Complete(ctx context.Context, resp store.Response) error {
	if !x.finish() {
		return errFinished
	}
	return x.end(ctx, opComplete, "completed", func(ctx context.Context) error {
		return x.e.store.Complete(ctx, store.CompleteParams{FenceParams: x.fenceParams(), Response: resp, TTL: x.e.cfg.TTL})
	})
}

// Release frees the key for another attempt: only for failures certain to
// have had no effect.
func (x *Execution) Release(ctx context.Context, reason string) error {
	if !x.finish() {
		return errFinished
	}
	return x.end(ctx, opRelease, "released", func(ctx context.Context) error {
		return x.e.store.Release(ctx, store.ReleaseParams{FenceParams: x.fenceParams(), Error: reason})
	})
}

// MarkUnknown sends the record to reconciliation.
func (x *Execution) MarkUnknown(ctx context.Context, reason string) error {
	if !x.finish() {
		return errFinished
	}
	x.e.log.Warn("idem: outcome unknown", "scope", x.scope, "key", x.key, "fence", x.fence, "reason", reason)
	err := x.end(ctx, opMarkUnknown, "unknown", func(ctx context.Context) error {
		return x.e.store.MarkUnknown(ctx, store.ReleaseParams{FenceParams: x.fenceParams(), Error: reason})
	})
	if err == nil {
		x.e.obs.count(ctx, "reconcile_scheduled", 1)
	}
	return err
}

// Abandon stops the heartbeat without touching the record (its completion
// was committed elsewhere, or the record must be left to expire).
func (x *Execution) Abandon() { x.finish() }

var errFinished = errors.New("idem: execution already finished")

// end runs a final transition. It ignores the request's cancellation: a
// client that hung up must not stop the engine from recording what the
// handler did.
func (x *Execution) end(ctx context.Context, op storeOp, what string, f func(context.Context) error) error {
	err := x.e.callIn(&x.endCtx, ctx, op, true, f)
	switch {
	case errors.Is(err, store.ErrLeaseLost):
		// Not a failure of the store: the record moved on without us
		// (completed by the handler's transaction, taken over after a
		// stall, swept, or deleted by an operator).
		x.e.obs.finishFailed(ctx, op)
		x.e.log.Warn("idem: outcome not recorded: this execution no longer holds the record",
			"scope", x.scope, "key", x.key, "fence", x.fence, "outcome", what)
	case err != nil:
		x.e.obs.finishFailed(ctx, op)
		x.e.log.Error("idem: could not record the outcome; the key stays in progress until its lease expires",
			"scope", x.scope, "key", x.key, "fence", x.fence, "outcome", what, "err", err)
	}
	return err
}
