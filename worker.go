package idem

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/idem-go/idem/store"
)

// Defaults of WorkerConfig.
const (
	DefaultWorkerConcurrency = 4
	DefaultWorkerPoll        = 250 * time.Millisecond
)

// WorkerConfig configures a Worker.
type WorkerConfig struct {
	// Handler runs the stored requests. It gets a request rebuilt from what
	// was kept (method, target, kept headers, body) whose context carries
	// the Execution (FromContext), as a synchronous route's handler does;
	// its answer is stored under the ordinary response policy. Required.
	Handler http.Handler

	// Queue is the queue to claim from. Defaults to the engine's
	// AsyncQueue.
	Queue string

	// Concurrency is how many requests run at once. Defaults to 4.
	Concurrency int

	// Poll is the pause after finding the queue empty (or failing to
	// claim). Defaults to 250ms.
	Poll time.Duration
}

// Worker runs the asynchronous requests of a queue: it claims pending
// requests (each is claimed by exactly one worker across all instances
// sharing the store), runs Handler with each under a lease the engine
// renews, and records the outcome as a synchronous execution would (Keep,
// Release, Unknown; a panic marks the record unknown). A worker that dies
// while running a request leaves its lease to lapse: the record then
// follows its lease policy (the sweeper sends it to reconciliation under
// unknown; under retry or resume the client's next retry queues it again).
//
// Worker implements maintenance.Service (Start, Stop): give it to
// maintenance.Config.Services to run it with the other background
// services.
type Worker struct {
	e   *Engine
	cfg WorkerConfig

	mu     sync.Mutex
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// NewWorker returns a worker that runs the asynchronous requests accepted
// by engines over e's store, with e's settings (Lease, MaxResponseBytes,
// the response policy, Observer).
func (e *Engine) NewWorker(cfg WorkerConfig) (*Worker, error) {
	if _, why := store.AsQueue(e.store); why != "" {
		return nil, fmt.Errorf("idem: a Worker needs a store that keeps pending requests: %s", why)
	}
	if cfg.Handler == nil {
		return nil, errors.New("idem: WorkerConfig.Handler is required")
	}
	if cfg.Queue == "" {
		cfg.Queue = e.cfg.AsyncQueue
	}
	if cfg.Concurrency < 0 || cfg.Poll < 0 {
		return nil, errors.New("idem: WorkerConfig.Concurrency and Poll must not be negative")
	}
	if cfg.Concurrency == 0 {
		cfg.Concurrency = DefaultWorkerConcurrency
	}
	if cfg.Poll == 0 {
		cfg.Poll = DefaultWorkerPoll
	}
	if err := (&store.ClaimParams{Queue: cfg.Queue, Limit: 1, Lease: e.cfg.Lease}).Validate(); err != nil {
		return nil, fmt.Errorf("idem: WorkerConfig.Queue %q: %w", cfg.Queue, err)
	}
	return &Worker{e: e, cfg: cfg}, nil
}

// RunOnce claims up to Concurrency pending requests and runs them at once,
// returning when all are recorded. It returns how many it ran.
func (w *Worker) RunOnce(ctx context.Context) (int, error) {
	return w.runBatch(ctx, w.cfg.Concurrency)
}

func (w *Worker) runBatch(ctx context.Context, limit int) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	e := w.e
	var recs []store.Record
	// Not cut off by Stop: a claim cut off may still have been applied,
	// and its records, in progress under fences nobody would know, would
	// run nowhere until their leases lapsed. The store timeout still
	// bounds it, and the breaker still gates it.
	start, err := e.callAt(new(callCtx), context.WithoutCancel(ctx), opClaim, false, func(ctx context.Context) (err error) {
		recs, err = e.store.(store.Queue).Claim(ctx, store.ClaimParams{Queue: w.cfg.Queue, Limit: limit, Lease: e.cfg.Lease})
		return err
	})
	// A store that claims in several steps (a cluster's masters) returns
	// what it claimed with the failure of a step: those records are this
	// worker's to run.
	e.obs.Event(ctx, "async_claimed", int64(len(recs)))
	var wg sync.WaitGroup
	for _, r := range recs {
		wg.Go(func() { w.run(ctx, r, start) })
	}
	wg.Wait()
	return len(recs), err
}

// Start runs Concurrency loops that claim and run requests until ctx ends
// or Stop. Starting a running worker does nothing.
func (w *Worker) Start(ctx context.Context) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.cancel != nil {
		return nil
	}
	ctx, w.cancel = context.WithCancel(ctx)
	for range w.cfg.Concurrency {
		w.wg.Go(func() {
			for ctx.Err() == nil {
				n, err := w.runBatch(ctx, 1)
				if err != nil && ctx.Err() == nil {
					w.e.log.Error("idem: worker failed to claim", "queue", w.cfg.Queue, "err", err)
				}
				if n == 0 {
					select {
					case <-ctx.Done():
					case <-time.After(w.cfg.Poll):
					}
				}
			}
		})
	}
	return nil
}

