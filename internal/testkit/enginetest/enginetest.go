// Package enginetest holds what tests of the engine and of the background
// services share, whichever module they live in: the stores they run on,
// stores that fail on demand, a test clock, a Maintainer harness and
// checks of problem answers. The tests over server stores live in the
// integration module (internal/integration), so that the core module
// depends on no database driver.
package enginetest

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/memory"
)

// Store opens a fresh store, private to its test, with the given clock
// (nil: its own).
type Store struct {
	Name string
	Open func(t *testing.T, clock store.Clock) store.Store
}

// Memory is the memory store.
var Memory = Store{"memory", func(t *testing.T, clock store.Clock) store.Store {
	return memory.New(memory.Config{Clock: clock})
}}

// ErrOutage is a dropped connection, as the stores report one.
var ErrOutage = store.Retryable(errors.New("connection refused"))

// Flaky injects failures into a real store: the next N calls of an
// operation fail as a dropped connection would, or every Reserve and Get
// while Down is set (an outage).
type Flaky struct {
	store.Store
	Down           atomic.Bool   // Reserve and Get fail while set
	Gate           chan struct{} // when not nil, Reserve waits until it is closed (a slow store)
	GetGate        chan struct{} // when not nil, Get waits until it is closed
	LoseReserves   atomic.Int64  // Reserves applied whose answer is then lost
	Reserves       atomic.Int64  // calls seen
	Gets           atomic.Int64
	FailGets       atomic.Int64 // Gets left to fail
	FailCompletes  atomic.Int64 // calls left to fail
	FailExtends    atomic.Int64
	ExtendsAlways  atomic.Bool
	FailReleases   atomic.Int64
	LoseAnswers    atomic.Int64 // Completes applied whose answer is then lost
	StallCompletes atomic.Int64 // Completes left that hang until their context ends (a store slower than the caller's timeout)
	Completes      atomic.Int64 // calls seen
	Extends        atomic.Int64
	Releases       atomic.Int64
}

// Reserve waits for Gate, then fails while Down is set; while
// LoseReserves lasts, it reserves, then fails as if the answer was lost.
func (f *Flaky) Reserve(ctx context.Context, p store.ReserveParams) (store.ReserveResult, error) {
	f.Reserves.Add(1)
	if f.Gate != nil {
		<-f.Gate
	}
	if f.Down.Load() {
		return store.ReserveResult{}, ErrOutage
	}
	res, err := f.Store.Reserve(ctx, p)
	if err == nil && takeFailure(&f.LoseReserves) {
		return store.ReserveResult{}, ErrOutage
	}
	return res, err
}

// Get waits for GetGate, then fails while Down is set or FailGets lasts.
func (f *Flaky) Get(ctx context.Context, scope, key string) (store.Record, error) {
	f.Gets.Add(1)
	if f.GetGate != nil {
		<-f.GetGate
	}
	if f.Down.Load() || f.FailGets.Add(-1) >= 0 {
		return store.Record{}, ErrOutage
	}
	return f.Store.Get(ctx, scope, key)
}

// Release fails while FailReleases lasts.
func (f *Flaky) Release(ctx context.Context, p store.ReleaseParams) error {
	f.Releases.Add(1)
	if takeFailure(&f.FailReleases) {
		return ErrOutage
	}
	return f.Store.Release(ctx, p)
}

// Complete hangs until its context ends while StallCompletes lasts, fails
// while FailCompletes lasts, then applies the completion but reports a
// failure while LoseAnswers lasts.
func (f *Flaky) Complete(ctx context.Context, p store.CompleteParams) error {
	f.Completes.Add(1)
	if takeFailure(&f.StallCompletes) {
		<-ctx.Done()
		return ctx.Err()
	}
	if takeFailure(&f.FailCompletes) {
		return ErrOutage
	}
	if takeFailure(&f.LoseAnswers) {
		if err := f.Store.Complete(ctx, p); err != nil {
			return err
		}
		return ErrOutage
	}
	return f.Store.Complete(ctx, p)
}

// Extend fails while FailExtends lasts, or always with ExtendsAlways.
func (f *Flaky) Extend(ctx context.Context, p store.ExtendParams) error {
	f.Extends.Add(1)
	if f.ExtendsAlways.Load() || takeFailure(&f.FailExtends) {
		return ErrOutage
	}
	return f.Store.Extend(ctx, p)
}

func takeFailure(n *atomic.Int64) bool {
	for {
		v := n.Load()
		if v <= 0 {
			return false
		}
		if n.CompareAndSwap(v, v-1) {
			return true
		}
	}
}

// Logs is a slog.Handler that keeps every record it is given, for tests of
// what is logged and how loudly. Safe for concurrent use.
type Logs struct {
	mu      sync.Mutex
	records []slog.Record
}

// Enabled reports true: every record is kept.
func (l *Logs) Enabled(context.Context, slog.Level) bool { return true }

// Handle keeps r.
func (l *Logs) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.records = append(l.records, r.Clone())
	return nil
}

// WithAttrs returns l.
func (l *Logs) WithAttrs([]slog.Attr) slog.Handler { return l }

// WithGroup returns l.
func (l *Logs) WithGroup(string) slog.Handler { return l }

// At returns the messages of the records logged at level, in order.
func (l *Logs) At(level slog.Level) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, r := range l.records {
		if r.Level == level {
			out = append(out, r.Message)
		}
	}
	return out
}

// Problem is an RFC 9457 problem document.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
}

// WantProblem fails t unless w is a problem answer with the status and the
// type idem.ProblemBase+slug.
func WantProblem(t *testing.T, w *httptest.ResponseRecorder, status int, slug string) Problem {
	t.Helper()
	if w.Code != status {
		t.Fatalf("status %d, want %d (body %s)", w.Code, status, w.Body)
	}
	if ct := w.Header().Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type %q, want application/problem+json", ct)
	}
	var p Problem
	if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
		t.Fatalf("problem body %q: %v", w.Body, err)
	}
	if p.Type != idem.ProblemBase+slug || p.Status != status || p.Title == "" {
		t.Fatalf("problem %+v, want type %s status %d", p, idem.ProblemBase+slug, status)
	}
	return p
}

// SendCharge sends h a keyed JSON POST /v1/payments.
func SendCharge(h http.Handler, key string) *httptest.ResponseRecorder {
	r := httptest.NewRequest("POST", "/v1/payments", strings.NewReader(`{"amount":100}`))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Idempotency-Key", key)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}
