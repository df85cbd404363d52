package idem

import (
	"bytes"
	"context"
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
