package payments

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// The fake provider behaves as the service relies on: one effect per key,
// a refusal for a key reused with other parameters or presented with a
// stale fence, and an injected timeout that takes effect unseen.
func TestProvider(t *testing.T) {
	t.Parallel()
	p := NewProvider()
	srv := httptest.NewServer(p)
	defer srv.Close()
	defer p.Close()
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	c := &providerClient{base: srv.URL, http: &http.Client{Transport: tr}, timeout: 2 * time.Second}
	ctx := context.Background()
	req := chargeRequest{Amount: 100, Currency: "eur", Customer: "cus_1", Payment: "pay_1"}

	first, err := c.charge(ctx, "k1", 1, req)
	if err != nil || first.Status != "succeeded" {
		t.Fatalf("charge: %+v %v", first, err)
	}
	again, err := c.charge(ctx, "k1", 2, req)
	if err != nil || again.ID != first.ID {
		t.Fatalf("same key: %+v %v; want %s again", again, err, first.ID)
	}
	var pe *ProviderError
	other := req
	other.Amount = 200
	if _, err := c.charge(ctx, "k1", 2, other); !errors.As(err, &pe) || pe.Status != http.StatusUnprocessableEntity {
		t.Fatalf("key reused with another amount: %v", err)
	}
	if _, err := c.charge(ctx, "k1", 1, req); !errors.As(err, &pe) || pe.Status != http.StatusConflict || pe.Code != "stale_fence" {
		t.Fatalf("stale fence: %v", err)
	}
	if s := p.Stats(); s.Charges != 1 || s.Replayed != 1 || s.Stale != 1 {
		t.Fatalf("stats %+v", s)
	}

	if err := p.SetFaults(Faults{Fail: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.refund(ctx, "r1", 1, refundRequest{Charge: first.ID, Amount: 40}); !errors.As(err, &pe) || pe.Status != http.StatusServiceUnavailable {
		t.Fatalf("injected failure: %v", err)
	}
	if _, found, err := c.find(ctx, "refunds", "r1"); found || err != nil {
		t.Fatalf("a failed call left a refund: %v %v", found, err)
	}

	if err := p.SetFaults(Faults{Timeout: 1}); err != nil {
		t.Fatal(err)
	}
	short := *c
	short.timeout = 200 * time.Millisecond
	if _, err := short.refund(ctx, "r1", 1, refundRequest{Charge: first.ID, Amount: 40}); !errors.Is(err, errNoAnswer) {
		t.Fatalf("injected timeout: %v; want no answer", err)
	}
	rf, found, err := c.find(ctx, "refunds", "r1")
	if err != nil || !found || rf.Amount != 40 || rf.Charge != first.ID {
		t.Fatalf("after the timeout: %+v %v %v; want the refund made", rf, found, err)
	}
	if _, err := c.refund(ctx, "r2", 1, refundRequest{Charge: first.ID, Amount: 61}); !errors.As(err, &pe) || pe.Code != "amount_too_large" {
		t.Fatalf("refund beyond the charge: %v", err)
	}
	if s := p.Stats(); s.Refunds != 1 || s.TimedOut != 1 || s.Failed != 1 {
		t.Fatalf("stats %+v", s)
	}
}
