package payments

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/testkit/pgdb"
	"github.com/idem-go/idem/internal/testkit/testenv"
	"github.com/idem-go/idem/maintenance"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/store"
	_ "github.com/jackc/pgx/v5/stdlib"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// forEachDB runs test on a fresh SQLite file and, when IDEM_TEST_POSTGRES_URL
// is set, on a fresh PostgreSQL schema, in parallel.
func forEachDB(t *testing.T, test func(t *testing.T, dsn string)) {
	t.Parallel()
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		test(t, "sqlite:"+filepath.Join(t.TempDir(), "payments.db"))
	})
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		url := testenv.PostgresURL(t)
		test(t, freshSchema(t, url))
	})
}

// freshSchema creates an empty schema, dropped after the test, and returns
// url with its search_path: the payments, idem's records and the outbox
// all land in it.
func freshSchema(t *testing.T, url string) string {
	t.Helper()
	schema := pgdb.Schema(t, url)
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	return url + sep + "search_path=" + schema
}

// manualClock is the stores' clock: real time plus an offset the test moves
// to expire leases without sleeping.
type manualClock struct{ offset atomic.Int64 }

func (c *manualClock) now() time.Time { return time.Now().Add(time.Duration(c.offset.Load())) }

func (c *manualClock) advance(d time.Duration) { c.offset.Add(int64(d)) }

// env is one running service with its own provider and database.
type env struct {
	t     *testing.T
	svc   *Service
	prov  *Provider
	clock *manualClock
}

// lease is the idempotency lease of the tests' services.
const lease = 30 * time.Second

// newEnv opens and starts a service on dsn with a fresh provider. The
// maintainer is driven by the test (SweepOnce, ReconcileOnce); the outbox
// polls and retries within milliseconds.
func newEnv(t *testing.T, dsn string, modify func(*Config)) *env {
	t.Helper()
	logs := &testenv.Buffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("service log:\n%s", logs.String())
		}
	})
	prov := NewProvider()
	srv := httptest.NewServer(prov)
	t.Cleanup(srv.Close)
	t.Cleanup(prov.Close)
	clock := &manualClock{}
	cfg := Config{
		DB: dsn, ProviderURL: srv.URL, ProviderTimeout: 2 * time.Second, Lease: lease,
		OutboxBackoff: 10 * time.Millisecond, OutboxPollInterval: 50 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Clock:  clock.now,
		hooks:  hooks{manualMaintenance: true},
	}
	if modify != nil {
		modify(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	svc, err := Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := svc.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	if err := svc.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := svc.Stop(ctx); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
	return &env{t: t, svc: svc, prov: prov, clock: clock}
}

// send sends one request to the API, as account (none when empty).
func (e *env) send(method, path, account, key, body string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, path, strings.NewReader(body))
	if body != "" {
		r.Header.Set("Content-Type", "application/json")
	}
	if account != "" {
		r.Header.Set("Authorization", "Bearer "+account)
	}
	if key != "" {
		r.Header.Set("Idempotency-Key", key)
	}
	w := httptest.NewRecorder()
	e.svc.Handler().ServeHTTP(w, r)
	return w
}

func (e *env) post(path, account, key, body string) *httptest.ResponseRecorder {
	return e.send(http.MethodPost, path, account, key, body)
}

