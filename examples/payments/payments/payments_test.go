package payments

import (
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/maintenance"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/store"
)

// A payment sent five times with one key, three of them at once, charges
// the card once, and every answer is the first 201, byte for byte.
func TestPaymentRetriedChargesOnce(t *testing.T) {
	forEachDB(t, func(t *testing.T, dsn string) {
		e := newEnv(t, dsn, nil)
		const body = `{"amount":1000,"currency":"eur","customer":"cus_1"}`
		answers := make([]*httptest.ResponseRecorder, 0, 5)
		var (
			mu        sync.Mutex
			wg        sync.WaitGroup
			start     = make(chan struct{})
			conflicts int
		)
		for range 3 {
			wg.Go(func() {
				<-start
				w, n := e.postAnswered("/v1/payments", "acct_1", "order-17", body)
				mu.Lock()
				answers, conflicts = append(answers, w), conflicts+n
				mu.Unlock()
			})
		}
		close(start)
		wg.Wait()
		// A retry later, and one whose JSON is spelled differently: the
		// fingerprint is over the canonical members, so it is the same
		// request.
		w, _ := e.postAnswered("/v1/payments", "acct_1", "order-17", body)
		answers = append(answers, w)
		w, _ = e.postAnswered("/v1/payments", "acct_1", "order-17", `{ "customer": "cus_1", "currency": "eur", "amount": 1000 }`)
		answers = append(answers, w)

		first := ""
		originals := 0
		for i, a := range answers {
			if a.Code != http.StatusCreated {
				t.Fatalf("answer %d: %d %s", i, a.Code, a.Body)
			}
			if a.Header().Get("Idempotent-Replayed") != "true" {
				originals++
				first = a.Body.String()
			}
		}
		if originals != 1 {
			t.Fatalf("%d answers were not replays; want exactly 1", originals)
		}
		for i, a := range answers {
			if b := a.Body.String(); b != first {
				t.Errorf("answer %d differs:\n%s\nwant\n%s", i, b, first)
			}
		}
		t.Logf("%d answers of 409 in progress before the concurrent retries got the 201", conflicts)

		p := e.charged("acct_1", decode[Payment](t, answers[0]).ID)
		if p.Status != "succeeded" || p.Charge == "" {
			t.Fatalf("payment after delivery: %+v", p)
		}
		if s := e.prov.Stats(); s.Charges != 1 || s.Calls != 1 {
			t.Fatalf("provider: %+v; want exactly one charge from one call", s)
		}
	})
}

// A key reused with another amount is refused with 422 and the original
// payment is untouched; a member outside the fingerprint's fields does not
// make a request different.
func TestKeyReusedWithAnotherAmount(t *testing.T) {
	forEachDB(t, func(t *testing.T, dsn string) {
		e := newEnv(t, dsn, nil)
		first := e.post("/v1/payments", "acct_1", "k-reuse", `{"amount":1000,"currency":"eur","customer":"cus_1"}`)
		expect(t, first, http.StatusCreated, "")

		w := e.post("/v1/payments", "acct_1", "k-reuse", `{"amount":2000,"currency":"eur","customer":"cus_1"}`)
		expect(t, w, http.StatusUnprocessableEntity, idem.ProblemBase+"key-reused")

		w = e.post("/v1/payments", "acct_1", "k-reuse", `{"amount":1000,"currency":"eur","customer":"cus_1","note":"not read"}`)
		expect(t, w, http.StatusCreated, "")
		if w.Header().Get("Idempotent-Replayed") != "true" || w.Body.String() != first.Body.String() {
			t.Fatalf("retry with an extra member: %v %s; want the replay of %s", w.Header(), w.Body, first.Body)
		}
		p := e.charged("acct_1", decode[Payment](t, first).ID)
		if p.Amount != 1000 {
			t.Fatalf("payment %+v", p)
		}
		if s := e.prov.Stats(); s.Charges != 1 {
			t.Fatalf("provider: %+v", s)
		}
	})
}

