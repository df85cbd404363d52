package idem_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/memory"
)

func ExampleEngine_Middleware() {
	engine, err := idem.New(memory.New(memory.Config{}), idem.Config{})
	if err != nil {
		panic(err)
	}
	charges := 0
	mux := http.NewServeMux()
	mux.Handle("POST /v1/charges", engine.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		charges++
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":"ch_%d"}`, charges)
	})))

	for i := 0; i < 2; i++ {
		r := httptest.NewRequest("POST", "/v1/charges", strings.NewReader(`{"amount":100}`))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Idempotency-Key", `"8e03978e-40d5-43e8-bc93-6894a57f9324"`)
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, r)
		fmt.Printf("%d %s replayed=%q\n", w.Code, w.Body, w.Header().Get("Idempotent-Replayed"))
	}
	fmt.Println("charges made:", charges)
	// Output:
	// 201 {"id":"ch_1"} replayed=""
	// 201 {"id":"ch_1"} replayed="true"
	// charges made: 1
}

func ExampleFromContext() {
	engine, _ := idem.New(memory.New(memory.Config{}), idem.Config{})
	h := engine.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		x := idem.FromContext(r.Context())
		// Pass the key and the fence downstream, so that the provider
		// deduplicates and refuses a zombie holder's late calls.
		fmt.Println("key", x.Key(), "fence positive:", x.Fence() > 0)
		w.WriteHeader(http.StatusAccepted)
	}))
	r := httptest.NewRequest("POST", "/v1/payouts", strings.NewReader(`{}`))
	r.Header.Set("Idempotency-Key", "payout-42")
	h.ServeHTTP(httptest.NewRecorder(), r)
	// Output:
	// key payout-42 fence positive: true
}

func ExampleEngine_Run() {
	ctx := context.Background()
	engine, _ := idem.New(memory.New(memory.Config{}), idem.Config{})
	// A queue consumer: the message id is the key, the queue the route.
	msg := idem.Call{
		Tenant: "acct_1", Method: "CONSUME", Route: "orders-queue", Target: "orders-queue",
		Keys: []string{"msg-7"}, ContentType: "application/json", Body: []byte(`{"order":7}`),
	}
	for i := 0; i < 2; i++ {
		a := engine.Run(ctx, msg, func(ctx context.Context) idem.Result {
			// ... process the message ...
			fmt.Println("processed")
			return idem.Result{Response: store.Response{Status: 200, Body: []byte("done")}}
		})
		switch a.Verdict {
		case idem.Executed:
		case idem.Replayed:
			fmt.Println("duplicate, first result:", string(a.Response.Body))
		default:
			fmt.Println(a.Verdict, a.Problem.Slug) // the store is down: redeliver later
		}
	}
	// Output:
	// processed
	// duplicate, first result: done
}

// accountID stands for the application's authentication: the tenant is
// whoever the credential says, never something the body claims.
func accountID(r *http.Request) string { return r.Header.Get("Authorization") }

func ExampleConfig_tenant() {
	engine, err := idem.New(memory.New(memory.Config{}), idem.Config{
		// The tenant comes from authentication, never from the body.
		Tenant: func(r *http.Request) string { return accountID(r) },
	})
	if err != nil {
		panic(err)
	}
	chargeHandler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "charged for %s", accountID(r))
	})
	mux := http.NewServeMux()
	mux.Handle("POST /v1/charges", engine.Middleware(chargeHandler))

	// Two callers who picked the same key get their own records.
	for _, caller := range []string{"Bearer sk_a", "Bearer sk_b"} {
		r := httptest.NewRequest("POST", "/v1/charges", strings.NewReader(`{"amount":100}`))
		r.Header.Set("Authorization", caller)
		r.Header.Set("Idempotency-Key", "order-1")
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, r)
		fmt.Println(w.Code, w.Body)
	}
	// Output:
	// 201 charged for Bearer sk_a
	// 201 charged for Bearer sk_b
}

func ExampleEngine_With() {
	engine, err := idem.New(memory.New(memory.Config{}), idem.Config{})
	if err != nil {
		panic(err)
	}
	reports, err := engine.With(func(c *idem.Config) { c.TTL = 7 * 24 * time.Hour }) // answers kept a week
	if err != nil {
		panic(err)
	}
	h := reports.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	}))
	r := httptest.NewRequest("POST", "/v1/reports", strings.NewReader(`{}`))
	r.Header.Set("Idempotency-Key", "report-1")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	expires, _ := http.ParseTime(w.Header().Get("Idempotency-Key-Expires"))
	fmt.Println(w.Code, "kept for more than 6 days:", time.Until(expires) > 6*24*time.Hour)
	// Output:
	// 201 kept for more than 6 days: true
}

func ExampleEngine_NewWorker() {
	ctx := context.Background()
	eng, err := idem.New(memory.New(memory.Config{}), idem.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		panic(err)
	}
	reportHandler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, "report ready")
	})
	mux := http.NewServeMux()

	reports, _ := eng.With(func(c *idem.Config) { c.Async = true; c.AsyncQueue = "reports" })
	mux.Handle("POST /v1/reports", reports.Middleware(reportHandler))
	mux.Handle("GET "+idem.DefaultStatusPath, reports.StatusHandler())
	worker, _ := reports.NewWorker(idem.WorkerConfig{Handler: reportHandler, Concurrency: 4})
	// maintenance.Config{Services: []maintenance.Service{worker}} starts and stops it
	// with the sweeper, which also ends requests no worker claimed in time.

	r := httptest.NewRequest("POST", "/v1/reports", strings.NewReader(`{"month":"2030-11"}`))
	r.Header.Set("Idempotency-Key", "report-2030-11")
	w := httptest.NewRecorder()
	mux.ServeHTTP(w, r)
	fmt.Println(w.Code)
	location := w.Header().Get("Location")

	worker.RunOnce(ctx) // what a started worker does in the background
	w = httptest.NewRecorder()
	mux.ServeHTTP(w, httptest.NewRequest("GET", location, nil))
	fmt.Println(w.Code, w.Body)
	// Output:
	// 202
	// 201 report ready
}
