package idem_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/testkit/enginetest"
	"github.com/idem-go/idem/internal/testkit/obstest"
	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/memory"
	"github.com/idem-go/idem/store/storetest"
)

const lateLease = 30 * time.Second

// late is an engine on the memory store whose handler answers only when
// told to, with the engine's clock and the store's stepped apart: moving
// the store's alone past the lease is a holder cut off long enough for
// another proxy's sweeper to see its lease lapsed.
type late struct {
	t           *testing.T
	engineClock *stepClock
	storeClock  *storetest.Clock
	mem         *memory.Store // what another proxy or an operator acts on
	s           *enginetest.Flaky
	e           *idem.Engine
	h           http.Handler
	obs         *obstest.Recorder
	logs        enginetest.Logs
	calls       atomic.Int64
	entered     chan int64
	answers     [3]chan reply // by call number, 1 and 2
}

type reply struct {
	status int
	body   string
}

func newLate(t *testing.T, policy store.LeasePolicy) *late {
	return newLateWith(t, idem.Config{LeasePolicy: policy})
}

// newLateWith makes a late with cfg, its engine over the memory store
// through an enginetest.Flaky, unless cfg.Async (a Flaky keeps no queue).
func newLateWith(t *testing.T, cfg idem.Config) *late {
	t.Helper()
	l := &late{t: t, engineClock: newStepClock(), storeClock: storetest.NewClock(), obs: &obstest.Recorder{}, entered: make(chan int64, 2)}
	for i := range l.answers {
		l.answers[i] = make(chan reply, 1)
	}
	l.mem = memory.New(memory.Config{Clock: l.storeClock.Now})
	l.s = &enginetest.Flaky{Store: l.mem}
	var s store.Store = l.s
	if cfg.Async {
		s = l.mem
	}
	cfg.Lease, cfg.Observer, cfg.Logger = lateLease, l.obs, slog.New(&l.logs)
	var err error
	if l.e, err = idem.New(s, cfg); err != nil {
		t.Fatal(err)
	}
	idem.SetClock(l.e, l.engineClock)
	l.h = l.e.Middleware(l.handler())
	return l
}

// handler tells entered its call number and answers what answers holds
// for it, once it does.
func (l *late) handler() http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		n := l.calls.Add(1)
		l.entered <- n
		a := <-l.answers[n]
		w.WriteHeader(a.status)
		io.WriteString(w, a.body)
	}
}

// start sends a keyed request in the background and waits until its
// handler (call number n) runs.
func (l *late) start(key string, n int64) <-chan *httptest.ResponseRecorder {
	l.t.Helper()
	done := make(chan *httptest.ResponseRecorder, 1)
	go func() { done <- sendKeyed(l.h, key) }()
	if got := <-l.entered; got != n {
		l.t.Fatalf("handler call %d entered, want %d", got, n)
	}
	return done
}

// sweep lets the lease lapse on the store's clock and runs a sweeper, as
// another proxy's would: the record becomes unknown, keeping its fence.
func (l *late) sweep(key string) store.Record {
	l.t.Helper()
	l.storeClock.Advance(lateLease + time.Second)
	swept, err := l.mem.SweepExpiredLeases(context.Background(), store.SweepParams{Limit: 10})
	if err != nil || len(swept) != 1 || swept[0].Key != key || swept[0].State != store.StateUnknown {
		l.t.Fatalf("sweep: %v %+v, want %s unknown", err, swept, key)
	}
	return swept[0]
}

func (l *late) get(key string) (store.Record, error) {
	return l.mem.Get(context.Background(), "0:POST /v1/slow", key)
}

// replayed fails unless a retry of key replays status and body.
func (l *late) replayed(key string, status int, body string) {
	l.t.Helper()
	w := sendKeyed(l.h, key)
	if w.Code != status || w.Body.String() != body || w.Header().Get("Idempotent-Replayed") != "true" {
		l.t.Fatalf("retry: %d %q replayed=%q, want %d %q replayed", w.Code, w.Body, w.Header().Get("Idempotent-Replayed"), status, body)
	}
}