// The handler reads the members the fingerprint covers, by their exact
// names: encoding/json would also take "AMOUNT" or "Amount" for amount, a
// member the fingerprint does not see, so a key reused with another amount
// would be replayed instead of refused, and a payment could be made for an
// amount other than the one its fingerprint holds.
func TestPaymentReadsOnlyFingerprintedMembers(t *testing.T) {
	forEachDB(t, func(t *testing.T, dsn string) {
		e := newEnv(t, dsn, nil)
		first := e.post("/v1/payments", "acct_1", "k-case", `{"amount":1000,"AMOUNT":1,"currency":"eur","customer":"cus_1"}`)
		expect(t, first, http.StatusCreated, "")
		if p := decode[Payment](t, first); p.Amount != 1000 {
			t.Fatalf("created %+v; want the amount of the member named amount", p)
		}
		w := e.post("/v1/payments", "acct_1", "k-case", `{"amount":1000,"currency":"eur","customer":"cus_1"}`)
		if w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "true" || w.Body.String() != first.Body.String() {
			t.Fatalf("retry: %d %s; want the replay of %s", w.Code, w.Body, first.Body)
		}

		w = e.post("/v1/payments", "acct_1", "k-folded", `{"Amount":1000,"currency":"eur","customer":"cus_1"}`)
		expect(t, w, http.StatusBadRequest, ProblemBase+"invalid-request")
		w = e.post("/v1/payments", "acct_1", "k-folded", `{"Amount":2000,"currency":"eur","customer":"cus_1"}`)
		if w.Code == http.StatusCreated {
			t.Fatalf("key reused with another amount: %d %s", w.Code, w.Body)
		}
	})
}

// The provider fails twice: the outbox retries with the same key and the
// card is charged once, on the third call.
func TestProviderFailsTwiceThenSucceeds(t *testing.T) {
	forEachDB(t, func(t *testing.T, dsn string) {
		e := newEnv(t, dsn, nil)
		if err := e.prov.SetFaults(Faults{Fail: 2}); err != nil {
			t.Fatal(err)
		}
		w := e.post("/v1/payments", "acct_1", "k-flaky", `{"amount":1500,"currency":"eur","customer":"cus_2"}`)
		expect(t, w, http.StatusCreated, "")
		if got := decode[Payment](t, w); got.Status != "pending" {
			t.Fatalf("created %+v; want pending until charged", got)
		}
		p := e.charged("acct_1", decode[Payment](t, w).ID)
		if p.Status != "succeeded" || p.Charge == "" {
			t.Fatalf("payment %+v", p)
		}
		if s := e.prov.Stats(); s.Calls != 3 || s.Failed != 2 || s.Charges != 1 {
			t.Fatalf("provider: %+v; want 3 calls, 2 failed, 1 charge", s)
		}
		// The 201 is unchanged by what happened after it.
		again := e.post("/v1/payments", "acct_1", "k-flaky", `{"amount":1500,"currency":"eur","customer":"cus_2"}`)
		if again.Body.String() != w.Body.String() {
			t.Fatalf("replay %s; want %s", again.Body, w.Body)
		}
	})
}

// A declined card is a definite answer: the payment fails, with the
// provider's charge id.
func TestDeclinedCard(t *testing.T) {
	forEachDB(t, func(t *testing.T, dsn string) {
		e := newEnv(t, dsn, nil)
		w := e.post("/v1/payments", "acct_1", "k-declined", `{"amount":700,"currency":"eur","customer":"cus_declined"}`)
		expect(t, w, http.StatusCreated, "")
		p := e.charged("acct_1", decode[Payment](t, w).ID)
		if p.Status != "failed" || p.Failure != "card_declined" || p.Charge == "" {
			t.Fatalf("payment %+v; want failed with card_declined and the charge id", p)
		}
		w = e.post("/v1/refunds", "acct_1", "k-refund-declined", `{"payment":"`+p.ID+`","amount":100}`)
		expect(t, w, http.StatusUnprocessableEntity, ProblemBase+"payment-not-refundable")
	})
}