// postAnswered posts until the answer is not "in progress", as a client
// does when it honours 409 and Retry-After (with a pause of milliseconds
// instead of the advertised second); it returns the answer and how many
// 409s it got first.
func (e *env) postAnswered(path, account, key, body string) (*httptest.ResponseRecorder, int) {
	for conflicts := 0; ; conflicts++ {
		w := e.post(path, account, key, body)
		if w.Code != http.StatusConflict || problemType(w) != idem.ProblemBase+"request-in-progress" {
			return w, conflicts
		}
		if conflicts > 1000 {
			e.t.Fatalf("still in progress after %d attempts", conflicts)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// payment reads a payment through the API.
func (e *env) payment(account, id string) Payment {
	e.t.Helper()
	w := e.send(http.MethodGet, "/v1/payments/"+id, account, "", "")
	if w.Code != http.StatusOK {
		e.t.Fatalf("GET payment %s: %d %s", id, w.Code, w.Body)
	}
	var p Payment
	if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
		e.t.Fatal(err)
	}
	return p
}

// charged waits until the outbox has charged the payment (or given up on
// it) and returns it.
func (e *env) charged(account, id string) Payment {
	e.t.Helper()
	return e.settled(account, id, "pending")
}

// settled waits until the payment has left status and returns it.
func (e *env) settled(account, id, status string) Payment {
	e.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		p := e.payment(account, id)
		if p.Status != status {
			return p
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("payment %s still %s after 20s; provider %+v", id, status, e.prov.Stats())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// requeueCharge has the dead charge of a payment delivered again, as an
// operator does: once River has discarded its job, the same message (key,
// kind, fence, payload) is enqueued again.
func (e *env) requeueCharge(id string) {
	e.t.Helper()
	switch a := e.svc.core.(type) {
	case *app[*sql.Tx]:
		requeueCharge(e.t, a, id)
	case *app[pgx.Tx]:
		requeueCharge(e.t, a, id)
	default:
		e.t.Fatalf("core %T", a)
	}
}

func requeueCharge[TTx any](t *testing.T, a *app[TTx], id string) {
	t.Helper()
	ctx := t.Context()
	p, err := scanPayment(a.db.read(ctx, qPaymentByID, id))
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	d, err := a.ob.Delivery(ctx, p.chargeKey, kindCharge)
	for err == nil && d.State != outbox.Dead && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
		d, err = a.ob.Delivery(ctx, p.chargeKey, kindCharge)
	}
	if err != nil || d.State != outbox.Dead {
		t.Fatalf("charge of %s: %+v %v; want dead", id, d, err)
	}
	payload, err := json.Marshal(chargeRequest{Amount: p.Amount, Currency: p.Currency, Customer: p.Customer, Payment: p.ID})
	if err != nil {
		t.Fatal(err)
	}
	err = a.st.InTx(ctx, func(tx TTx) error {
		return a.ob.EnqueueTx(ctx, tx, outbox.Message{Kind: kindCharge, Key: p.chargeKey, Fence: d.Fence, Payload: payload})
	})
	if err != nil {
		t.Fatal(err)
	}
}

// proxyProvider serves a proxy in front of the provider at provider and
// returns its URL: handle serves each call, passing it on to the provider
// or not. A handler cuts a call's connection without an answer with
// panic(http.ErrAbortHandler).
func proxyProvider(t *testing.T, provider string, handle func(w http.ResponseWriter, r *http.Request, provider http.Handler)) string {
	t.Helper()
	u, err := url.Parse(provider)
	if err != nil {
		t.Fatal(err)
	}
	tr := &http.Transport{}
	proxy := httputil.NewSingleHostReverseProxy(u)
	proxy.Transport = tr
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { handle(w, r, proxy) }))
	t.Cleanup(tr.CloseIdleConnections)
	t.Cleanup(srv.Close)
	return srv.URL
}

// newPayment creates a payment of amount and waits until it is charged.
func (e *env) newPayment(account string, amount int) Payment {
	e.t.Helper()
	w := e.post("/v1/payments", account, "pay-"+newID(""), `{"amount":`+strconv.Itoa(amount)+`,"currency":"eur","customer":"cus_1"}`)
	if w.Code != http.StatusCreated {
		e.t.Fatalf("create payment: %d %s", w.Code, w.Body)
	}
	p := e.charged(account, decode[Payment](e.t, w).ID)
	if p.Status != "succeeded" {
		e.t.Fatalf("payment %+v not succeeded", p)
	}
	return p
}

// record returns the idempotency record of a request.
func (e *env) record(account, route, key string) store.Record {
	e.t.Helper()
	// route is a mux pattern, "POST /v1/refunds": the engine scopes by the
	// method and the path.
	path := strings.TrimPrefix(route, http.MethodPost+" ")
	scope := (&idem.Request{Tenant: account, Method: http.MethodPost, Route: path}).Scope()
	rec, err := e.svc.core.store().Get(context.Background(), scope, key)
	if err != nil {
		e.t.Fatalf("record %s %s: %v", route, key, err)
	}
	return rec
}

func (e *env) refundCount(paymentID string) int {
	e.t.Helper()
	n, err := e.svc.core.refundCount(context.Background(), paymentID)
	if err != nil {
		e.t.Fatal(err)
	}
	return n
}

func (e *env) reconcile() maintenance.ReconcileResult {
	e.t.Helper()
	res, err := e.svc.core.maintainer().ReconcileOnce(context.Background())
	if err != nil {
		e.t.Fatal(err)
	}
	return res
}

func decode[T any](t *testing.T, w *httptest.ResponseRecorder) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(w.Body.Bytes(), &v); err != nil {
		t.Fatalf("decode %s: %v", w.Body, err)
	}
	return v
}

func problemType(w *httptest.ResponseRecorder) string {
	var p struct{ Type string }
	json.Unmarshal(w.Body.Bytes(), &p)
	return p.Type
}

func expect(t *testing.T, w *httptest.ResponseRecorder, status int, problem string) {
	t.Helper()
	if w.Code != status || (problem != "" && problemType(w) != problem) {
		t.Fatalf("got %d %s; want %d %s", w.Code, w.Body, status, problem)
	}
}

// errCrashed is what a test hook returns where the process would die.
var errCrashed = errors.New("simulated crash")
