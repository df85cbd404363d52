package idem

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/memory"
)

// The admission layer around one reservation: what admit takes, admitted
// settles (tokens back for a call that created nothing, a created record
// counted against the store bound), and the refusals each side answers.
func TestAdmissionAroundTheReservation(t *testing.T) {
	ctx := context.Background()
	e, err := New(memory.New(memory.Config{}), Config{TenantRate: 0.001, TenantBurst: 1, StoreMaxActive: 1,
		StoreActiveRecount: time.Hour, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	id := func(tenant, key string) *callID {
		return &callID{tenant: tenant, route: "/r", scope: (&Request{Tenant: tenant, Method: "POST", Route: "/r"}).Scope(), key: key}
	}
	a := id("t", "k1")
	tk, refused := e.admit(ctx, a)
	if refused != nil || !tk.charged {
		t.Fatalf("first admission: %+v %+v", tk, refused)
	}
	// Nothing created (a replay, say): the token comes back.
	if r := e.admitted(ctx, tk, a, decision{verdict: Replayed}, nil); r != nil {
		t.Fatalf("admitted after a replay: %+v", r)
	}
	if tk, refused = e.admit(ctx, a); refused != nil || !tk.charged {
		t.Fatalf("admission with the token given back: %+v %+v", tk, refused)
	}
	// Created: the token is spent and the record counts against the bound.
	if r := e.admitted(ctx, tk, a, decision{verdict: Executed, created: true}, nil); r != nil {
		t.Fatalf("admitted after a creation: %+v", r)
	}
	_, refused = e.admit(ctx, id("t", "k2"))
	if refused == nil || refused.Verdict != Limited || refused.Problem.Slug != SlugRateLimited {
		t.Fatalf("the tenant's second new key: %+v, want tenant-rate-limited", refused)
	}
	_, refused = e.admit(ctx, id("other", "k2"))
	if refused == nil || refused.Problem.Status != http.StatusServiceUnavailable || refused.Problem.Slug != SlugOverCapacity {
		t.Fatalf("another tenant at the store bound: %+v, want 503 over-capacity", refused)
	}
	if want := "the store holds 1 request waiting for a worker, in progress or awaiting reconciliation"; refused.Problem.Detail != want {
		t.Fatalf("over-capacity detail %q, want %q", refused.Problem.Detail, want)
	}
	// After the reservation: the cap the store counted, the breaker open.
	if r := e.admitted(ctx, ticket{}, a, decision{}, store.ErrOverCap); r == nil || r.Problem.Slug != SlugOverCap || r.Problem.Status != http.StatusTooManyRequests {
		t.Fatalf("over the tenant's cap: %+v", r)
	}
	r := e.admitted(ctx, ticket{}, a, decision{}, &breakerError{wait: 3 * time.Second})
	if r == nil || r.Verdict != Unavailable || r.Problem.RetryAfter != 3*time.Second {
		t.Fatalf("breaker open: %+v, want 503 with Retry-After 3s", r)
	}
	if r := e.admitted(ctx, ticket{}, a, decision{}, errors.New("connection reset")); r != nil {
		t.Fatalf("a store failure is the protocol's to answer, not admission's: %+v", r)
	}
}