// The provider refuses every attempt to charge and makes nothing: the
// charge is dead-lettered, the provider has no charge with its key, and
// the payment goes to requires_review with the last error, never failed;
// it cannot be refunded. Once the provider is back, the dead message
// enqueued again settles the payment as a first delivery would.
func TestDeadChargeRequiresReview(t *testing.T) {
	forEachDB(t, func(t *testing.T, dsn string) {
		e := newEnv(t, dsn, nil)
		if err := e.prov.SetFaults(Faults{Fail: 1000}); err != nil {
			t.Fatal(err)
		}
		w := e.post("/v1/payments", "acct_1", "k-dead", `{"amount":1200,"currency":"eur","customer":"cus_5"}`)
		expect(t, w, http.StatusCreated, "")
		p := e.charged("acct_1", decode[Payment](t, w).ID)
		if p.Status != "requires_review" || p.Charge != "" || !strings.Contains(p.Failure, "injected failure") {
			t.Fatalf("payment %+v; want requires_review with the last error", p)
		}
		if s := e.prov.Stats(); s.Calls != outbox.DefaultMaxAttempts || s.Failed != s.Calls || s.Charges != 0 {
			t.Fatalf("provider: %+v; want %d failed calls and no charge", s, outbox.DefaultMaxAttempts)
		}
		expect(t, e.post("/v1/refunds", "acct_1", "k-refund-review", `{"payment":"`+p.ID+`","amount":100}`),
			http.StatusUnprocessableEntity, ProblemBase+"payment-not-refundable")

		if err := e.prov.SetFaults(Faults{}); err != nil {
			t.Fatal(err)
		}
		e.requeueCharge(p.ID)
		p = e.settled("acct_1", p.ID, "requires_review")
		if p.Status != "succeeded" || p.Charge == "" || p.Failure != "" {
			t.Fatalf("payment after the charge was delivered again: %+v; want succeeded", p)
		}
		if s := e.prov.Stats(); s.Charges != 1 {
			t.Fatalf("provider: %+v", s)
		}
	})
}

// The provider cannot be reached at all, not even to be asked for the
// charge: the payment goes to requires_review, with both errors.
func TestDeadChargeUnreachableProviderRequiresReview(t *testing.T) {
	forEachDB(t, func(t *testing.T, dsn string) {
		e := newEnv(t, dsn, func(c *Config) {
			c.ProviderURL = proxyProvider(t, c.ProviderURL, func(http.ResponseWriter, *http.Request, http.Handler) {
				panic(http.ErrAbortHandler)
			})
		})
		w := e.post("/v1/payments", "acct_1", "k-unreachable", `{"amount":1300,"currency":"eur","customer":"cus_6"}`)
		expect(t, w, http.StatusCreated, "")
		p := e.charged("acct_1", decode[Payment](t, w).ID)
		if p.Status != "requires_review" || !strings.Contains(p.Failure, "asking the provider for it failed") {
			t.Fatalf("payment %+v; want requires_review with the failed lookup", p)
		}
		if s := e.prov.Stats(); s.Calls != 0 {
			t.Fatalf("provider: %+v; want no call", s)
		}
	})
}

// The provider's refusals carry bytes a text column refuses (a NUL in the
// message): the payment still goes to requires_review, with the reason
// made storable, and does not stay pending while every record of it fails.
func TestDeadChargeReasonIsStorable(t *testing.T) {
	forEachDB(t, func(t *testing.T, dsn string) {
		e := newEnv(t, dsn, func(c *Config) {
			c.ProviderURL = proxyProvider(t, c.ProviderURL, func(w http.ResponseWriter, r *http.Request, provider http.Handler) {
				if r.Method == http.MethodPost && r.URL.Path == "/v1/charges" {
					w.Header().Set("Content-Type", "application/json")
					w.WriteHeader(http.StatusServiceUnavailable)
					io.WriteString(w, `{"error":{"code":"unavailable","message":"down\u0000for maintenance"}}`)
					return
				}
				provider.ServeHTTP(w, r)
			})
		})
		w := e.post("/v1/payments", "acct_1", "k-nul", `{"amount":1400,"currency":"eur","customer":"cus_7"}`)
		expect(t, w, http.StatusCreated, "")
		p := e.charged("acct_1", decode[Payment](t, w).ID)
		if p.Status != "requires_review" || strings.Contains(p.Failure, "\x00") || !strings.Contains(p.Failure, "for maintenance") {
			t.Fatalf("payment %+v; want requires_review with the provider's message, without NUL", p)
		}
	})
}

