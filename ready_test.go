package idem_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/testkit/enginetest"
	"github.com/idem-go/idem/store/memory"
)

// Ready fails while the store's reads fail, and while the circuit breaker
// is open even once the store answers again (until its interval passes);
// its public reason names nothing of the store's error.
func TestReadyFollowsTheStoreAndTheBreaker(t *testing.T) {
	t.Parallel()
	clk := newStepClock()
	st := &enginetest.Flaky{Store: memory.New(memory.Config{Clock: clk.Now})}
	e, err := idem.New(st, idem.Config{BreakerFailures: 2, BreakerOpen: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	idem.SetClock(e, clk)
	h := e.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) }))
	ctx := context.Background()
	if err := e.Ready(ctx); err != nil {
		t.Fatalf("Ready with a live store: %v", err)
	}

	st.Down.Store(true)
	err = e.Ready(ctx)
	var nr *idem.NotReady
	if !errors.As(err, &nr) || nr.Reason != idem.ReasonStoreFails || !errors.Is(err, enginetest.ErrOutage) {
		t.Fatalf("Ready with failing reads: %v, want %q wrapping the store's error", err, idem.ReasonStoreFails)
	}
	if got := idem.PublicReason(err); strings.Contains(got, enginetest.ErrOutage.Error()) {
		t.Fatalf("the public reason %q repeats the store's error", got)
	}
	for i := range 2 {
		if w := sendKeyed(h, "k"+string(rune('a'+i))); w.Code != http.StatusServiceUnavailable {
			t.Fatalf("request %d with the store down: %d", i, w.Code)
		}
	}

	// The store answers again, but the breaker is open for 2s: not ready,
	// and for that reason.
	st.Down.Store(false)
	if err := e.Ready(ctx); !errors.As(err, &nr) || nr.Reason != idem.ReasonBreakerOpen || !errors.Is(err, idem.ErrBreakerOpen) {
		t.Fatalf("Ready with the breaker open: %v, want %q", err, idem.ReasonBreakerOpen)
	}
	clk.Advance(2 * time.Second)
	if err := e.Ready(ctx); err != nil {
		t.Fatalf("Ready once the breaker's interval passed and the store answers: %v", err)
	}
	if w := sendKeyed(h, "kz"); w.Code != http.StatusCreated {
		t.Fatalf("the probe request: %d", w.Code)
	}
}

func TestPublicReason(t *testing.T) {
	t.Parallel()
	secret := errors.New("failed to connect to `user=alice database=payments`: 10.0.0.7:5432")
	for _, err := range []error{secret, &idem.NotReady{Reason: idem.ReasonStoreFails, Err: secret}} {
		if got := idem.PublicReason(err); strings.ContainsAny(got, "`=:") || strings.Contains(got, "alice") {
			t.Errorf("PublicReason(%v) = %q", err, got)
		}
	}
}

// RequireDurable needs a store that checks its durability: a store without
// one is refused at New and at With, not silently served.
func TestRequireDurableNeedsACheckingStore(t *testing.T) {
	t.Parallel()
	s := memory.New(memory.Config{})
	if _, err := idem.New(s, idem.Config{RequireDurable: true}); err == nil || !strings.Contains(err.Error(), "RequireDurable") {
		t.Errorf("New with RequireDurable on the memory store: %v", err)
	}
	e, err := idem.New(s, idem.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.With(func(c *idem.Config) { c.RequireDurable = true }); err == nil {
		t.Error("With(RequireDurable) on the memory store was accepted")
	}
	if _, ok := e.Durability(); ok {
		t.Error("Durability reports a check the memory store does not have")
	}
}
