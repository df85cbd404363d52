// Package idem is an idempotency-key engine for HTTP APIs.
//
// A client sends Idempotency-Key: "<uuid>" on a POST; idem makes every
// retry of that request produce its effect once and get the original
// response back, across concurrent duplicates, crashes, restarts and many
// server instances sharing one store.
//
// # Using the middleware
//
// Create one Engine over a store and wrap the handlers to protect:
//
//	st, _ := sqlite.Open(ctx, "idem.db", sqlite.Config{})
//	engine, _ := idem.New(st, idem.Config{
//		Tenant: func(r *http.Request) string { return accountFromAuth(r) },
//	})
//	mux.Handle("POST /v1/charges", engine.Middleware(charges))
//
// Put the middleware inside the mux so the route pattern (r.Pattern) scopes
// the keys; a key is shared by one tenant, one method and one route only.
//
// # What a client sees
//
// The first request with a key runs the handler. Its response is stored
// when it is a final answer (2xx, 3xx, 4xx except 408, 425 and 429) and
// replayed byte for byte, with Idempotent-Replayed: true, to every retry
// with the same request; 5xx and the transient 4xx release the key so that a
// retry runs again. A retry while the first is running gets 409 with
// Retry-After (202 with Config.InProgressStatus; under ProfileStripe 429
// lock_timeout, the answer Stripe's SDKs retry), or it waits and replays,
// with Config.Wait. The same key with a different request (another method,
// route, path, query or body) gets 422 (400 under ProfileStripe). If the
// store cannot be reached the handler does not run: 503 with Retry-After.
// Every refusal is a problem document whose type is documented in
// docs/problems.md.
//
// # Acknowledged means stored
//
// Every 2xx, 3xx or 4xx answer a client receives is the answer every later
// retry with its key replays. The engine holds a handler's answer until its
// record is stored, then sends it: a client that reads its answer and
// retries at once gets it replayed, never 409. A transient store failure
// while the outcome is recorded (completion, release, or marking it
// unknown) is retried with jittered backoff while the heartbeat keeps the
// lease. Should the lease lapse on the store's clock meanwhile (the store
// away longer than the lease, a stalled process), a sweeper or a
// duplicate moves the record to unknown under the default
// store.LeaseUnknown, keeping its fence; the execution, which holds that
// fence and knows its outcome, then settles the record itself with the
// same answer (store.Store.Resolve, as a reconciler would), so completions
// and releases are retried for one more Lease past the lapse. A record
// taken over under another lease policy (a new fence), deleted or settled
// by an operator first refuses that settlement. Only if the store stays
// unreachable that long does the engine give up: the client then still
// gets the answer it earned, and the record, never released, becomes
// unknown: retries get 409 outcome-unknown, never a different answer.
// This is logged and counted (idem.finish.failures); a settlement of the
// execution's own unknown record is logged and counted as
// idem.reconcile_resolved.
//
// Three kinds of answers are sent as they are written instead, and so may
// reach the client before they are stored: bodies larger than
// Config.MaxResponseBytes (not kept; replays say so), answers the handler
// flushes, and event streams (text/event-stream).
//
// # Crashes and uncertain outcomes
//
// Each execution holds a fenced lease that the engine renews while the
// handler runs (every Lease/3, sooner after a failed renewal). When a
// holder dies its lease expires, and by default (store.LeaseUnknown) the
// record becomes unknown: retries get 409 and the request is never run
// twice until reconciliation settles it (package maintenance runs it, with
// the sweeper and the reaper). Routes whose handlers are safe to re-run can
// choose store.LeaseRetry, and handlers written as atomic phases (package
// phase) store.LeaseResume, which continues from the last committed
// recovery point. A handler that cannot tell whether its effect happened (a
// payment gateway timed out) calls Execution.Uncertain; a panic does the
// same.
//
// # Transactions
//
// Handlers on SQL stores can commit their business write and the key's
// completion in one transaction: build the response, call the store's
// CompleteTx with Execution.CompleteParams inside the transaction, commit,
// call Execution.Committed, then write the response.
//
// # Other transports
//
// Engine.Run is the protocol itself, free of net/http: it takes a Call
// (tenant, method, route, target, raw key values, content) and a function
// that runs the operation, and returns an Answer saying what to send: the
// operation's answer, a replay, or a Problem. The middleware, Engine.Handle
// (for framework adapters that name the route themselves), the gRPC
// interceptor in package grpcidem and the idem proxy are thin translations
// around it; queue consumers can call it directly.
package idem
