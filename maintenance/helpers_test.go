package maintenance_test

import (
	"context"
	"errors"
	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/teststores"
	"github.com/idem-go/idem/maintenance"
	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/storetest"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// namedStore opens a fresh store with the given clock.
type namedStore = teststores.Named

// realStores are the stores the services are tested against: memory,
// SQLite and, when IDEM_TEST_POSTGRES_URL is set, PostgreSQL.
func realStores(t *testing.T) []namedStore { return teststores.All(t, false) }

// testClock is the time of a test: the stores read it through Now, the
// Maintainer also waits on it through After. In manual mode a wait ends
// only when Advance passes it, and every wait is announced on parked, so
// that a test knows when a loop sleeps and for how long. In auto mode
// (the default) a wait ends at once, without moving the clock, and is
// recorded in slept: passes run through their pauses.
type testClock struct {
	*storetest.Clock
	manual bool
	parked chan time.Duration

	mu     sync.Mutex
	slept  []time.Duration
	timers []testTimer
}

type testTimer struct {
	at time.Time
	c  chan time.Time
}

func newTestClock() *testClock {
	return &testClock{Clock: storetest.NewClock(), parked: make(chan time.Duration, 16)}
}

func (c *testClock) After(d time.Duration) <-chan time.Time {
	ch := make(chan time.Time, 1)
	c.mu.Lock()
	c.slept = append(c.slept, d)
	if !c.manual {
		c.mu.Unlock()
		ch <- c.Now()
		return ch
	}
	c.timers = append(c.timers, testTimer{at: c.Now().Add(d), c: ch})
	c.mu.Unlock()
	c.parked <- d
	return ch
}

// Advance moves the clock and ends the waits it passes.
func (c *testClock) Advance(d time.Duration) {
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

// pending counts the waits that have not ended.
func (c *testClock) pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}

// sleeps returns the waits so far and forgets them.
func (c *testClock) sleeps() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.slept
	c.slept = nil
	return s
}

// nextPark waits until a loop sleeps and returns for how long.
func (c *testClock) nextPark(t *testing.T) time.Duration {
	t.Helper()
	select {
	case d := <-c.parked:
		return d
	case <-time.After(10 * time.Second):
		t.Fatal("no loop went to sleep")
		return 0
	}
}

// maint is an engine and its background services over one real store and
// a test clock, in front of a handler that panics (so that its requests
// are left in progress) or answers 201.
type maint struct {
	t      *testing.T
	clock  *testClock
	store  store.Store
	engine *idem.Engine
	m      *maintenance.Maintainer
	calls  atomic.Int64
	h      http.Handler
}

func newMaint(t *testing.T, ns namedStore, cfg maintenance.Config, ecfg idem.Config) *maint {
	m := &maint{t: t, clock: newTestClock()}
	m.store = ns.Open(t, m.clock.Now)
	ecfg.Logger = slog.New(slog.DiscardHandler)
	e, err := idem.New(m.store, ecfg)
	if err != nil {
		t.Fatal(err)
	}
	m.engine = e
	m.m = m.maintainer(cfg)
	m.h = e.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.calls.Add(1)
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

// maintainer returns another Maintainer over m's store, its clock and its
// engine's TTL.
func (m *maint) maintainer(cfg maintenance.Config) *maintenance.Maintainer {
	m.t.Helper()
	cfg.TTL = m.engine.TTL()
	cfg.Clock = m.clock
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	mt, err := maintenance.New(m.store, cfg)
	if err != nil {
		m.t.Fatal(err)
	}
	return mt
}

func (m *maint) send(key string, crash bool) *httptest.ResponseRecorder {
	r := httptest.NewRequest("POST", "/v1/charges", strings.NewReader(`{}`))
	r.Header.Set("Idempotency-Key", key)
	if crash {
		r.Header.Set("X-Crash", "1")
	}
	w := httptest.NewRecorder()
	func() {
		defer func() { recover() }()
		m.h.ServeHTTP(w, r)
	}()
	return w
}

var scope = (&idem.Request{Method: "POST", Route: "/v1/charges"}).Scope()

func (m *maint) record(key string) (store.Record, error) {
	return m.store.Get(context.Background(), scope, key)
}

func (m *maint) state(key string) store.State {
	m.t.Helper()
	r, err := m.record(key)
	if errors.Is(err, store.ErrNotFound) {
		return ""
	}
	if err != nil {
		m.t.Fatal(err)
	}
	return r.State
}

// unknown leaves the keys unknown: their holders die, their leases expire,
// and a sweep moves them.
func (m *maint) unknown(keys ...string) {
	m.t.Helper()
	for _, k := range keys {
		m.send(k, true)
	}
	m.clock.Advance(time.Minute)
	if n, err := m.m.SweepOnce(context.Background()); err != nil || n != len(keys) {
		m.t.Fatalf("sweep: %d %v, want %d", n, err, len(keys))
	}
}