// settle settles the swept record as an operator would, with 200
// "operator".
func (l *late) settle(swept store.Record) {
	l.t.Helper()
	op := store.Response{Status: http.StatusOK, Header: http.Header{}, Body: []byte("operator")}
	if err := l.mem.Resolve(context.Background(), store.ResolveParams{FenceParams: store.FenceParams{Scope: swept.Scope, Key: swept.Key, Fence: swept.Fence},
		To: store.StateCompleted, Response: &op}); err != nil {
		l.t.Fatal(err)
	}
}

// logged reports whether a record at level has a message containing part.
func (l *late) logged(level slog.Level, part string) bool {
	for _, m := range l.logs.At(level) {
		if strings.Contains(m, part) {
			return true
		}
	}
	return false
}

// A completion that reaches the store after a sweeper moved the record to
// unknown (its lease lapsed on the store's clock: the holder was cut off)
// still records the answer the client got: the execution holds the
// record's fence and settles its own unknown record, as a reconciler would.
func TestLateCompletionSettlesItsOwnUnknownRecord(t *testing.T) {
	t.Parallel()
	l := newLate(t, store.LeaseUnknown)
	done := l.start("k", 1)
	swept := l.sweep("k")
	l.answers[1] <- reply{http.StatusCreated, `{"id":"made"}`}
	if w := <-done; w.Code != http.StatusCreated || w.Body.String() != `{"id":"made"}` {
		t.Fatalf("answer: %d %q", w.Code, w.Body)
	}
	rec, err := l.get("k")
	if err != nil || rec.State != store.StateCompleted || rec.Fence != swept.Fence || rec.Response == nil ||
		string(rec.Response.Body) != `{"id":"made"}` || rec.LastError != "" {
		t.Fatalf("record: %v %+v, want completed with the answer under fence %d", err, rec, swept.Fence)
	}
	l.replayed("k", http.StatusCreated, `{"id":"made"}`)
	if n := l.calls.Load(); n != 1 {
		t.Fatalf("the handler ran %d times", n)
	}
	if !l.logged(slog.LevelWarn, "settling this execution's own unknown record") {
		t.Fatalf("no warning of the settlement: %q", l.logs.At(slog.LevelWarn))
	}
	if got := l.obs.Events()["reconcile_resolved"]; got != 1 {
		t.Fatalf("reconcile_resolved = %d, want 1", got)
	}
	if got := l.obs.FinishFailures(); len(got) != 0 {
		t.Fatalf("finish failures %v, want none", got)
	}
}

// A release that reaches the store after the sweep settles the record as
// failed_retryable: a retry runs the request again rather than getting
// "outcome unknown" for a failure certain to have had no effect.
func TestLateReleaseSettlesItsOwnUnknownRecord(t *testing.T) {
	t.Parallel()
	l := newLate(t, store.LeaseUnknown)
	done := l.start("k", 1)
	before := l.sweep("k")
	l.answers[1] <- reply{http.StatusServiceUnavailable, "busy"}
	if w := <-done; w.Code != http.StatusServiceUnavailable {
		t.Fatalf("answer: %d", w.Code)
	}
	rec, err := l.get("k")
	if err != nil || rec.State != store.StateFailedRetryable || rec.Fence != before.Fence || !rec.ExpiresAt.Equal(before.ExpiresAt) {
		t.Fatalf("record: %v %+v, want failed_retryable under fence %d, expiry kept", err, rec, before.Fence)
	}
	l.answers[2] <- reply{http.StatusCreated, "second"}
	if w := sendKeyed(l.h, "k"); w.Code != http.StatusCreated || w.Body.String() != "second" || l.calls.Load() != 2 {
		t.Fatalf("retry: %d %q after %d calls, want a second run", w.Code, w.Body, l.calls.Load())
	}
}

