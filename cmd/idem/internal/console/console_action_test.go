package console_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store"
)

// A delete from a page that showed one execution is refused once the
// record ran again (settled, run, completed with a new answer): the answer
// the page never showed is kept.
func TestConsoleDeleteBoundToFence(t *testing.T) {
	f := newFixture(t)
	auth := map[string]string{"Authorization": "Bearer " + token}
	first := f.unknown("t", "/v1/charges", "k")
	scope := (&idem.Request{Tenant: "t", Method: "POST", Route: "/v1/charges"}).Scope()
	_, body := f.do("GET", "/console/record?"+url.Values{"scope": {scope}, "key": {"k"}}.Encode(), nil, auth)
	m := csrfRe.FindStringSubmatch(body)
	if m == nil || !strings.Contains(body, `name="action" value="delete"`) {
		t.Fatal("no delete form on the record page")
	}
	del := url.Values{"csrf": {m[1]}, "scope": {scope}, "key": {"k"}, "fence": {fmt.Sprint(first)}, "action": {"delete"}}

	// Meanwhile the record is settled, and its retry runs and completes.
	ctx := context.Background()
	if err := f.s.Resolve(ctx, store.ResolveParams{FenceParams: store.FenceParams{Scope: scope, Key: "k", Fence: first},
		To: store.StateFailedRetryable}); err != nil {
		t.Fatal(err)
	}
	res, err := f.s.Reserve(ctx, store.ReserveParams{Scope: scope, Key: "k", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour, LeasePolicy: store.LeaseUnknown})
	if err != nil || res.Outcome != store.Reclaimed || res.Record.Fence == first {
		t.Fatalf("retry: %v fence %d, %v", res.Outcome, res.Record.Fence, err)
	}
	if err := f.s.Complete(ctx, store.CompleteParams{FenceParams: store.FenceParams{Scope: scope, Key: "k", Fence: res.Record.Fence},
		Response: store.Response{Status: 201, Body: []byte(`{"id":"ch_1"}`)}, TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}

	// The stale page's delete, unconfirmed and confirmed.
	if code, body := f.do("POST", "/console/act", del, auth); code != http.StatusConflict || !strings.Contains(body, "ran again") {
		t.Fatalf("the first execution's delete, unconfirmed: %d\n%s", code, body)
	}
	del.Set("confirm", "yes")
	if code, body := f.do("POST", "/console/act", del, auth); code != http.StatusConflict || !strings.Contains(body, "ran again") {
		t.Fatalf("the first execution's delete, confirmed: %d\n%s", code, body)
	}
	if rec := f.get(scope, "k"); rec.State != store.StateCompleted || rec.Fence != res.Record.Fence {
		t.Fatalf("after the refused delete: %s fence %d", rec.State, rec.Fence)
	}

	// From a page of the record as it is now, the delete goes through.
	del.Set("fence", fmt.Sprint(res.Record.Fence))
	if code, _ := f.do("POST", "/console/act", del, auth); code != http.StatusSeeOther {
		t.Fatalf("delete with the current fence: %d", code)
	}
	if _, err := f.s.Get(ctx, scope, "k"); err != store.ErrNotFound {
		t.Fatalf("after the delete: %v", err)
	}
}

// A settlement as completed stores the answer every retry replays: a final
// status, as idem reconcile resolve and the webhook want. An informational
// status (1xx) is no answer: net/http sends it as an interim response and
// then a 200 of its own, so retries would get a 200 nobody gave.
func TestConsoleSettlementWantsAFinalStatus(t *testing.T) {
	f := newFixture(t)
	auth := map[string]string{"Authorization": "Bearer " + token}
	fence := f.unknown("t", "/v1/charges", "k")
	scope := (&idem.Request{Tenant: "t", Method: "POST", Route: "/v1/charges"}).Scope()
	csrf := f.recordCSRF(scope, "k", auth)
	for _, status := range []string{"100", "102", "199"} {
		act := url.Values{"csrf": {csrf}, "scope": {scope}, "key": {"k"}, "fence": {fmt.Sprint(fence)}, "action": {"completed"},
			"status": {status}, "body": {`{"id":"ch_1"}`}, "confirm": {"yes"}}
		if code, body := f.do("POST", "/console/act", act, auth); code != http.StatusBadRequest || !strings.Contains(body, "200 to 599") {
			t.Errorf("completed with status %s: %d\n%s", status, code, body)
		}
		if rec := f.get(scope, "k"); rec.State != store.StateUnknown {
			t.Fatalf("completed with status %s: the record is %s with %+v", status, rec.State, rec.Response)
		}
	}
}