// The provider makes the charge, but its answer never reaches the service:
// every attempt's connection is cut after the provider answered. The
// charge is dead-lettered, the provider, asked by the charge's key, has it,
// and the payment is recorded succeeded with its charge id, as a delivery
// would have recorded it; it can then be refunded.
func TestDeadChargeMadeAtProviderIsRecorded(t *testing.T) {
	forEachDB(t, func(t *testing.T, dsn string) {
		e := newEnv(t, dsn, func(c *Config) {
			c.ProviderURL = proxyProvider(t, c.ProviderURL, func(w http.ResponseWriter, r *http.Request, provider http.Handler) {
				if r.Method == http.MethodPost && r.URL.Path == "/v1/charges" {
					provider.ServeHTTP(httptest.NewRecorder(), r)
					panic(http.ErrAbortHandler)
				}
				provider.ServeHTTP(w, r)
			})
		})
		w := e.post("/v1/payments", "acct_1", "k-lost-answers", `{"amount":1400,"currency":"eur","customer":"cus_7"}`)
		expect(t, w, http.StatusCreated, "")
		p := e.charged("acct_1", decode[Payment](t, w).ID)
		if p.Status != "succeeded" || p.Charge != "ch_000001" || p.Failure != "" {
			t.Fatalf("payment %+v; want succeeded with the provider's charge", p)
		}
		if s := e.prov.Stats(); s.Charges != 1 || s.Calls < outbox.DefaultMaxAttempts || s.Replayed != s.Calls-1 {
			t.Fatalf("provider: %+v; want one charge, made by the first of at least %d calls", s, outbox.DefaultMaxAttempts)
		}
		expect(t, e.post("/v1/refunds", "acct_1", "k-refund-lost", `{"payment":"`+p.ID+`","amount":400}`), http.StatusCreated, "")
	})
}

// A duplicate of a request still in flight gets 409 with Retry-After, then
// the original answer once it is done.
func TestConcurrentDuplicateGets409(t *testing.T) {
	forEachDB(t, func(t *testing.T, dsn string) {
		held, release := make(chan struct{}), make(chan struct{})
		var first atomic.Bool
		first.Store(true)
		e := newEnv(t, dsn, func(c *Config) {
			c.hooks.beforePayment = func(*idem.Execution) error {
				if first.CompareAndSwap(true, false) {
					close(held)
					<-release
				}
				return nil
			}
		})
		const body = `{"amount":900,"currency":"eur","customer":"cus_3"}`
		done := make(chan *httptest.ResponseRecorder)
		go func() { done <- e.post("/v1/payments", "acct_1", "k-dup", body) }()
		<-held

		w := e.post("/v1/payments", "acct_1", "k-dup", body)
		expect(t, w, http.StatusConflict, idem.ProblemBase+"request-in-progress")
		if w.Header().Get("Retry-After") == "" {
			t.Fatalf("409 without Retry-After: %v", w.Header())
		}
		close(release)
		orig := <-done
		origBody := orig.Body.String()
		expect(t, orig, http.StatusCreated, "")
		w = e.post("/v1/payments", "acct_1", "k-dup", body)
		if w.Code != http.StatusCreated || w.Body.String() != origBody || w.Header().Get("Idempotent-Replayed") != "true" {
			t.Fatalf("after the original: %d %v %s", w.Code, w.Header(), w.Body)
		}
		e.charged("acct_1", decode[Payment](t, w).ID)
		if s := e.prov.Stats(); s.Charges != 1 {
			t.Fatalf("provider: %+v", s)
		}
	})
}

