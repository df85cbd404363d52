package idem_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store"
)

// unknownRecord returns the one unknown record of f's store.
func (f *fixture) unknownRecord() store.Record {
	f.t.Helper()
	rs, err := f.store.ListUnknown(context.Background(), store.ListUnknownParams{Limit: 10})
	if err != nil || len(rs) != 1 {
		f.t.Fatalf("unknown records: %d, %v; want 1", len(rs), err)
	}
	rec, err := f.store.Get(context.Background(), rs[0].Scope, rs[0].Key)
	if err != nil {
		f.t.Fatal(err)
	}
	return rec
}

// A request whose outcome becomes unknown leaves a summary of itself with
// its record, for the operator who settles it: method, target, the
// headers that cannot carry a credential, the body's first KiB and its
// size, and the execution's fence. A request answered leaves nothing.
func TestUnknownRecordKeepsARequestSummary(t *testing.T) {
	t.Parallel()
	f := newFixture(t, idem.Config{}, func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.URL.RawQuery, "uncertain") {
			idem.FromContext(r.Context()).Uncertain("payment gateway timed out")
			w.WriteHeader(http.StatusGatewayTimeout)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
	c := post(uuid, `{"amount":100,"note":"`+strings.Repeat("x", 2000)+`"}`)
	c.path = "/v1/charges?mode=uncertain"
	c.header.Set("Authorization", "Bearer sk_live_1")
	c.header.Set("Cookie", "session=s1")
	c.header.Set("X-Api-Key", "k_1")
	c.header.Set("X-Auth-Token", "t_1")
	c.header.Set("Stripe-Signature", "sig_1")
	c.header.Set("X-Request-Id", "req-7")
	c.header.Set("User-Agent", strings.Repeat("u", 300))
	if w := f.do(c); w.Code != http.StatusGatewayTimeout {
		t.Fatalf("uncertain request: %d", w.Code)
	}
	rec := f.unknownRecord()
	s := rec.Request
	if s == nil {
		t.Fatal("the unknown record keeps no request summary")
	}
	if s.Method != "POST" || s.Target != "/v1/charges?mode=uncertain" || s.Queue != "" || s.Fence != rec.Fence {
		t.Fatalf("summary: %s %s queue %q fence %d (record fence %d)", s.Method, s.Target, s.Queue, s.Fence, rec.Fence)
	}
	if len(s.Body) != 1024 || s.BodyBytes != len(`{"amount":100,"note":""}`)+2000 || !strings.HasPrefix(string(s.Body), `{"amount":100,"note":"xxx`) {
		t.Fatalf("summary body: %d bytes of %d: %.40q", len(s.Body), s.BodyBytes, s.Body)
	}
	var names []string
	for k := range s.Header {
		names = append(names, k)
	}
	slices.Sort(names)
	if want := []string{"Content-Type", "Idempotency-Key", "User-Agent", "X-Request-Id"}; !slices.Equal(names, want) {
		t.Fatalf("summary headers %v, want %v", names, want)
	}
	if ua := s.Header.Get("User-Agent"); len(ua) > 256 || !strings.HasSuffix(ua, "…") {
		t.Fatalf("a long header value kept whole: %d bytes", len(ua))
	}
	for _, secret := range []string{"sk_live_1", "session=s1", "k_1", "t_1", "sig_1"} {
		if strings.Contains(fmt.Sprintf("%v %s", s.Header, s.Body), secret) {
			t.Fatalf("the summary holds the credential %q", secret)
		}
	}

	// The common path keeps nothing.
	f2 := newFixture(t, idem.Config{}, nil)
	if w := f2.do(post(uuid, `{"amount":100}`)); w.Code != http.StatusCreated {
		t.Fatalf("request: %d", w.Code)
	}
	rs, _, err := f2.store.List(context.Background(), store.ListParams{Limit: 10})
	if err != nil || len(rs) != 1 {
		t.Fatalf("records: %d %v", len(rs), err)
	}
	if rec, _ := f2.store.Get(context.Background(), rs[0].Scope, rs[0].Key); rec.Request != nil {
		t.Fatalf("a completed record keeps a request: %+v", rec.Request)
	}
}

// A handler that panics leaves the summary too.
func TestPanicKeepsARequestSummary(t *testing.T) {
	t.Parallel()
	f := newFixture(t, idem.Config{}, func(w http.ResponseWriter, r *http.Request) { panic("boom") })
	func() {
		defer func() { _ = recover() }()
		f.do(post(uuid, `{"amount":100}`))
	}()
	rec := f.unknownRecord()
	if rec.Request == nil || string(rec.Request.Body) != `{"amount":100}` || rec.Request.BodyBytes != 0 || rec.Request.Fence != rec.Fence {
		t.Fatalf("summary after a panic: %+v", rec.Request)
	}
}
