package idem

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/memory"
)

// lostEngine is an engine over a memory store on clk, logging to buf.
func lostEngine(t *testing.T, clk *fakeClock, buf *bytes.Buffer) (*Engine, store.Store) {
	t.Helper()
	s := memory.New(memory.Config{Clock: clk.Now})
	e, err := New(s, Config{Logger: slog.New(slog.NewTextHandler(buf, nil))})
	if err != nil {
		t.Fatal(err)
	}
	e.clk = clk
	return e, s
}

// The engine remembers at most lostMax reservations, and says once that
// it left one out.
func TestLostReservationsAreBounded(t *testing.T) {
	clk := &fakeClock{now: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)}
	var buf bytes.Buffer
	e, _ := lostEngine(t, clk, &buf)
	for i := range lostMax + 2 {
		e.remember(&store.ReserveParams{Scope: "s", Key: fmt.Sprint(i), Owner: 1}, clk.now, clk.now)
	}
	if n := e.lost.n.Load(); n != lostMax {
		t.Fatalf("%d remembered, want %d", n, lostMax)
	}
	if c := strings.Count(buf.String(), "too many reservations"); c != 1 {
		t.Fatalf("the warning was logged %d times, want once:\n%s", c, buf.String())
	}
}

// A reservation remembered for longer than lostAge is given up, with a
// warning, and left to its lease and policy; a younger one is read back.
func TestLostReservationsAreGivenUpAfterLostAge(t *testing.T) {
	clk := &fakeClock{now: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)}
	var buf bytes.Buffer
	e, s := lostEngine(t, clk, &buf)
	ctx := context.Background()
	for _, k := range []string{"old", "young"} {
		if _, err := s.Reserve(ctx, store.ReserveParams{Scope: "s", Key: k, Fingerprint: "f", Lease: 2 * lostAge, TTL: 3 * lostAge, LeasePolicy: store.LeaseUnknown, Owner: 7}); err != nil {
			t.Fatal(err)
		}
	}
	e.remember(&store.ReserveParams{Scope: "s", Key: "old", Owner: 7}, clk.now, clk.now)
	clk.now = clk.now.Add(lostAge / 2)
	e.remember(&store.ReserveParams{Scope: "s", Key: "young", Owner: 7}, clk.now, clk.now)
	clk.now = clk.now.Add(lostAge/2 + time.Second)
	e.lostTick(clk.now)
	e.lost.sweeps.Wait()
	if n := e.lost.n.Load(); n != 0 {
		t.Fatalf("%d still remembered", n)
	}
	for k, want := range map[string]store.State{"old": store.StateInProgress, "young": store.StateFailedRetryable} {
		if r, err := s.Get(ctx, "s", k); err != nil || r.State != want {
			t.Fatalf("%s: %s %v, want %s", k, r.State, err, want)
		}
	}
	if !strings.Contains(buf.String(), "gave up reading back") {
		t.Fatalf("no warning:\n%s", buf.String())
	}
}

// failingGets is a store whose reads fail, as one that is away.
type failingGets struct{ store.Store }

func (failingGets) Get(context.Context, string, string) (store.Record, error) {
	return store.Record{}, store.Retryable(errors.New("connection refused"))
}

// While the store keeps failing, each sweep waits twice as long as the
// one before it, from lostRetryMin up to lostRetryMax.
func TestLostReservationsSweepsBackOff(t *testing.T) {
	clk := &fakeClock{now: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)}
	var buf bytes.Buffer
	e, s := lostEngine(t, clk, &buf)
	e.store = failingGets{s}
	e.remember(&store.ReserveParams{Scope: "s", Key: "k", Owner: 1}, clk.now, clk.now)
	want := lostRetryMin
	for range 8 {
		clk.now = time.Unix(0, e.lost.due.Load())
		e.lostTick(clk.now)
		e.lost.sweeps.Wait()
		if got := time.Duration(e.lost.due.Load() - clk.now.UnixNano()); got != want {
			t.Fatalf("the next sweep after %v, want %v", got, want)
		}
		want = min(2*want, lostRetryMax)
	}
	if n := e.lost.n.Load(); n != 1 {
		t.Fatalf("%d remembered, want 1", n)
	}
}