// Under policy retry a lapsed lease is taken over with a new fence: the
// first execution's late completion is refused, as fencing requires, and
// the record keeps the answer of the execution that holds it.
func TestLateCompletionOfARecordTakenOverIsRefused(t *testing.T) {
	t.Parallel()
	l := newLate(t, store.LeaseRetry)
	first := l.start("k", 1)
	l.storeClock.Advance(lateLease + time.Second)
	second := l.start("k", 2)
	l.answers[2] <- reply{http.StatusCreated, "second"}
	if w := <-second; w.Code != http.StatusCreated || w.Body.String() != "second" {
		t.Fatalf("takeover: %d %q", w.Code, w.Body)
	}
	taken, err := l.get("k")
	if err != nil {
		t.Fatal(err)
	}
	l.answers[1] <- reply{http.StatusCreated, "first"}
	<-first
	if rec, err := l.get("k"); err != nil || rec.Fence != taken.Fence || string(rec.Response.Body) != "second" {
		t.Fatalf("record after the first's late completion: %v %+v, want the second's answer", err, rec)
	}
	l.replayed("k", http.StatusCreated, "second")
	if !l.logged(slog.LevelError, "no longer holds the record") || l.obs.FinishFailures()["complete"] != 1 {
		t.Fatalf("the refused completion was not reported: %v %q", l.obs.FinishFailures(), l.logs.At(slog.LevelError))
	}
}

// A record an operator deleted after the sweep is not recreated by the
// late completion.
func TestLateCompletionOfADeletedRecordIsRefused(t *testing.T) {
	t.Parallel()
	l := newLate(t, store.LeaseUnknown)
	done := l.start("k", 1)
	l.sweep("k")
	if err := l.mem.Delete(context.Background(), store.DeleteParams{Scope: "0:POST /v1/slow", Key: "k"}); err != nil {
		t.Fatal(err)
	}
	l.answers[1] <- reply{http.StatusCreated, "made"}
	<-done
	if rec, err := l.get("k"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("after the late completion: %v %+v, want no record", err, rec)
	}
	if l.obs.FinishFailures()["complete"] != 1 {
		t.Fatalf("finish failures %v, want the completion's", l.obs.FinishFailures())
	}
}

// A record an operator settled after the sweep keeps the operator's
// answer: the late completion does not overwrite a settlement.
func TestLateCompletionOfARecordAnOperatorSettledIsRefused(t *testing.T) {
	t.Parallel()
	l := newLate(t, store.LeaseUnknown)
	done := l.start("k", 1)
	swept := l.sweep("k")
	l.settle(swept)
	l.answers[1] <- reply{http.StatusCreated, "made"}
	<-done
	l.replayed("k", http.StatusOK, "operator")
	if l.obs.FinishFailures()["complete"] != 1 || l.obs.Events()["reconcile_resolved"] != 0 {
		t.Fatalf("finish failures %v, events %v: want the completion refused", l.obs.FinishFailures(), l.obs.Events())
	}
}

// The heartbeat that finds the lease lost (it lapsed on the store's clock)
// warns: the execution may still record its outcome. An error is logged
// only when the answer cannot be recorded, the settlement refused too.
func TestLeaseLostLogsAnErrorOnlyWhenTheAnswerIsNotRecorded(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name     string
		policy   store.LeasePolicy
		cut      func(l *late) // what becomes of the record while the handler runs
		recorded bool
	}{
		{"swept", store.LeaseUnknown, func(l *late) { l.sweep("k") }, true},
		{"swept and settled by an operator", store.LeaseUnknown, func(l *late) { l.settle(l.sweep("k")) }, false},
		{"swept and deleted", store.LeaseUnknown, func(l *late) {
			l.sweep("k")
			if err := l.mem.Delete(context.Background(), store.DeleteParams{Scope: "0:POST /v1/slow", Key: "k"}); err != nil {
				l.t.Fatal(err)
			}
		}, false},
		{"taken over", store.LeaseRetry, func(l *late) {
			l.storeClock.Advance(lateLease + time.Second)
			second := l.start("k", 2)
			l.answers[2] <- reply{http.StatusCreated, "second"}
			<-second
		}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			l := newLate(t, c.policy)
			done := l.start("k", 1)
			c.cut(l)
			l.engineClock.Advance(lateLease / 3) // the heartbeat, whose renewal is refused
			if !l.logged(slog.LevelWarn, "lease lost while the handler ran") {
				t.Fatalf("no warning of the lost lease; warnings %q, errors %q", l.logs.At(slog.LevelWarn), l.logs.At(slog.LevelError))
			}
			l.answers[1] <- reply{http.StatusCreated, "first"}
			if w := <-done; w.Code != http.StatusCreated || w.Body.String() != "first" {
				t.Fatalf("answer: %d %q", w.Code, w.Body)
			}
			errs := l.logs.At(slog.LevelError)
			if c.recorded {
				if len(errs) != 0 || l.obs.Events()["reconcile_resolved"] != 1 {
					t.Fatalf("errors logged %q, events %v: want none, the answer recorded", errs, l.obs.Events())
				}
				l.replayed("k", http.StatusCreated, "first")
				return
			}
			if want := "idem: outcome not recorded: this execution no longer holds the record"; len(errs) != 1 || errs[0] != want ||
				l.obs.FinishFailures()["complete"] != 1 {
				t.Fatalf("errors logged %q, finish failures %v: want one, %q", errs, l.obs.FinishFailures(), want)
			}
		})
	}
}

