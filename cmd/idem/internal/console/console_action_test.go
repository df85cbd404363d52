package console_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/console"
	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/memory"
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

// outage is a store whose operations named in fail return the error given
// there instead of running: a failing store (connection refused, a
// timeout) or a definite answer, as a test chooses.
type outage struct {
	store.Store
	mu   sync.Mutex
	fail map[string]error // by operation: get, list, resolve, delete
	// spread: once an operation fails, every operation fails alike (the
	// store went down during it and stays down).
	spread bool
}

func (o *outage) set(op string, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.fail == nil {
		o.fail = map[string]error{}
	}
	o.fail[op] = err
}

func (o *outage) fault(op string) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	err := o.fail[op]
	if err != nil && o.spread {
		for _, other := range []string{"get", "list", "resolve", "delete"} {
			o.fail[other] = err
		}
	}
	return err
}

func (o *outage) Get(ctx context.Context, scope, key string) (store.Record, error) {
	if err := o.fault("get"); err != nil {
		return store.Record{}, err
	}
	return o.Store.Get(ctx, scope, key)
}

func (o *outage) List(ctx context.Context, p store.ListParams) ([]store.Record, *store.Cursor, error) {
	if err := o.fault("list"); err != nil {
		return nil, nil, err
	}
	return o.Store.List(ctx, p)
}

func (o *outage) Resolve(ctx context.Context, p store.ResolveParams) error {
	if err := o.fault("resolve"); err != nil {
		return err
	}
	return o.Store.Resolve(ctx, p)
}

func (o *outage) Delete(ctx context.Context, p store.DeleteParams) error {
	if err := o.fault("delete"); err != nil {
		return err
	}
	return o.Store.Delete(ctx, p)
}