// The account comes from authentication: two accounts with one key are
// two payments, and one account cannot read another's payment. A body not
// declared JSON is refused before the key is spent.
func TestAccounts(t *testing.T) {
	forEachDB(t, func(t *testing.T, dsn string) {
		e := newEnv(t, dsn, nil)
		const body = `{"amount":100,"currency":"eur","customer":"cus_1"}`
		expect(t, e.post("/v1/payments", "", "k-shared", body), http.StatusUnauthorized, ProblemBase+"unauthenticated")

		a := e.post("/v1/payments", "acct_a", "k-shared", body)
		b := e.post("/v1/payments", "acct_b", "k-shared", body)
		expect(t, a, http.StatusCreated, "")
		expect(t, b, http.StatusCreated, "")
		pa, pb := decode[Payment](t, a), decode[Payment](t, b)
		if pa.ID == pb.ID || b.Header().Get("Idempotent-Replayed") != "" {
			t.Fatalf("two accounts shared a key: %s / %s", a.Body, b.Body)
		}
		expect(t, e.send(http.MethodGet, "/v1/payments/"+pa.ID, "acct_b", "", ""), http.StatusNotFound, ProblemBase+"payment-not-found")

		// curl -d without -H sends a JSON body labelled as a form.
		r := httptest.NewRequest(http.MethodPost, "/v1/payments", strings.NewReader(body))
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		r.Header.Set("Authorization", "Bearer acct_a")
		r.Header.Set("Idempotency-Key", "k-form")
		form := httptest.NewRecorder()
		e.svc.Handler().ServeHTTP(form, r)
		expect(t, form, http.StatusUnsupportedMediaType, ProblemBase+"not-json")
		expect(t, e.post("/v1/payments", "acct_a", "k-form", body), http.StatusCreated, "")
		for _, p := range []Payment{pa, pb} {
			e.charged(map[string]string{pa.ID: "acct_a", pb.ID: "acct_b"}[p.ID], p.ID)
		}
	})
}

