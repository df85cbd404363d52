package idem_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

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