// newLateWorker makes a late whose engine accepts requests asynchronously
// (202) and a worker that runs them with the late handler.
func newLateWorker(t *testing.T) (*late, *idem.Worker) {
	t.Helper()
	l := newLateWith(t, idem.Config{Async: true, LeasePolicy: store.LeaseUnknown})
	w, err := l.e.NewWorker(idem.WorkerConfig{Handler: l.handler(), Concurrency: 1})
	if err != nil {
		t.Fatal(err)
	}
	if got := sendKeyed(l.h, "k"); got.Code != http.StatusAccepted {
		t.Fatalf("accept: %d %s", got.Code, got.Body)
	}
	return l, w
}

// runOnce runs w once in the background and waits until its handler (call
// 1) runs; the channel gets RunOnce's error once the outcome is recorded.
func (l *late) runOnce(w *idem.Worker) <-chan error {
	l.t.Helper()
	ran := make(chan error, 1)
	go func() {
		n, err := w.RunOnce(context.Background())
		if err == nil && n != 1 {
			err = fmt.Errorf("RunOnce ran %d requests, want 1", n)
		}
		ran <- err
	}()
	if got := <-l.entered; got != 1 {
		l.t.Fatalf("handler call %d entered, want 1", got)
	}
	return ran
}

// A worker's completion that reaches the store after a sweeper moved the
// record to unknown settles it under the worker's fence, as a synchronous
// execution's does: the client's retry replays the worker's answer.
func TestLateWorkerCompletionSettlesItsOwnUnknownRecord(t *testing.T) {
	t.Parallel()
	l, w := newLateWorker(t)
	ran := l.runOnce(w)
	swept := l.sweep("k")
	l.answers[1] <- reply{http.StatusCreated, "made"}
	if err := <-ran; err != nil {
		t.Fatal(err)
	}
	rec, err := l.get("k")
	if err != nil || rec.State != store.StateCompleted || rec.Fence != swept.Fence || rec.Response == nil || string(rec.Response.Body) != "made" {
		t.Fatalf("record: %v %+v, want completed with the worker's answer under fence %d", err, rec, swept.Fence)
	}
	l.replayed("k", http.StatusCreated, "made")
	if n := l.calls.Load(); n != 1 {
		t.Fatalf("the handler ran %d times", n)
	}
	if l.obs.Events()["reconcile_resolved"] != 1 || len(l.obs.FinishFailures()) != 0 || len(l.logs.At(slog.LevelError)) != 0 {
		t.Fatalf("events %v, finish failures %v, errors logged %q: want the settlement counted and no failure",
			l.obs.Events(), l.obs.FinishFailures(), l.logs.At(slog.LevelError))
	}
}

