package idem

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem/store"
)

type ctxKey struct{}

// FromContext returns the Execution of the request being handled under an
// idempotency key, or nil when the request is not (an unprotected method,
// or no key on a route where it is optional).
func FromContext(ctx context.Context) *Execution {
	x, _ := ctx.Value(ctxKey{}).(*Execution)
	return x
}

// Execution is the right to run one request, held through a fenced lease
// that the engine renews while the request runs. Handlers reach it with
// FromContext to pass the key and the fence downstream, to checkpoint
// atomic phases, to declare an uncertain outcome, or to complete the key
// inside their own transaction. The engine records the outcome itself when
// the handler returns.
type Execution struct {
	e      *Engine
	scope  string
	key    string
	fence  int64
	point  string
	resume bool

	mu       sync.Mutex
	ending   bool // a final transition is under way; renewals go on
	finished bool // the heartbeat is stopped for good
	// heartbeat renews the lease once the first renewal fell due; until
	// then (nil) x waits in the engine's heartbeats, linked through prev
	// and next.
	heartbeat  timer
	prev, next *Execution
	leaseEnd   time.Time // when the lease lapses, by the engine's clock (an estimate from below)
	failures   int       // renewals failed in a row

	// call is what the summary of the request is made from should its
	// outcome become unknown (see summary): references to the call's own
	// target, header and body, no copy. Unset for a worker's execution,
	// whose record keeps the whole request.
	call callRef

	// declared is the outcome the handler declared (Uncertain,
	// NotExecuted), nil when none.
	declared  atomic.Pointer[declaration]
	lost      atomic.Bool
	committed atomic.Bool
	// expires is when the stored answer's record expires at the earliest
	// (UnixNano; 0 before the answer is stored): the TTL from the start of
	// the completion, which the store counts from a later instant.
	expires atomic.Int64

	// Storage that would otherwise be allocated per request: the context
	// of the final transition and the request context carrying x.
	endCtx callCtx
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

// newExecution sets up x (unused until now; nil allocates one) for a lease
// reserved at start, and queues its first renewal.
func (e *Engine) newExecution(x *Execution, res store.ReserveResult, start time.Time) *Execution {
	if x == nil {
		x = new(Execution)
	}
	x.e, x.scope, x.key, x.fence = e, res.Record.Scope, res.Record.Key, res.Record.Fence
	x.point, x.resume = res.Record.RecoveryPoint, res.Outcome == store.TakenOver
	x.leaseEnd = start.Add(e.cfg.Lease)
	e.beats.add(e.clk, x, e.cfg.Lease/3)
	return x
}

// startHeartbeat gives x, queued in the engine's heartbeats until its
// first renewal fell due, a timer of its own that renews the lease now
// and that renew then resets.
func (x *Execution) startHeartbeat(clk clock) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if !x.finished {
		x.heartbeat = clk.AfterFunc(0, x.renew)
	}
}

// Key returns the client's idempotency key.
func (x *Execution) Key() string { return x.key }

// Scope returns the record's scope (see Request.Scope).
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

// LeaseLost reports whether the execution may no longer hold its lease:
// a renewal found it taken, or no renewal succeeded for a whole Lease (the
// holder is cut off from the store, whose clock may have let the lease
// lapse, and another execution may hold the key). The handler should stop.
// Its outcome is then recorded only if the record went unknown under this
// execution's fence (swept after its lease lapsed on the store's clock),
// which the engine then settles, or is still in progress under it; a
// record taken over, deleted or settled refuses it.
func (x *Execution) LeaseLost() bool {
	return x.lost.Load() || x.e.clk.Until(x.leaseLapse()) <= 0
}

