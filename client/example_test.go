package client_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/client"
	"github.com/idem-go/idem/store/memory"
)

// chargeAPI starts an API protected by the idem middleware; its handler
// counts the charges it makes.
func chargeAPI(charges *atomic.Int32) *httptest.Server {
	engine, err := idem.New(memory.New(memory.Config{}), idem.Config{})
	if err != nil {
		panic(err)
	}
	return httptest.NewServer(engine.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := charges.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":"ch_%d"}`, n)
	})))
}

func ExampleNew() {
	var charges atomic.Int32
	api := chargeAPI(&charges)
	defer api.Close()

	// Every POST gets a fresh key, kept across its retries.
	c := client.New(&client.Transport{MaxAttempts: 4})
	defer c.CloseIdleConnections()
	resp, err := c.Post(api.URL+"/v1/charges", "application/json", strings.NewReader(`{"amount":100}`))
	if err != nil {
		panic(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Println(resp.StatusCode, string(body))
	fmt.Println("replayed:", client.Replayed(resp), "attempts:", client.Attempts(resp))
	fmt.Println("key is a UUID:", len(client.Key(resp)) == 36)
	// Output:
	// 201 {"id":"ch_1"}
	// replayed: false attempts: 1
	// key is a UUID: true
}

// A key the caller sets is kept: sending the same request under it again,
// even from another process after a restart, gets the stored answer.
func ExampleReplayed() {
	var charges atomic.Int32
	api := chargeAPI(&charges)
	defer api.Close()
	c := client.New(nil)
	defer c.CloseIdleConnections()

	key := client.NewKey() // store it with the order before sending
	for range 2 {
		req, _ := http.NewRequest(http.MethodPost, api.URL+"/v1/charges", strings.NewReader(`{"amount":100}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		resp, err := c.Do(req)
		if err != nil {
			panic(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Println(string(body), "replayed:", client.Replayed(resp), "same key:", client.Key(resp) == key)
	}
	fmt.Println("charges made:", charges.Load())
	// Output:
	// {"id":"ch_1"} replayed: false same key: true
	// {"id":"ch_1"} replayed: true same key: true
	// charges made: 1
}

func ExampleTransport_onRetry() {
	engine, _ := idem.New(memory.New(memory.Config{}), idem.Config{})
	charge := engine.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	}))
	// A server that is overloaded for its first request.
	var calls atomic.Int32
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		charge.ServeHTTP(w, r)
	}))
	defer api.Close()

	c := client.New(&client.Transport{
		OnRetry: func(r client.Retry) {
			fmt.Printf("attempt %d: %d %s, retrying in %v\n", r.Attempt, r.Status, r.Reason, r.Delay)
		},
		// Tests replace the wait; an application keeps the default timer.
		Sleep: func(ctx context.Context, d time.Duration) error { return ctx.Err() },
	})
	defer c.CloseIdleConnections()
	resp, err := c.Post(api.URL+"/v1/charges", "application/json", strings.NewReader(`{"amount":100}`))
	if err != nil {
		panic(err)
	}
	resp.Body.Close()
	fmt.Println(resp.StatusCode, "after", client.Attempts(resp), "attempts")
	// Output:
	// attempt 1: 503 unavailable, retrying in 1s
	// 201 after 2 attempts
}

// AttemptTimeout bounds each attempt, where http.Client.Timeout bounds the
// whole call: the first attempt here outlasts it, is abandoned and retried
// under the same key, and the server answers the retry with the first
// execution's result (waiting for it, Config.Wait, if it is still running).
// The charge is made once.
func ExampleTransport_attemptTimeout() {
	var charges atomic.Int32
	engine, err := idem.New(memory.New(memory.Config{}), idem.Config{Wait: 5 * time.Second})
	if err != nil {
		panic(err)
	}
	api := httptest.NewServer(engine.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := charges.Add(1)
		// A payment provider slower than the client's patience, whatever
		// the machine's speed: it answers once the client has given up on
		// the attempt (its connection closed).
		<-r.Context().Done()
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":"ch_%d"}`, n)
	})))
	defer api.Close()

	c := &http.Client{
		Transport: &client.Transport{AttemptTimeout: 100 * time.Millisecond, BaseDelay: 10 * time.Millisecond},
		Timeout:   10 * time.Second, // the whole call, every attempt and wait
	}
	resp, err := c.Post(api.URL+"/v1/charges", "application/json", strings.NewReader(`{"amount":100}`))
	if err != nil {
		panic(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Println(resp.StatusCode, string(body), "replayed:", client.Replayed(resp), "charges:", charges.Load())
	// Output:
	// 201 {"id":"ch_1"} replayed: true charges: 1
}