// A record an operator settled after the sweep keeps the operator's
// answer: the worker's late completion does not overwrite it.
func TestLateWorkerCompletionOfARecordAnOperatorSettledIsRefused(t *testing.T) {
	t.Parallel()
	l, w := newLateWorker(t)
	ran := l.runOnce(w)
	l.settle(l.sweep("k"))
	l.answers[1] <- reply{http.StatusCreated, "made"}
	if err := <-ran; err != nil {
		t.Fatal(err)
	}
	l.replayed("k", http.StatusOK, "operator")
	if l.obs.FinishFailures()["complete"] != 1 || l.obs.Events()["reconcile_resolved"] != 0 || !l.logged(slog.LevelError, "no longer holds the record") {
		t.Fatalf("finish failures %v, events %v, errors logged %q: want the completion refused",
			l.obs.FinishFailures(), l.obs.Events(), l.logs.At(slog.LevelError))
	}
}

// The store is unreachable from before the completion until after the
// lease lapsed, and a sweeper moved the record to unknown meanwhile (a
// failover a little longer than the lease): the engine goes on trying past
// the lapse, settles its own record once the store is back, and only then
// sends the answer, so that the client's retry replays it.
func TestCompletionOutlastingTheLeaseSettlesItsOwnUnknownRecord(t *testing.T) {
	t.Parallel()
	l := newLate(t, store.LeaseUnknown)
	w := l.outlast(func(store.Record) {})
	if w.Code != http.StatusCreated || w.Body.String() != "made" {
		t.Fatalf("answer: %d %q", w.Code, w.Body)
	}
	if rec, err := l.get("k"); err != nil || rec.State != store.StateCompleted {
		t.Fatalf("record: %v %+v, want completed", err, rec)
	}
	l.replayed("k", http.StatusCreated, "made")
	if got := l.obs.Events()["reconcile_resolved"]; got != 1 {
		t.Fatalf("reconcile_resolved = %d, want 1", got)
	}
}

// As above, but an operator settled the unknown record before the store
// came back: after completion attempts whose effect was in doubt, the
// engine finds the record completed under its own fence, and still tells
// the operator's answer from its own.
func TestCompletionOutlastingTheLeaseKeepsAnOperatorsSettlement(t *testing.T) {
	t.Parallel()
	l := newLate(t, store.LeaseUnknown)
	l.outlast(l.settle)
	l.replayed("k", http.StatusOK, "operator")
	if l.obs.FinishFailures()["complete"] != 1 || !l.logged(slog.LevelError, "no longer holds the record") {
		t.Fatalf("finish failures %v: want the completion refused; errors logged %q", l.obs.FinishFailures(), l.logs.At(slog.LevelError))
	}
}

// outlast answers 201 "made" to a request on key k while the store fails
// every completion and renewal, steps the engine's clock past the lease,
// sweeps the record, runs then (an operator's act), brings the store back,
// and returns the client's answer.
func (l *late) outlast(then func(swept store.Record)) *httptest.ResponseRecorder {
	t := l.t
	t.Helper()
	l.s.ExtendsAlways.Store(true) // renewals fail too: the lease is not renewed
	l.s.FailCompletes.Store(1 << 30)
	t0 := l.engineClock.Now()
	done := l.start("k", 1)
	l.answers[1] <- reply{http.StatusCreated, "made"}
	// Each step waits until the engine is parked on its timers (the
	// heartbeat's and the completion's next attempt), or has answered.
	step := func() {
		waitFor(t, "the engine to wait on its timers", func() bool { return l.engineClock.pending() >= 2 || len(done) > 0 })
		l.engineClock.Advance(500 * time.Millisecond)
	}
	// Past the lapse by the engine's clock, the store still down.
	for l.engineClock.Now().Before(t0.Add(lateLease + 5*time.Second)) {
		step()
	}
	then(l.sweep("k"))
	l.s.FailCompletes.Store(0)
	for len(done) == 0 {
		if l.engineClock.Now().After(t0.Add(3 * lateLease)) {
			t.Fatalf("no answer %v after the start", l.engineClock.Now().Sub(t0))
		}
		step()
	}
	return <-done
}

// waitFor polls cond (a goroutine's progress) for up to a minute.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no %s after a minute", what)
		}
	}
}

// pending counts the timers set and not yet run.
func (c *stepClock) pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}
