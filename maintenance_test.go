package idem_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/storetest"
)

// maint is an engine with its background services over one real store and
// a manual clock, in front of a handler that panics (so that its requests
// are left in progress or unknown) or answers 201.
type maint struct {
	t      *testing.T
	clock  *storetest.Clock
	store  store.Store
	engine *idem.Engine
	m      *idem.Maintainer
	calls  atomic.Int64
	h      http.Handler
}

func newMaint(t *testing.T, ns namedStore, cfg idem.MaintenanceConfig, ecfg idem.Config) *maint {
	m := &maint{t: t, clock: storetest.NewClock()}
	m.store = ns.open(t, m.clock.Now)
	ecfg.Logger = slog.New(slog.DiscardHandler)
	e, err := idem.New(m.store, ecfg)
	if err != nil {
		t.Fatal(err)
	}
	m.engine = e
	m.m = e.Maintainer(cfg)
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

func (m *maint) state(key string) store.State {
	m.t.Helper()
	r, err := m.store.Get(context.Background(), (&idem.Request{Method: "POST", Route: "/v1/charges"}).Scope(), key)
	if errors.Is(err, store.ErrNotFound) {
		return ""
	}
	if err != nil {
		m.t.Fatal(err)
	}
	return r.State
}

func TestSweeper(t *testing.T) {
	for _, ns := range realStores(t) {
		t.Run(ns.name, func(t *testing.T) {
			t.Parallel()
			m := newMaint(t, ns, idem.MaintenanceConfig{BatchSize: 2}, idem.Config{})
			for _, k := range []string{"a", "b", "c"} {
				m.send(k, true)
			}
			if n, err := m.m.SweepOnce(context.Background()); err != nil || n != 0 {
				t.Fatalf("sweep inside the lease: %d %v", n, err)
			}
			m.clock.Advance(31 * time.Second)
			n, err := m.m.SweepOnce(context.Background())
			if err != nil || n != 3 {
				t.Fatalf("sweep after the lease: %d %v, want 3 (in batches of 2)", n, err)
			}
			for _, k := range []string{"a", "b", "c"} {
				if s := m.state(k); s != store.StateUnknown {
					t.Fatalf("%s after the sweep: %s", k, s)
				}
			}
			// A retry is told the outcome is unknown; the handler is not run.
			if w := m.send("a", false); w.Code != 409 {
				t.Fatalf("retry of a swept key: %d", w.Code)
			}
			if m.calls.Load() != 3 {
				t.Fatalf("handler ran %d times", m.calls.Load())
			}
		})
	}
}

func TestTwoSweepersResetEachRecordOnce(t *testing.T) {
	for _, ns := range realStores(t) {
		t.Run(ns.name, func(t *testing.T) {
			t.Parallel()
			m := newMaint(t, ns, idem.MaintenanceConfig{BatchSize: 3}, idem.Config{})
			for i := 0; i < 20; i++ {
				m.send("k"+string(rune('a'+i)), true)
			}
			m.clock.Advance(time.Minute)
			other := m.engine.Maintainer(idem.MaintenanceConfig{BatchSize: 3})
			var total atomic.Int64
			errc := make(chan error, 2)
			for _, s := range []*idem.Maintainer{m.m, other} {
				go func() {
					n, err := s.SweepOnce(context.Background())
					total.Add(int64(n))
					errc <- err
				}()
			}
			for i := 0; i < 2; i++ {
				if err := <-errc; err != nil {
					t.Fatal(err)
				}
			}
			if total.Load() != 20 {
				t.Fatalf("two sweepers reset %d records, want 20", total.Load())
			}
		})
	}
}

func TestReaper(t *testing.T) {
	for _, ns := range realStores(t) {
		t.Run(ns.name, func(t *testing.T) {
			t.Parallel()
			m := newMaint(t, ns, idem.MaintenanceConfig{BatchSize: 2}, idem.Config{TTL: time.Hour})
			for _, k := range []string{"done1", "done2", "done3"} {
				m.send(k, false)
			}
			m.send("stuck", true)
			m.clock.Advance(30 * time.Minute)
			m.send("young", false)
			if res, err := m.m.ReapOnce(context.Background()); err != nil || res.Deleted != 0 {
				t.Fatalf("reap before expiry: %+v %v", res, err)
			}
			m.clock.Advance(31 * time.Minute)
			res, err := m.m.ReapOnce(context.Background())
			if err != nil || res.Deleted != 3 || res.Abandoned != 1 {
				t.Fatalf("reap: %+v %v, want 3 deleted, 1 abandoned", res, err)
			}
			if s := m.state("done1"); s != "" {
				t.Fatalf("reaped record still there: %s", s)
			}
			if s := m.state("young"); s != store.StateCompleted {
				t.Fatalf("young record: %s", s)
			}
			// The abandoned request answers with a definite timeout.
			w := m.send("stuck", true)
			if w.Code != http.StatusGatewayTimeout || !strings.Contains(w.Body.String(), "abandoned") {
				t.Fatalf("retry of an abandoned request: %d %s", w.Code, w.Body)
			}
			// A reaped key is a new request again.
			if w := m.send("done1", false); w.Code != 201 || w.Header().Get("Idempotent-Replayed") != "" {
				t.Fatalf("reaped key: %d %v", w.Code, w.Header())
			}
		})
	}
}

func TestReaperSoftExpire(t *testing.T) {
	for _, ns := range realStores(t) {
		t.Run(ns.name, func(t *testing.T) {
			t.Parallel()
			m := newMaint(t, ns, idem.MaintenanceConfig{SoftExpire: true}, idem.Config{TTL: time.Hour})
			m.send("k", false)
			m.clock.Advance(2 * time.Hour)
			if res, err := m.m.ReapOnce(context.Background()); err != nil || res.Deleted != 1 {
				t.Fatalf("soft reap: %+v %v", res, err)
			}
			if s := m.state("k"); s != store.StateExpired {
				t.Fatalf("soft-expired record: %s", s)
			}
		})
	}
}

func TestReconciler(t *testing.T) {
	for _, ns := range realStores(t) {
		t.Run(ns.name, func(t *testing.T) {
			t.Parallel()
			// The "provider" knows that "paid" went through and "lost" did
			// not; it cannot tell about "pending" and fails for "broken".
			resolver := idem.ResolverFunc(func(ctx context.Context, r store.Record) (idem.Resolution, error) {
				switch r.Key {
				case "paid":
					return idem.Resolution{Outcome: idem.Happened, Response: &store.Response{
						Status: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"id":"ch_paid"}`)}}, nil
				case "lost":
					return idem.Resolution{Outcome: idem.DidNotHappen}, nil
				case "partial":
					return idem.Resolution{Outcome: idem.RunAgain}, nil
				case "broken":
					return idem.Resolution{}, errors.New("provider returned 500")
				}
				return idem.Resolution{Outcome: idem.StillUnknown}, nil
			})
			m := newMaint(t, ns, idem.MaintenanceConfig{Resolver: resolver, ReconcileBackoff: time.Minute,
				ReconcileMaxBackoff: 4 * time.Minute, MaxReconcileAttempts: 3}, idem.Config{})
			for _, k := range []string{"paid", "lost", "partial", "pending", "broken"} {
				m.send(k, true)
			}
			m.clock.Advance(time.Minute)
			if _, err := m.m.SweepOnce(context.Background()); err != nil {
				t.Fatal(err)
			}
			res, err := m.m.ReconcileOnce(context.Background())
			if err != nil || res.Resolved != 3 || res.Deferred != 2 {
				t.Fatalf("reconcile: %+v %v", res, err)
			}
			// Resolved: the retry replays the provider's answer, or runs again.
			if w := m.send("paid", false); w.Code != 201 || w.Body.String() != `{"id":"ch_paid"}` {
				t.Fatalf("retry of a resolved key: %d %s", w.Code, w.Body)
			}
			for _, k := range []string{"lost", "partial"} {
				if w := m.send(k, false); w.Code != 201 || w.Header().Get("Idempotent-Replayed") != "" {
					t.Fatalf("retry of %s after it was released: %d", k, w.Code)
				}
			}
			// Not due again until the backoff passed.
			if res, _ := m.m.ReconcileOnce(context.Background()); res.Deferred != 0 {
				t.Fatalf("reconciled before the backoff: %+v", res)
			}
			m.clock.Advance(time.Minute)
			if res, _ := m.m.ReconcileOnce(context.Background()); res.Deferred != 2 {
				t.Fatalf("second attempt: %+v", res)
			}
			m.clock.Advance(2 * time.Minute)
			res, _ = m.m.ReconcileOnce(context.Background())
			if res.DeadLettered != 2 {
				t.Fatalf("third attempt should dead-letter both: %+v", res)
			}
			m.clock.Advance(24 * time.Hour)
			if res, _ := m.m.ReconcileOnce(context.Background()); res != (idem.ReconcileResult{}) {
				t.Fatalf("dead letters were retried: %+v", res)
			}
			scope := (&idem.Request{Method: "POST", Route: "/v1/charges"}).Scope()
			for key, dead := range map[string]bool{"pending": true, "broken": true, "paid": false} {
				rec, err := m.store.Get(context.Background(), scope, key)
				if err != nil || idem.DeadLettered(rec) != dead {
					t.Fatalf("%s: DeadLettered = %v, want %v (%v)", key, idem.DeadLettered(rec), dead, err)
				}
			}
			// A webhook settles "broken": never replay a cookie or a
			// hop-by-hop header, whatever the caller passes.
			if err := m.m.Settle(context.Background(), scope, "broken", idem.Resolution{Outcome: idem.Happened, Response: &store.Response{
				Status: 201, Header: http.Header{"Set-Cookie": {"s=1"}, "Connection": {"close"}, "X-Id": {"7"}}, Body: []byte("{}")}}); err != nil {
				t.Fatal(err)
			}
			if w := m.send("broken", false); w.Code != 201 || w.Header().Get("Set-Cookie") != "" || w.Header().Get("Connection") != "" || w.Header().Get("X-Id") != "7" {
				t.Fatalf("replay of a settled record: %d %v", w.Code, w.Header())
			}
			// An operator settles a dead letter.
			if err := m.m.Settle(context.Background(), scope, "pending", idem.Resolution{Outcome: idem.DidNotHappen}); err != nil {
				t.Fatal(err)
			}
			if w := m.send("pending", false); w.Code != 201 {
				t.Fatalf("retry after the operator released it: %d", w.Code)
			}
			if err := m.m.Settle(context.Background(), scope, "pending", idem.Resolution{Outcome: idem.DidNotHappen}); !errors.Is(err, store.ErrStateConflict) {
				t.Fatalf("settling a completed record: %v", err)
			}
		})
	}
}

// service records its lifecycle; failStart makes Start fail.
type service struct {
	name      string
	failStart bool
	events    *[]string
}

func (s *service) Start(context.Context) error {
	*s.events = append(*s.events, "start "+s.name)
	if s.failStart {
		return errors.New("cannot start " + s.name)
	}
	return nil
}

func (s *service) Stop(context.Context) error {
	*s.events = append(*s.events, "stop "+s.name)
	return nil
}

func TestMaintainerStartStop(t *testing.T) {
	t.Parallel()
	ns := realStores(t)[0]
	var events []string
	cfg := idem.MaintenanceConfig{SweepInterval: time.Millisecond, ReapInterval: time.Millisecond,
		Services: []idem.Service{&service{name: "outbox", events: &events}}}
	m := newMaint(t, ns, cfg, idem.Config{})
	m.send("z", true)
	m.clock.Advance(time.Minute)
	if err := m.m.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for m.state("z") != store.StateUnknown {
		if time.Now().After(deadline) {
			t.Fatal("the running sweeper never swept")
		}
		time.Sleep(time.Millisecond)
	}
	if err := m.m.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := m.m.Stop(context.Background()); err != nil { // idempotent
		t.Fatal(err)
	}
	if strings.Join(events, ",") != "start outbox,stop outbox" {
		t.Fatalf("service lifecycle %v", events)
	}
	// A service that cannot start: the others are stopped again and
	// nothing runs.
	events = nil
	bad := m.engine.Maintainer(idem.MaintenanceConfig{Services: []idem.Service{
		&service{name: "a", events: &events}, &service{name: "b", failStart: true, events: &events}}})
	if err := bad.Start(context.Background()); err == nil {
		t.Fatal("Start succeeded with a failing service")
	}
	if strings.Join(events, ",") != "start a,start b,stop a" {
		t.Fatalf("lifecycle after a failed start %v", events)
	}
	if err := bad.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
}