func (x *Execution) fenceParams() store.FenceParams {
	return store.FenceParams{Scope: x.scope, Key: x.key, Fence: x.fence}
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
func (x *Execution) Uncertain(reason string) { x.declared.Store(&declaration{reason: reason}) }

// NotExecuted declares that the operation had no effect at all (the
// request never left: a connection refused before anything was sent): the
// key is released for a retry whatever the response is, even one that
// Config.StoreServerErrors would keep. An Uncertain declaration, made
// before or after, wins over it.
func (x *Execution) NotExecuted(reason string) {
	x.declared.CompareAndSwap(nil, &declaration{reason: reason, notRun: true})
}

// declaration is an outcome the handler declared.
type declaration struct {
	reason string
	notRun bool // NotExecuted; else Uncertain
}

// CompleteParams returns the parameters for a store's CompleteTx with the
// response the handler is about to send, so the business write and the
// key's completion commit in one transaction. Call Committed after the
// commit succeeded, then send the same response.
func (x *Execution) CompleteParams(resp store.Response) store.CompleteParams {
	resp.Header = x.e.reuse.replayable(x.scope, resp.Header)
	x.stampExpiry()
	return store.CompleteParams{FenceParams: x.fenceParams(), Response: resp, TTL: x.e.cfg.TTL}
}

// Committed records that CompleteTx committed: the engine will not store
// the response again, and stops renewing the lease, which the completion
// ended (a renewal now would find it lost).
func (x *Execution) Committed() {
	x.committed.Store(true)
	x.finish()
}

// renew extends the lease and schedules the next renewal: Lease/3 after a
// success, sooner after a failure so that a short outage does not eat the
// lease. It goes on while a final transition is retried.
func (x *Execution) renew() {
	e := x.e
	start := e.clk.Now()
	ctx, end := e.obs.Step(context.Background(), x.step(StepExtend))
	err := e.call(ctx, opExtend, false, func(ctx context.Context) error {
		return e.store.Extend(ctx, store.ExtendParams{FenceParams: x.fenceParams(), Lease: e.cfg.Lease})
	})
	end(StepEnd{Fence: x.fence, Attempts: 1, Err: err})
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.finished {
		return
	}
	switch {
	case err == nil:
		x.failures = 0
		if end := start.Add(e.cfg.Lease); end.After(x.leaseEnd) {
			x.leaseEnd = end
		}
		x.heartbeat.Reset(e.cfg.Lease / 3)
	case errors.Is(err, store.ErrLeaseLost):
		x.lost.Store(true)
		if !x.ending {
			// A warning: the outcome is still recorded if a sweeper
			// moved the record to unknown under this fence (see end);
			// report logs an error if it cannot be.
			e.log.Warn("idem: lease lost while the handler ran (it lapsed on the store's clock); the outcome can still be recorded if the record went unknown under this execution's fence",
				"scope", x.scope, "key", x.key, "fence", x.fence)
		}
	case isAnswer(err):
		e.log.Error("idem: lease renewal refused", "scope", x.scope, "key", x.key, "fence", x.fence, "err", err)
	default:
		// Any other failure: keep trying, the lease outlives several.
		x.failures++
		e.log.Warn("idem: lease renewal failed; retrying", "scope", x.scope, "key", x.key, "attempt", x.failures, "err", err)
		x.heartbeat.Reset(x.renewRetry())
	}
}

// renewRetry is the pause after the n-th failed renewal in a row: a
// thirtieth of the lease, doubling, never more than the usual Lease/3.
func (x *Execution) renewRetry() time.Duration {
	lease := x.e.cfg.Lease
	d := lease / 30
	for i := 1; i < x.failures && d < lease/3; i++ {
		d *= 2
	}
	return jitter(min(d, lease/3))
}

func (x *Execution) leaseLapse() time.Time {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.leaseEnd
}

// complete stores the response for replay. Should the record have become
// unknown under this execution's fence meanwhile, the same answer settles
// it (see end).
func (x *Execution) complete(ctx context.Context, resp store.Response, streamed bool) error {
	x.stampExpiry()
	p := store.CompleteParams{FenceParams: x.fenceParams(), Response: resp, TTL: x.e.cfg.TTL}
	err := x.end(ctx, opComplete, store.StateCompleted, streamed, func(ctx context.Context) error {
		return x.e.store.Complete(ctx, p)
	}, func() store.ResolveParams {
		resp := p.Response // on the heap only when it is needed
		return store.ResolveParams{FenceParams: p.FenceParams, To: store.StateCompleted, Response: &resp, TTL: p.TTL}
	})
	if err != nil {
		x.expires.Store(0)
		return err
	}
	x.e.tenantSucceeded(ctx, x.scope, resp.Status)
	return nil
}

// release frees the key for another attempt. Should the record have
// become unknown under this execution's fence meanwhile, it is settled as
// failed_retryable, keeping its expiry as Release does (see end).
func (x *Execution) release(ctx context.Context, reason string) error {
	return x.end(ctx, opRelease, store.StateFailedRetryable, false, func(ctx context.Context) error {
		return x.e.store.Release(ctx, store.ReleaseParams{FenceParams: x.fenceParams(), Error: store.ErrorText(reason)})
	}, func() store.ResolveParams {
		return store.ResolveParams{FenceParams: x.fenceParams(), To: store.StateFailedRetryable}
	})
}

// markUnknown sends the record to reconciliation.
func (x *Execution) markUnknown(ctx context.Context, reason string) error {
	x.e.log.Warn("idem: outcome unknown", "scope", x.scope, "key", x.key, "fence", x.fence, "reason", reason)
	p := store.ReleaseParams{FenceParams: x.fenceParams(), Error: store.ErrorText(reason), Request: x.summary()}
	err := x.end(ctx, opMarkUnknown, store.StateUnknown, false, func(ctx context.Context) error {
		return x.e.store.MarkUnknown(ctx, p)
	}, nil)
	if err == nil {
		// Package maintenance counts those its sweeper sends, under the
		// same name.
		x.e.obs.Event(ctx, "reconcile_scheduled", 1)
	}
	return err
}

// Abandon stops renewing the lease and leaves the record as it is, as a
// crash would: the engine then records nothing for this execution, and the
// record's lease policy decides what a retry finds once the lease expired.
// For tests of crash recovery, and for handlers that hand the request to a
// process that will complete it in a transaction of its own.
func (x *Execution) Abandon() { x.finish() }

// step describes a step of x for its Observer. The route is read back from
// the scope rather than kept: an Execution is allocated per request.
func (x *Execution) step(name string) Step {
	_, _, route, _ := ParseScope(x.scope)
	return Step{Name: name, Store: x.e.sname, Scope: x.scope, Route: route, Fence: x.fence}
}

// finish stops the heartbeat for good.
func (x *Execution) finish() {
	x.mu.Lock()
	defer x.mu.Unlock()
	if !x.finished {
		x.finished = true
		if x.heartbeat != nil {
			x.heartbeat.Stop()
		} else {
			x.e.beats.remove(x)
		}
	}
}

var errFinished = errors.New("idem: execution already finished")

// landed reports whether the record is in state with this execution's
// fence, holding the response of own's settlement when it has one: a
// transition applied by an attempt whose answer was lost. The response
// tells this execution's completion from an operator's settlement of its
// unknown record.
//
// On a store that can show a write before it is durable (store.Syncer:
// PostgreSQL whose wait for a synchronous standby was cancelled), what
// the read found counts only once Sync confirmed it. unconfirmed, wrapping
// errUnconfirmed, says that the read or Sync failed: whether the
// transition landed durably is unknown.
func (x *Execution) landed(ctx context.Context, state store.State, own func() store.ResolveParams) (ok bool, unconfirmed error) {
	var r store.Record
	err := x.e.call(ctx, opGet, true, func(ctx context.Context) (err error) {
		r, err = x.e.store.Get(ctx, x.scope, x.key)
		return err
	})
	switch {
	case err != nil && !errors.Is(err, store.ErrNotFound):
		return false, fmt.Errorf("%w: %w", errUnconfirmed, err)
	case err != nil || r.State != state || r.Fence != x.fence:
		return false, nil
	}
	if own != nil {
		want, got := own().Response, r.Response
		if want != nil && (got == nil || got.Status != want.Status ||
			got.BodyOmitted != want.BodyOmitted || !bytes.Equal(got.Body, want.Body)) {
			return false, nil
		}
	}
	if s, ok := x.e.store.(store.Syncer); ok {
		if err := x.e.call(ctx, opSync, true, s.Sync); err != nil {
			return false, fmt.Errorf("%w: %w", errUnconfirmed, err)
		}
	}
	return true, nil
}

// errUnconfirmed: whether a transition whose answer was lost landed,
// durably (store.Syncer), could not be told.
var errUnconfirmed = errors.New("idem: could not confirm that the outcome is stored durably")

// Completion retries start at completionRetry and double up to a tenth of
// the lease (at most completionRetryMax).
const (
	completionRetry    = 10 * time.Millisecond
	completionRetryMax = time.Second
)

// end runs a final transition. It ignores the request's cancellation (a
// client that hung up must not stop the engine from recording what the
// handler did) and retries a transient store failure, with the heartbeat
// still renewing the lease. It never releases a record it could not
// complete: that could run the request twice.
//
// own (nil for MarkUnknown) returns the settlement that records the same
// outcome should the record have left in_progress under this execution:
// once its lease lapsed on the store's clock, a sweeper (or a duplicate's
// Reserve) under policy unknown moves it to unknown, keeping its fence, and
// the Complete or Release is refused. The execution that holds that fence
// and knows its outcome is the best evidence a reconciler could have, so it
// settles the record itself through Resolve, which the store applies only
// to an unknown record with this fence, in one atomic step: a record taken
// over (a new fence), deleted, or settled by an operator or a reconciler
// refuses it, and the outcome is not recorded, as before.
//
// Retries of a MarkUnknown end when the lease held now would lapse: the
// record becomes unknown then anyway. Those of an outcome go on for one more
// Lease past that, through Resolve once the record is unknown, so that a
// store away a little longer than the lease (a failover) still records the
// answer the client is getting; the client of an answer within
// MaxResponseBytes waits that long for it (acknowledged means stored), and
// gets it unrecorded only past that bound. Only then is the record left
// unknown for reconciliation.
func (x *Execution) end(ctx context.Context, op storeOp, what store.State, streamed bool, f func(context.Context) error, own func() store.ResolveParams) error {
	x.mu.Lock()
	if x.ending || x.finished {
		x.mu.Unlock()
		return errFinished
	}
	x.ending = true
	x.mu.Unlock()
	defer x.finish()

	e := x.e
	// The heartbeat goes on renewing the lease meanwhile (so nobody takes
	// the record over while we retry), but an outcome the store keeps
	// refusing must not hold the request for ever.
	deadline := x.leaseLapse()
	if own != nil {
		deadline = deadline.Add(e.cfg.Lease)
	}
	ctx, stepEnd := e.obs.Step(ctx, x.step(opNames[op]))
	err := e.callIn(&x.endCtx, ctx, op, true, f)
	r := retries{attempts: 1}
	defer func() { stepEnd(StepEnd{Fence: x.fence, Attempts: r.attempts, Err: err}) }()
	b := x.newBackoff(deadline)
	err = x.retry(ctx, op, f, own, &b, err, &r)
	for r.doubtful && (errors.Is(err, store.ErrLeaseLost) || errors.Is(err, store.ErrStateConflict)) {
		ok, unconfirmed := x.landed(ctx, what, own)
		if ok {
			// An earlier attempt was applied but its answer was lost.
			err, r.resolved = nil, false
			break
		}
		if unconfirmed == nil {
			break // the record moved on without this execution
		}
		// The store shows a write it cannot yet confirm durable, or could
		// not be read. A failover may be under way, after which the record
		// may be back in progress under this fence: the transition itself
		// is tried again, until the deadline.
		err = unconfirmed
		if !b.wait() {
			break
		}
		r.settling = false
		err = e.call(ctx, op, true, f)
		r.attempts++
		err = x.retry(ctx, op, f, own, &b, err, &r)
	}
	x.report(ctx, op, what, streamed, err, r)
	return err
}

// retries is what end's attempts came to.
type retries struct {
	attempts int
	doubtful bool // an attempt failed in a way that may have applied it
	settling bool // the record left in_progress: Resolve is tried instead
	resolved bool // Resolve recorded the outcome
}

// retry tries a final transition that failed with err again while it
// fails transiently and deadline allows, and turns to Resolve with own
// once the record left in_progress (see end).
func (x *Execution) retry(ctx context.Context, op storeOp, f func(context.Context) error, own func() store.ResolveParams, b *backoff, err error, r *retries) error {
	e := x.e
	var p store.ResolveParams
	settle := func(ctx context.Context) error { return e.store.Resolve(ctx, p) }
	try := func() error { // the transition, or Resolve once settling
		if !r.settling {
			return e.call(ctx, op, true, f)
		}
		err := e.call(ctx, opResolve, true, settle)
		r.resolved = err == nil
		return err
	}
	for {
		r.doubtful = r.doubtful || transient(err)
		lost := errors.Is(err, store.ErrLeaseLost) || (transient(err) && x.lost.Load())
		switch {
		case lost && own != nil && !r.settling:
			// The heartbeat's ErrLeaseLost or the store's refusal: the
			// record is no longer in_progress with this fence, and never
			// will be again. Whether it is unknown with it, only the
			// Resolve can tell, atomically.
			r.settling, p = true, own()
			err = try()
			r.attempts++
			continue
		case !transient(err) || (x.lost.Load() && !r.settling):
			return err
		}
		if !b.wait() {
			return err
		}
		err = try()
		r.attempts++
	}
}

// backoff spaces the attempts of a final transition: jittered pauses
// from completionRetry, doubling up to a tenth of the lease (at most
// completionRetryMax), none that would end past the deadline.
type backoff struct {
	clk           clock
	deadline      time.Time
	pause, maxGap time.Duration
}

func (x *Execution) newBackoff(deadline time.Time) backoff {
	e := x.e
	return backoff{clk: e.clk, deadline: deadline, pause: completionRetry,
		maxGap: min(completionRetryMax, max(e.cfg.Lease/10, completionRetry))}
}

// wait sleeps before the next attempt; false, without sleeping, when that
// attempt would come past the deadline.
func (b *backoff) wait() bool {
	d := jitter(b.pause)
	if !b.clk.Now().Add(d).Before(b.deadline) {
		return false
	}
	sleep(context.Background(), b.clk, d)
	b.pause = min(b.pause*2, b.maxGap)
	return true
}

// afterLapse says what becomes of a record whose lease lapses under
// policy p.
func afterLapse(p store.LeasePolicy) string {
	switch p {
	case store.LeaseRetry:
		return "the next retry after its lease expires runs the request again"
	case store.LeaseResume:
		return "the next retry after its lease expires resumes the request"
	}
	return "the record becomes unknown when its lease expires"
}

// report logs and counts how a final transition ended.
func (x *Execution) report(ctx context.Context, op storeOp, what store.State, streamed bool, err error, r retries) {
	e := x.e
	switch {
	case err == nil && r.resolved:
		e.obs.Event(ctx, "reconcile_resolved", 1)
		e.log.Warn("idem: outcome recorded by settling this execution's own unknown record: its lease had lapsed on the store's clock before the outcome reached the store",
			"scope", x.scope, "key", x.key, "fence", x.fence, "outcome", what, "attempts", r.attempts)
	case err == nil:
		if r.attempts > 1 {
			e.log.Info("idem: outcome recorded after retries", "scope", x.scope, "key", x.key, "outcome", what, "attempts", r.attempts)
		}
	case errors.Is(err, store.ErrLeaseLost), errors.Is(err, store.ErrNotFound), r.settling && errors.Is(err, store.ErrStateConflict):
		// Not a failure of the store: the record moved on without us
		// (taken over after a stall, deleted by an operator, or swept and
		// settled by a reconciler or an operator first). An answer (a
		// completion or a release) that even the settlement could not
		// record is an error: retries will not get what the client got.
		// A MarkUnknown has no answer to keep: the record is already
		// reconciliation's, another execution's, or gone.
		level := slog.LevelError
		if op == opMarkUnknown {
			level = slog.LevelWarn
		}
		e.obs.FinishFailed(ctx, opNames[op])
		e.log.Log(ctx, level, "idem: outcome not recorded: this execution no longer holds the record",
			"scope", x.scope, "key", x.key, "fence", x.fence, "outcome", what)
	case errors.Is(err, errUnconfirmed):
		// An attempt may have stored the outcome; whether it did, and
		// durably, is what the store could not tell.
		e.obs.FinishFailed(ctx, opNames[op])
		e.log.Error("idem: could not confirm that the outcome is stored durably: an attempt whose answer was lost may have "+
			"stored it, and a failover before the store's replica has it would lose it (see the store's documentation)",
			"scope", x.scope, "key", x.key, "fence", x.fence, "outcome", what, "attempts", r.attempts,
			"answer_already_sent", streamed, "err", err)
	case transient(err):
		e.obs.FinishFailed(ctx, opNames[op])
		e.log.Error("idem: could not record the outcome in time; "+afterLapse(e.cfg.LeasePolicy),
			"scope", x.scope, "key", x.key, "fence", x.fence, "outcome", what, "attempts", r.attempts,
			"answer_already_sent", streamed, "err", err)
	default:
		e.obs.FinishFailed(ctx, opNames[op])
		e.log.Error("idem: the store refused the outcome",
			"scope", x.scope, "key", x.key, "fence", x.fence, "outcome", what, "err", err)
	}
}
