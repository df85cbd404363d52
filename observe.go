package idem

import (
	"context"
	"reflect"
	"strings"
	"time"
)

// Observer receives what the engine and the background services of package
// maintenance do, for metrics and traces. The core reports; the providers
// live in modules of their own (package otelidem turns the reports into
// OpenTelemetry metrics and spans), so an application that wants none pulls
// none of their dependencies.
//
// An Observer is called on the request path, from many goroutines at once:
// its methods must be safe for concurrent use, must not block, and should
// not allocate more than the telemetry they produce needs. A nil Observer
// in a Config reports nothing and costs nothing.
//
// The strings passed are from short fixed sets, listed on each method, so
// an implementation can build its attribute sets once.
type Observer interface {
	// Reserve reports the outcome of one call that entered the protocol:
	// created, replay, in_progress, key_reused, failed_retry, unknown,
	// taken_over, accepted (an asynchronous request recorded as pending),
	// store_error, rejected (a call refused before the store, such as a
	// malformed key), rate_limited or over_cap (a call refused by a tenant
	// limit, Config.TenantRate or Config.TenantMaxActive). An Observer that
	// also implements TenantObserver gets them per tenant.
	Reserve(ctx context.Context, outcome string)

	// StoreCall reports one store operation, op being one of reserve,
	// complete, release, mark_unknown, checkpoint, extend, get, claim,
	// resolve (the engine's and its Worker's: resolve settles an
	// execution's own record that became unknown before its outcome was
	// recorded) or sweep, reap, list_unknown, resolve, defer (the
	// maintenance services'); d is how long it took. failed is true when it
	// failed, not counting definite answers such as a lost lease, a record
	// in another state or parameters the store refuses.
	StoreCall(ctx context.Context, op string, d time.Duration, failed bool)

	// FinishFailed reports an outcome the engine could not record (op is
	// complete, release or mark_unknown): the key stays in progress until
	// its lease expires.
	FinishFailed(ctx context.Context, op string)

	// Event counts n occurrences of a named event of the record's life:
	// zombies_swept, ttl_pruned, abandoned, reconcile_scheduled,
	// reconcile_resolved, reconcile_failed, reconcile_raced (an attempt
	// the store refused to record because another reconciler, a webhook
	// or an operator recorded one first, or the request ran again: not a
	// failure, whatever the resolver answered), reconcile_dead,
	// async_claimed or pending_expired, of the store's circuit breaker:
	// breaker_opened, breaker_closed, and reservation_released (a
	// reservation whose answer was lost, released by the engine that made
	// it). The engine reports reconcile_scheduled, the breaker's,
	// reservation_released and reconcile_resolved for an execution that
	// settled its own record (swept to unknown while its completion was
	// under way), its Worker async_claimed; the maintenance services
	// report the others.
	Event(ctx context.Context, name string, n int64)

	// Step reports the start of a step of a protected call (see Step) and
	// returns the context the step runs in (one that carries a span, say)
	// and the function that reports its end, called exactly once. The
	// engine calls the end function even when the step failed.
	Step(ctx context.Context, s Step) (context.Context, func(StepEnd))
}

// The names of the steps reported to Observer.Step.
const (
	// StepReserve reserves the key, or finds the record that holds it.
	StepReserve = "reserve"
	// StepWait polls a record another request holds, in the
	// wait-then-replay mode (Config.Wait), until it leaves that state.
	StepWait = "wait"
	// StepReplay answers with the stored response.
	StepReplay = "replay"
	// StepComplete, StepRelease and StepMarkUnknown record the outcome of
	// the operation, retries included.
	StepComplete    = "complete"
	StepRelease     = "release"
	StepMarkUnknown = "mark_unknown"
	// StepExtend renews the lease while the operation runs (a heartbeat).
	StepExtend = "extend"
)

// Step describes a step of a protected call.
type Step struct {
	// Name is one of the Step constants.
	Name string
	// Store names the store: the package of its type (memory, postgres,
	// redis ...).
	Store string
	// Scope is the key's scope (tenant, method and route; see
	// Request.Scope) and Route the route alone.
	Scope, Route string
	// Fence is the fence of the execution that owns the record, known in
	// every step but reserve and wait (0 there).
	Fence int64
}

// StepEnd is how a step ended.
type StepEnd struct {
	// Outcome is the reservation's outcome (as in Observer.Reserve) for
	// reserve and wait steps; empty otherwise.
	Outcome string
	// Fence is the fence of the record the step ended with (the new
	// execution's after a reservation), 0 when unknown.
	Fence int64
	// Attempts is how many store calls the step made.
	Attempts int
	// Err is the step's failure, nil when it succeeded.
	Err error
}

// nopObserver is the Observer of a Config without one.
type nopObserver struct{}

func (nopObserver) Reserve(context.Context, string)                        {}
func (nopObserver) StoreCall(context.Context, string, time.Duration, bool) {}
func (nopObserver) FinishFailed(context.Context, string)                   {}
func (nopObserver) Event(context.Context, string, int64)                   {}
func (nopObserver) Step(ctx context.Context, _ Step) (context.Context, func(StepEnd)) {
	return ctx, nopEnd
}

func nopEnd(StepEnd) {}

// storeOp names a store operation in metrics and errors.
type storeOp int

const (
	opReserve storeOp = iota
	opComplete
	opRelease
	opMarkUnknown
	opCheckpoint
	opExtend
	opGet
	opClaim
	opCountActive
	opResolve
	opSync
	numOps
)

// opNames match those of package maintenance, whose store calls sit beside
// the engine's under the same op attribute.
var opNames = [numOps]string{"reserve", "complete", "release", "mark_unknown", "checkpoint", "extend", "get", "claim", "count_active", "resolve", "sync"}

func (o storeOp) String() string { return opNames[o] }

// StoreName names a store for Step.Store: the last element of the package
// path of its type ("memory" for *memory.Store).
func StoreName(s any) string {
	t := reflect.TypeOf(s)
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil {
		return ""
	}
	p := t.PkgPath()
	if p == "" {
		return t.String()
	}
	return p[strings.LastIndexByte(p, '/')+1:]
}