// A refund whose process dies after the provider refunded it (phases
// refund_created and provider_refunded committed, payment_updated not) is
// taken over by the next retry once the lease has expired: only the last
// phase runs, the provider is not called again, and the payment is
// credited once.
func TestRefundResumesAfterCrash(t *testing.T) {
	forEachDB(t, func(t *testing.T, dsn string) {
		var (
			mu    sync.Mutex
			ran   []string
			crash atomic.Bool
		)
		e := newEnv(t, dsn, func(c *Config) {
			c.hooks.beforePhase = func(x *idem.Execution, phase string) error {
				mu.Lock()
				ran = append(ran, phase)
				mu.Unlock()
				if phase == phasePaymentUpdated && crash.CompareAndSwap(true, false) {
					// The process dies here: its lease is no longer
					// renewed and nothing it would have recorded is.
					x.Abandon()
					return errCrashed
				}
				return nil
			}
		})
		phases := func() []string {
			mu.Lock()
			defer mu.Unlock()
			out := ran
			ran = nil
			return out
		}
		p := e.newPayment("acct_1", 1000)
		phases()

		crash.Store(true)
		body := `{"payment":"` + p.ID + `","amount":400}`
		w := e.post("/v1/refunds", "acct_1", "refund-1", body)
		if w.Code/100 != 5 {
			t.Fatalf("crashed request answered %d %s", w.Code, w.Body)
		}
		if got := phases(); !slices.Equal(got, []string{phaseRefundCreated, phaseProviderRefunded, phasePaymentUpdated}) {
			t.Fatalf("phases before the crash: %v", got)
		}
		rec := e.record("acct_1", routeRefunds, "refund-1")
		crashed := rec.Fence
		if rec.State != store.StateInProgress || rec.RecoveryPoint != phaseProviderRefunded || crashed <= 0 {
			t.Fatalf("record after the crash: %+v", rec)
		}
		if s := e.prov.Stats(); s.Refunds != 1 {
			t.Fatalf("provider after the crash: %+v", s)
		}

		// While the dead holder's lease lasts, a retry waits.
		expect(t, e.post("/v1/refunds", "acct_1", "refund-1", body), http.StatusConflict, idem.ProblemBase+"request-in-progress")

		e.clock.advance(lease + time.Second)
		w = e.post("/v1/refunds", "acct_1", "refund-1", body)
		expect(t, w, http.StatusCreated, "")
		if got := phases(); !slices.Equal(got, []string{phasePaymentUpdated}) {
			t.Fatalf("phases run by the takeover: %v; want only %s", got, phasePaymentUpdated)
		}
		f := decode[Refund](t, w)
		if f.Status != "succeeded" || f.Amount != 400 || f.ProviderRefund == "" {
			t.Fatalf("refund %+v", f)
		}
		if s := e.prov.Stats(); s.Refunds != 1 || s.Calls != 2 {
			t.Fatalf("provider: %+v; want the charge and one refund call", s)
		}
		if n := e.refundCount(p.ID); n != 1 {
			t.Fatalf("%d refund rows, want 1", n)
		}
		if got := e.payment("acct_1", p.ID); got.AmountRefunded != 400 || got.Status != "succeeded" {
			t.Fatalf("payment after the refund: %+v; want 400 refunded once", got)
		}
		rec = e.record("acct_1", routeRefunds, "refund-1")
		if rec.State != store.StateCompleted || rec.RecoveryPoint != phasePaymentUpdated || rec.Fence <= crashed {
			t.Fatalf("record after the takeover: %+v", rec)
		}

		again := e.post("/v1/refunds", "acct_1", "refund-1", body)
		if again.Code != http.StatusCreated || again.Body.String() != w.Body.String() || again.Header().Get("Idempotent-Replayed") != "true" {
			t.Fatalf("replay: %d %v %s", again.Code, again.Header(), again.Body)
		}
		if got := phases(); len(got) != 0 {
			t.Fatalf("a replay ran phases %v", got)
		}
	})
}

// The provider refunds but its answer never arrives: the refund's outcome
// is unknown, retries get 409, and reconciliation finds the refund at the
// provider, finishes it locally and stores the 201 the request would have
// had.
func TestRefundTimeoutReconciled(t *testing.T) {
	forEachDB(t, func(t *testing.T, dsn string) {
		e := newEnv(t, dsn, func(c *Config) { c.ProviderTimeout = 500 * time.Millisecond })
		p := e.newPayment("acct_1", 1000)
		if err := e.prov.SetFaults(Faults{Timeout: 1}); err != nil {
			t.Fatal(err)
		}
		body := `{"payment":"` + p.ID + `","amount":250}`
		expect(t, e.post("/v1/refunds", "acct_1", "refund-t", body), http.StatusGatewayTimeout, ProblemBase+"provider-timeout")
		if rec := e.record("acct_1", routeRefunds, "refund-t"); rec.State != store.StateUnknown {
			t.Fatalf("record %+v; want unknown", rec)
		}
		expect(t, e.post("/v1/refunds", "acct_1", "refund-t", body), http.StatusConflict, idem.ProblemBase+"outcome-unknown")

		if res := e.reconcile(); res.Resolved != 1 {
			t.Fatalf("reconcile: %+v", res)
		}
		w := e.post("/v1/refunds", "acct_1", "refund-t", body)
		expect(t, w, http.StatusCreated, "")
		if w.Header().Get("Idempotent-Replayed") != "true" {
			t.Fatalf("after reconciliation: %v; want the stored answer", w.Header())
		}
		if f := decode[Refund](t, w); f.Status != "succeeded" || f.Amount != 250 || f.ProviderRefund == "" {
			t.Fatalf("refund %+v", f)
		}
		if s := e.prov.Stats(); s.Refunds != 1 || s.TimedOut != 1 {
			t.Fatalf("provider: %+v", s)
		}
		if got := e.payment("acct_1", p.ID); got.AmountRefunded != 250 {
			t.Fatalf("payment %+v; want 250 refunded", got)
		}
	})
}