// A store that fails during a settlement or a delete (refused, timed out)
// is no answer about the record nor about the operator's form: 502, a page
// saying the store failed, the record as it was, and the same form goes
// through once the store is back. A definite answer of the store keeps its
// status: 404 absent, 409 ran again or not in the state the action takes,
// 400 parameters it refuses. The pages that only read answer 502 likewise.
func TestConsoleStoreFailureIsBadGateway(t *testing.T) {
	mem := memory.New(memory.Config{})
	o := &outage{Store: mem}
	f := newFixtureOn(t, o, console.Credentials{Token: token}, "0.0.0.0:9090")
	auth := map[string]string{"Authorization": "Bearer " + token}
	ctx := context.Background()
	refused := errors.New("dial tcp 10.0.0.7:5432: connect: connection refused")
	for i, c := range []struct {
		op, action string
		err        error
		code       int
		says       string
	}{
		{"resolve", "not_happened", refused, http.StatusBadGateway, "store failed"},
		{"resolve", "completed", context.DeadlineExceeded, http.StatusBadGateway, "store failed"},
		{"resolve", "run_again", fmt.Errorf("%w: fence 3 is not 2", store.ErrLeaseLost), http.StatusConflict, "ran again"},
		{"resolve", "not_happened", store.ErrStateConflict, http.StatusConflict, "not in a state"},
		{"resolve", "not_happened", store.ErrNotFound, http.StatusNotFound, "no record"},
		{"resolve", "not_happened", fmt.Errorf("%w: response too large", store.ErrInvalidParams), http.StatusBadRequest, "response too large"},
		{"delete", "delete", refused, http.StatusBadGateway, "store failed"},
		{"delete", "delete", context.DeadlineExceeded, http.StatusBadGateway, "store failed"},
		{"delete", "delete", store.ErrLeaseLost, http.StatusConflict, "ran again"},
		{"delete", "delete", store.ErrStateConflict, http.StatusConflict, "not in a state"},
		{"delete", "delete", store.ErrNotFound, http.StatusNotFound, "no record"},
	} {
		key := fmt.Sprintf("k%d", i)
		fence := f.unknown("t", "/v1/charges", key)
		scope := (&idem.Request{Tenant: "t", Method: "POST", Route: "/v1/charges"}).Scope()
		act := url.Values{"csrf": {f.recordCSRF(scope, key, auth)}, "scope": {scope}, "key": {key}, "fence": {fmt.Sprint(fence)},
			"action": {c.action}, "status": {"201"}, "body": {`{"id":"ch_1"}`}, "confirm": {"yes"}}
		o.set(c.op, c.err)
		code, body := f.do("POST", "/console/act", act, auth)
		if code != c.code || !strings.Contains(body, c.says) {
			t.Errorf("%s, the store answering %v: %d, want %d saying %q\n%s", c.action, c.err, code, c.code, c.says, body)
		}
		if rec, err := mem.Get(ctx, scope, key); err != nil || rec.State != store.StateUnknown || rec.Fence != fence {
			t.Fatalf("%s, the store answering %v: the record is %s fence %d, %v", c.action, c.err, rec.State, rec.Fence, err)
		}
		if code != http.StatusBadGateway {
			o.set(c.op, nil)
			continue
		}
		if !strings.Contains(body, "may or may not") || !strings.Contains(body, "again") {
			t.Errorf("%s, the store failing: the page does not say the action may not have been done and can be sent again\n%s", c.action, body)
		}
		// The store is back: the same form goes through.
		o.set(c.op, nil)
		if code, body := f.do("POST", "/console/act", act, auth); code != http.StatusSeeOther {
			t.Errorf("%s once the store is back: %d\n%s", c.action, code, body)
		}
	}
	if n := f.actions("delete", "error"); n != 2 {
		t.Errorf("idem.console.actions{action=delete,result=error} = %d, want 2", n)
	}

	// The pages that read: the record page, the confirmation page, the lists.
	f.unknown("t", "/v1/charges", "k")
	scope := (&idem.Request{Tenant: "t", Method: "POST", Route: "/v1/charges"}).Scope()
	csrf := f.recordCSRF(scope, "k", auth)
	o.set("get", refused)
	o.set("list", refused)
	for _, p := range []struct {
		method, path string
		form         url.Values
	}{
		{"GET", "/console/record?" + url.Values{"scope": {scope}, "key": {"k"}}.Encode(), nil},
		{"POST", "/console/act", url.Values{"csrf": {csrf}, "scope": {scope}, "key": {"k"}, "action": {"delete"}}},
		{"GET", "/console/", nil},
		{"GET", "/console/unknown", nil},
		{"GET", "/console/dead-letters", nil},
	} {
		if code, body := f.do(p.method, p.path, p.form, auth); code != http.StatusBadGateway || !strings.Contains(body, "store failed") {
			t.Errorf("%s %s, the store failing: %d, want 502 saying the store failed\n%s", p.method, p.path, code, body)
		}
	}
}

// A store that goes down during a delete and stays down: the audit line
// says the record could not be read after the action (unread), not that
// it is absent, which would read as a delete that went through.
func TestConsoleAuditAfterAStoreFailure(t *testing.T) {
	o := &outage{Store: memory.New(memory.Config{}), spread: true}
	f := newFixtureOn(t, o, console.Credentials{Token: token}, "0.0.0.0:9090")
	auth := map[string]string{"Authorization": "Bearer " + token}
	fence := f.unknown("t", "/v1/charges", "k")
	scope := (&idem.Request{Tenant: "t", Method: "POST", Route: "/v1/charges"}).Scope()
	act := url.Values{"csrf": {f.recordCSRF(scope, "k", auth)}, "scope": {scope}, "key": {"k"}, "fence": {fmt.Sprint(fence)},
		"action": {"delete"}, "confirm": {"yes"}}
	o.set("delete", errors.New("dial tcp 10.0.0.7:5432: connect: connection refused"))
	if code, body := f.do("POST", "/console/act", act, auth); code != http.StatusBadGateway {
		t.Fatalf("delete with the store going down: %d\n%s", code, body)
	}
	lines := f.audits("delete")
	if len(lines) != 1 {
		t.Fatalf("%d audit lines for the delete, want 1", len(lines))
	}
	want(t, lines[0], map[string]any{"result": "error", "state_before": "unknown", "state_after": "unread"})
}