// Stop cancels the running requests' context and waits for them to be
// recorded, or for ctx to end. A request cut off this way is recorded as
// its handler's answer says; a handler that gives up with a failure is
// recorded unknown, as for a client that left (see Result). A request
// claimed as the worker stops is not run: it goes back to the queue, for
// another worker to run, with a new AsyncWait to be claimed in.
func (w *Worker) Stop(ctx context.Context) error {
	w.mu.Lock()
	cancel := w.cancel
	w.cancel = nil
	w.mu.Unlock()
	if cancel == nil {
		return nil
	}
	cancel()
	done := make(chan struct{})
	go func() { w.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// run executes one claimed record.
func (w *Worker) run(ctx context.Context, rec store.Record, start time.Time) {
	e := w.e
	x := e.newExecution(nil, store.ReserveResult{Outcome: store.Created, Record: rec}, start)
	if ctx.Err() != nil {
		// Stopped before it started: run now, its handler would only see
		// its context ended, and its outcome would be recorded unknown.
		// It had no effect, so it goes back to the queue instead.
		w.requeue(ctx, x, rec)
		return
	}
	r, err := storedRequest(ctx, rec.Request)
	if err != nil {
		// It can never run: an answer, not a failure to retry.
		e.log.Error("idem: stored request cannot be run", "scope", rec.Scope, "key", rec.Key, "err", err)
		e.settle(ctx, x, &Result{Outcome: Keep, Response: store.Response{
			Status: http.StatusInternalServerError, Body: []byte("stored request cannot be run: " + err.Error()),
		}})
		return
	}
	h := &httpCall{w: discardWriter{h: http.Header{}}, r: r, next: w.cfg.Handler, e: e}
	defer func() {
		if p := recover(); p != nil {
			// execute marked the record unknown; one request's panic must
			// not end the worker.
			e.log.Error("idem: asynchronous handler panicked", "scope", rec.Scope, "key", rec.Key, "panic", p)
		}
	}()
	e.execute(ctx, x, h)
}

// storedRequest rebuilds the request a worker runs.
func storedRequest(ctx context.Context, p *store.PendingRequest) (*http.Request, error) {
	if p == nil {
		return nil, errors.New("the record keeps no request")
	}
	r, err := http.NewRequestWithContext(ctx, p.Method, p.Target, bytes.NewReader(p.Body))
	if err != nil {
		return nil, err
	}
	r.RequestURI = p.Target
	r.Header = http.Header(p.Header).Clone()
	if r.Header == nil {
		r.Header = http.Header{}
	}
	r.ContentLength = int64(len(p.Body))
	if len(p.Body) == 0 {
		r.Body = http.NoBody
	}
	return r, nil
}

// discardWriter is the client side of a worker's request: there is no
// client, the answer goes to the store only.
type discardWriter struct{ h http.Header }

func (d discardWriter) Header() http.Header       { return d.h }
func (discardWriter) Write(b []byte) (int, error) { return len(b), nil }
func (discardWriter) WriteHeader(int)             {}

// requeue returns a request claimed as the worker stopped, which never
// ran, to the queue: its record released, then made pending again with
// its stored request, as a client's retry would (ReservePending reclaims
// a released record). The client was told that the request was accepted:
// it must not have to send it again for it to run. Should the second step
// fail (the store is away, the process ends between the two), the record
// stays released, and a retry of the request queues it again.
func (w *Worker) requeue(ctx context.Context, x *Execution, rec store.Record) {
	e := w.e
	ctx = context.WithoutCancel(ctx)
	if err := x.release(ctx, "the worker stopped before running the request"); err != nil {
		e.log.Warn("idem: could not return a request claimed as the worker stopped to the queue",
			"scope", rec.Scope, "key", rec.Key, "err", err)
		return
	}
	if rec.Request == nil {
		return // a claim returns the request (store.Queue): nothing to queue without it
	}
	p := store.PendingParams{
		ReserveParams: store.ReserveParams{
			Scope: rec.Scope, Key: rec.Key, Fingerprint: rec.Fingerprint,
			Lease: e.cfg.AsyncWait, TTL: e.cfg.TTL, LeasePolicy: e.cfg.LeasePolicy,
			// No tenant or cap: the record keeps its tenant, and it was
			// admitted when it was accepted.
		},
		Request: *rec.Request,
	}
	var res store.ReserveResult
	err := e.call(ctx, opReserve, true, func(ctx context.Context) (err error) {
		res, err = e.store.(store.Queue).ReservePending(ctx, p)
		return err
	})
	if err != nil {
		e.log.Warn("idem: a request claimed as the worker stopped is released, not queued again; a retry of it queues it",
			"scope", rec.Scope, "key", rec.Key, "err", err)
		return
	}
	e.log.Info("idem: a request claimed as the worker stopped is queued again", "scope", rec.Scope, "key", rec.Key,
		"queue", rec.Request.Queue, "outcome", res.Outcome.String())
}