// The provider never got to the refund (it was too slow, and the call was
// abandoned before it acted): reconciliation releases the key, and the
// next retry resumes at the provider call.
func TestRefundUnansweredAndNotMadeIsRetried(t *testing.T) {
	forEachDB(t, func(t *testing.T, dsn string) {
		var (
			mu  sync.Mutex
			ran []string
		)
		e := newEnv(t, dsn, func(c *Config) {
			c.ProviderTimeout = 300 * time.Millisecond
			c.hooks.beforePhase = func(_ *idem.Execution, phase string) error {
				mu.Lock()
				ran = append(ran, phase)
				mu.Unlock()
				return nil
			}
		})
		p := e.newPayment("acct_1", 1000)
		if err := e.prov.SetFaults(Faults{Latency: "10s"}); err != nil {
			t.Fatal(err)
		}
		body := `{"payment":"` + p.ID + `","amount":1000}`
		expect(t, e.post("/v1/refunds", "acct_1", "refund-slow", body), http.StatusGatewayTimeout, ProblemBase+"provider-timeout")
		if err := e.prov.SetFaults(Faults{}); err != nil {
			t.Fatal(err)
		}
		if res := e.reconcile(); res.Resolved != 1 {
			t.Fatalf("reconcile: %+v", res)
		}
		if rec := e.record("acct_1", routeRefunds, "refund-slow"); rec.State != store.StateFailedRetryable || rec.RecoveryPoint != phaseRefundCreated {
			t.Fatalf("record %+v; want failed_retryable at %s", rec, phaseRefundCreated)
		}
		mu.Lock()
		ran = nil
		mu.Unlock()
		w := e.post("/v1/refunds", "acct_1", "refund-slow", body)
		expect(t, w, http.StatusCreated, "")
		mu.Lock()
		got := slices.Clone(ran)
		mu.Unlock()
		if !slices.Equal(got, []string{phaseProviderRefunded, phasePaymentUpdated}) {
			t.Fatalf("phases of the retry: %v", got)
		}
		if s := e.prov.Stats(); s.Refunds != 1 {
			t.Fatalf("provider: %+v", s)
		}
		if got := e.payment("acct_1", p.ID); got.AmountRefunded != 1000 || got.Status != "refunded" {
			t.Fatalf("payment %+v; want fully refunded", got)
		}
		if n := e.refundCount(p.ID); n != 1 {
			t.Fatalf("%d refund rows", n)
		}
	})
}

// A payment request whose process dies before its transaction leaves an
// in-progress key; once its lease expires the sweeper makes it unknown,
// and reconciliation (no payment row, no charge at the provider) releases
// it, so the next retry runs the payment, once.
func TestPaymentLostBeforeCommitIsReconciled(t *testing.T) {
	forEachDB(t, func(t *testing.T, dsn string) {
		var crash atomic.Bool
		crash.Store(true)
		e := newEnv(t, dsn, func(c *Config) {
			c.hooks.beforePayment = func(x *idem.Execution) error {
				if crash.CompareAndSwap(true, false) {
					x.Abandon()
					return errCrashed
				}
				return nil
			}
		})
		const body = `{"amount":300,"currency":"eur","customer":"cus_4"}`
		if w := e.post("/v1/payments", "acct_1", "k-lost", body); w.Code/100 != 5 {
			t.Fatalf("crashed request: %d %s", w.Code, w.Body)
		}
		expect(t, e.post("/v1/payments", "acct_1", "k-lost", body), http.StatusConflict, idem.ProblemBase+"request-in-progress")

		e.clock.advance(lease + maintenance.DefaultSweepGrace + time.Second)
		n, err := e.svc.core.maintainer().SweepOnce(t.Context())
		if err != nil || n != 1 {
			t.Fatalf("sweep: %d %v", n, err)
		}
		expect(t, e.post("/v1/payments", "acct_1", "k-lost", body), http.StatusConflict, idem.ProblemBase+"outcome-unknown")
		if res := e.reconcile(); res.Resolved != 1 {
			t.Fatalf("reconcile: %+v", res)
		}
		w := e.post("/v1/payments", "acct_1", "k-lost", body)
		expect(t, w, http.StatusCreated, "")
		if w.Header().Get("Idempotent-Replayed") != "" {
			t.Fatal("the released payment was replayed instead of run")
		}
		e.charged("acct_1", decode[Payment](t, w).ID)
		if s := e.prov.Stats(); s.Charges != 1 {
			t.Fatalf("provider: %+v", s)
		}
	})
}

