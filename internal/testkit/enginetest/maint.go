package enginetest

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/maintenance"
	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/storetest"
)

// Clock is the time of a test: the stores read it through Now, the
// Maintainer also waits on it through After. In manual mode a wait ends
// only when Advance passes it, and every wait is announced on parked, so
// that a test knows when a loop sleeps and for how long. In auto mode
// (the default) a wait ends at once, without moving the clock, and is
// recorded in slept: passes run through their pauses.
type Clock struct {
	*storetest.Clock
	Manual bool // waits end only when Advance passes them
	parked chan time.Duration

	mu     sync.Mutex
	slept  []time.Duration
	timers []timer
}

type timer struct {
	at time.Time
	c  chan time.Time
}

// NewClock returns a clock in auto mode at a fixed instant.
func NewClock() *Clock {
	return &Clock{Clock: storetest.NewClock(), parked: make(chan time.Duration, 16)}
}

// After is a wait on the clock (see Clock).
func (c *Clock) After(d time.Duration) <-chan time.Time {
	ch := make(chan time.Time, 1)
	c.mu.Lock()
	c.slept = append(c.slept, d)
	if !c.Manual {
		c.mu.Unlock()
		ch <- c.Now()
		return ch
	}
	c.timers = append(c.timers, timer{at: c.Now().Add(d), c: ch})
	c.mu.Unlock()
	c.parked <- d
	return ch
}

// Advance moves the clock and ends the waits it passes.
func (c *Clock) Advance(d time.Duration) {
	c.Clock.Advance(d)
	now := c.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	kept := c.timers[:0]
	for _, tm := range c.timers {
		if tm.at.After(now) {
			kept = append(kept, tm)
		} else {
			tm.c <- now
		}
	}
	c.timers = kept
}

// Pending counts the waits that have not ended.
func (c *Clock) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}

// Sleeps returns the waits so far and forgets them.
func (c *Clock) Sleeps() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.slept
	c.slept = nil
	return s
}

// NextPark waits until a loop sleeps and returns for how long.
func (c *Clock) NextPark(t *testing.T) time.Duration {
	t.Helper()
	select {
	case d := <-c.parked:
		return d
	case <-time.After(10 * time.Second):
		t.Fatal("no loop went to sleep")
		return 0
	}
}

// Maint is an engine and its background services over one real store and
// a test clock, in front of a handler that panics (so that its requests
// are left in progress) or answers 201.
type Maint struct {
	T      *testing.T
	Clock  *Clock
	Store  store.Store
	Engine *idem.Engine
	M      *maintenance.Maintainer // the first Maintainer over Store
	Calls  atomic.Int64            // executions of the handler
	H      http.Handler            // the engine's middleware around the handler
}

// NewMaint opens a fresh ns and builds its engine and first Maintainer.
func NewMaint(t *testing.T, ns Store, cfg maintenance.Config, ecfg idem.Config) *Maint {
	m := &Maint{T: t, Clock: NewClock()}
	m.Store = ns.Open(t, m.Clock.Now)
	ecfg.Logger = slog.New(slog.DiscardHandler)
	e, err := idem.New(m.Store, ecfg)
	if err != nil {
		t.Fatal(err)
	}
	m.Engine = e
	m.M = m.Maintainer(cfg)
	m.H = e.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.Calls.Add(1)
		if r.Header.Get("X-Crash") != "" {
			// Simulate a holder that dies: the record stays in progress.
			idem.FromContext(r.Context()).Abandon()
			panic(http.ErrAbortHandler)
		}
		w.WriteHeader(201)
		io.WriteString(w, `{"ok":true}`)
	}))
	return m
}

// Maintainer returns another Maintainer over m's store, its clock and its
// engine's TTL.
func (m *Maint) Maintainer(cfg maintenance.Config) *maintenance.Maintainer {
	m.T.Helper()
	cfg.TTL = m.Engine.TTL()
	cfg.Clock = m.Clock
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	mt, err := maintenance.New(m.Store, cfg)
	if err != nil {
		m.T.Fatal(err)
	}
	return mt
}

// Send sends a keyed POST; with crash, its handler dies without an answer.
func (m *Maint) Send(key string, crash bool) *httptest.ResponseRecorder {
	r := httptest.NewRequest("POST", "/v1/charges", strings.NewReader(`{}`))
	r.Header.Set("Idempotency-Key", key)
	if crash {
		r.Header.Set("X-Crash", "1")
	}
	w := httptest.NewRecorder()
	func() {
		defer func() { recover() }()
		m.H.ServeHTTP(w, r)
	}()
	return w
}

// Scope is the scope of the records Send creates.
var Scope = (&idem.Request{Method: "POST", Route: "/v1/charges"}).Scope()

// Record reads key's record.
func (m *Maint) Record(key string) (store.Record, error) {
	return m.Store.Get(context.Background(), Scope, key)
}

// State is key's state, "" when it has no record.
func (m *Maint) State(key string) store.State {
	m.T.Helper()
	r, err := m.Record(key)
	if errors.Is(err, store.ErrNotFound) {
		return ""
	}
	if err != nil {
		m.T.Fatal(err)
	}
	return r.State
}

// Unknown leaves the keys unknown: their holders die, their leases expire,
// and a sweep moves them.
func (m *Maint) Unknown(keys ...string) {
	m.T.Helper()
	for _, k := range keys {
		m.Send(k, true)
	}
	m.Clock.Advance(time.Minute)
	if n, err := m.M.SweepOnce(context.Background()); err != nil || n != len(keys) {
		m.T.Fatalf("sweep: %d %v, want %d", n, err, len(keys))
	}
}

// ReconcileDue runs a pass and checks that it asked about the key exactly
// when it was due: not one microsecond (the stores' precision) before.
func (m *Maint) ReconcileDue(key string, want maintenance.ReconcileResult) {
	m.T.Helper()
	rec, err := m.Record(key)
	if err != nil {
		m.T.Fatal(err)
	}
	if wait := rec.ReconcileAfter.Sub(m.Clock.Now()); wait > 0 {
		m.Clock.Advance(wait - time.Microsecond)
		if res, err := m.M.ReconcileOnce(context.Background()); err != nil || res != (maintenance.ReconcileResult{}) {
			m.T.Fatalf("pass a microsecond before %s was due: %+v %v", key, res, err)
		}
		m.Clock.Advance(time.Microsecond)
	}
	if res, err := m.M.ReconcileOnce(context.Background()); err != nil || res != want {
		m.T.Fatalf("pass when %s was due: %+v %v, want %+v", key, res, err, want)
	}
}

// StillUnknown is a provider that can never tell.
var StillUnknown = maintenance.ResolverFunc(func(context.Context, store.Record) (maintenance.Resolution, error) {
	return maintenance.Resolution{Outcome: maintenance.StillUnknown}, nil
})