// Refunds are checked against what is left of the payment, refunds in
// flight included.
func TestRefundLimits(t *testing.T) {
	forEachDB(t, func(t *testing.T, dsn string) {
		e := newEnv(t, dsn, nil)
		p := e.newPayment("acct_1", 1000)
		expect(t, e.post("/v1/refunds", "acct_1", "r-1", `{"payment":"`+p.ID+`","amount":600}`), http.StatusCreated, "")
		expect(t, e.post("/v1/refunds", "acct_1", "r-2", `{"payment":"`+p.ID+`","amount":600}`),
			http.StatusUnprocessableEntity, ProblemBase+"amount-too-large")
		expect(t, e.post("/v1/refunds", "acct_2", "r-3", `{"payment":"`+p.ID+`","amount":100}`),
			http.StatusNotFound, ProblemBase+"payment-not-found")
		expect(t, e.post("/v1/refunds", "acct_1", "r-4", `{"payment":"`+p.ID+`","amount":400}`), http.StatusCreated, "")
		if got := e.payment("acct_1", p.ID); got.AmountRefunded != 1000 || got.Status != "refunded" {
			t.Fatalf("payment %+v", got)
		}
		if s := e.prov.Stats(); s.Refunds != 2 {
			t.Fatalf("provider: %+v", s)
		}
	})
}

// The resolver answers what the handler answered, byte for byte: a retry
// gets the same 201 whether the request finished or was reconciled, even
// after the payment moved on (charged, refunded).
func TestResolverAnswersLikeTheHandler(t *testing.T) {
	forEachDB(t, func(t *testing.T, dsn string) {
		e := newEnv(t, dsn, nil)
		pay := e.post("/v1/payments", "acct_1", "k-same", `{"amount":800,"currency":"eur","customer":"cus_1"}`)
		expect(t, pay, http.StatusCreated, "")
		p := e.charged("acct_1", decode[Payment](t, pay).ID)
		ref := e.post("/v1/refunds", "acct_1", "r-same", `{"payment":"`+p.ID+`","amount":300}`)
		expect(t, ref, http.StatusCreated, "")

		for _, c := range []struct {
			route, key string
			want       *httptest.ResponseRecorder
		}{{routePayments, "k-same", pay}, {routeRefunds, "r-same", ref}} {
			res, err := e.svc.core.resolve(t.Context(), e.record("acct_1", c.route, c.key))
			if err != nil || res.Outcome != maintenance.Happened {
				t.Fatalf("%s: %+v %v", c.route, res, err)
			}
			if res.Response.Status != c.want.Code || string(res.Response.Body) != c.want.Body.String() {
				t.Fatalf("%s: resolver answers %d %s; the handler answered %d %s", c.route,
					res.Response.Status, res.Response.Body, c.want.Code, c.want.Body)
			}
		}
		// Finishing a finished refund changes nothing.
		if got := e.payment("acct_1", p.ID); got.AmountRefunded != 300 {
			t.Fatalf("payment %+v; want 300 refunded once", got)
		}
	})
}
