package client_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/client"
	"github.com/idem-go/idem/internal/testkit/clienttest"
	"github.com/idem-go/idem/store"
)

var uuidV4 = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

// checkOneKey checks that every request the server received carried the
// key the transport reports, spelled as want.
func checkOneKey(t *testing.T, a *api, want string, n int) {
	t.Helper()
	got := a.received()
	if len(got) != n {
		t.Fatalf("the server received %d requests, want %d", len(got), n)
	}
	for i, r := range got {
		if r.key != want {
			t.Errorf("request %d carried key %q, want %q", i+1, r.key, want)
		}
	}
}

// A connection cut after the server ran the request and before its answer
// reached the client: the retry gets the stored answer, nothing runs twice.
func TestConnectionCutAfterExecution(t *testing.T) {
	t.Parallel()
	a := &api{}
	srv, _ := server(t, a, idem.Config{}, nil)
	r := clienttest.NewRelay(t, srv.Listener.Addr().String())
	r.Drop.Store(1)
	c := clienttest.NewClock()
	tr, tracker := clienttest.NewTransport(t, c)
	var retries []client.Retry
	tr.OnRetry = func(x client.Retry) { retries = append(retries, x) }

	resp, body, err := clienttest.Post(t, context.Background(), tr, r.URL()+"/v1/charges", `{"amount":100}`)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusCreated || string(body) != `{"id":"ch_1"}` {
		t.Fatalf("got %d %s, want the first execution's answer", resp.StatusCode, body)
	}
	if !client.Replayed(resp) || client.Attempts(resp) != 2 {
		t.Errorf("Replayed %v, Attempts %d; want true, 2", client.Replayed(resp), client.Attempts(resp))
	}
	if n := a.executions.Load(); n != 1 {
		t.Errorf("%d executions, want 1", n)
	}
	key := client.Key(resp)
	if !uuidV4.MatchString(key) {
		t.Errorf("Key %q is not a version 4 UUID", key)
	}
	checkOneKey(t, a, `"`+key+`"`, 2)
	if len(retries) != 1 || retries[0].Reason != client.ReasonNetwork || retries[0].Err == nil ||
		retries[0].Attempt != 1 || retries[0].Key != key || retries[0].Delay != client.DefaultBaseDelay {
		t.Errorf("OnRetry got %+v", retries)
	}
	if d := c.Delays(); !slices.Equal(d, []time.Duration{client.DefaultBaseDelay}) {
		t.Errorf("waits %v", d)
	}
	clienttest.CheckAllClosed(t, tracker)
}

// Statuses that say "not now": each retried after the wait the server asks
// for (or the backoff when it asks for none), the request running once.
func TestRetriedStatuses(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		front  func(http.Handler) http.Handler
		reason client.Reason
		waits  []time.Duration
	}{
		{"503 Retry-After", failFirst(2, 503, "Retry-After", "3"), client.ReasonUnavailable, []time.Duration{3 * time.Second, 3 * time.Second}},
		{"503 backoff", failFirst(2, 503), client.ReasonUnavailable, []time.Duration{500 * time.Millisecond, time.Second}},
		{"429", failFirst(1, 429, "Retry-After", "2"), client.ReasonRateLimited, []time.Duration{2 * time.Second}},
		{"409 Retry-After", failFirst(1, 409, "Retry-After", "4"), client.ReasonConflict, []time.Duration{4 * time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			a := &api{}
			srv, _ := server(t, a, idem.Config{}, tc.front)
			c := clienttest.NewClock()
			tr, tracker := clienttest.NewTransport(t, c)
			var reasons []client.Reason
			tr.OnRetry = func(x client.Retry) { reasons = append(reasons, x.Reason) }
			resp, body, err := clienttest.Post(t, context.Background(), tr, srv.URL+"/v1/charges", `{"amount":100}`)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != http.StatusCreated || string(body) != `{"id":"ch_1"}` || client.Replayed(resp) {
				t.Fatalf("got %d %s replayed=%v", resp.StatusCode, body, client.Replayed(resp))
			}
			if got, want := client.Attempts(resp), len(tc.waits)+1; got != want {
				t.Errorf("Attempts %d, want %d", got, want)
			}
			if n := a.executions.Load(); n != 1 {
				t.Errorf("%d executions, want 1", n)
			}
			if d := c.Delays(); !slices.Equal(d, tc.waits) {
				t.Errorf("waits %v, want %v", d, tc.waits)
			}
			for _, r := range reasons {
				if r != tc.reason {
					t.Errorf("reason %q, want %q", r, tc.reason)
				}
			}
			checkOneKey(t, a, `"`+client.Key(resp)+`"`, len(tc.waits)+1)
			clienttest.CheckAllClosed(t, tracker)
		})
	}
}

func TestRetryAfterDate(t *testing.T) {
	t.Parallel()
	c := clienttest.NewClock()
	// The first failure asks for 7s from now; the second comes when that
	// date has passed, so only the backoff (1s) is left.
	date := c.Now().Add(7 * time.Second).Format(http.TimeFormat)
	a := &api{}
	srv, _ := server(t, a, idem.Config{}, failFirst(2, 503, "Retry-After", date))
	tr, _ := clienttest.NewTransport(t, c)
	resp, _, err := clienttest.Post(t, context.Background(), tr, srv.URL+"/v1/charges", `{}`)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusCreated || client.Attempts(resp) != 3 {
		t.Fatalf("got %d after %d attempts", resp.StatusCode, client.Attempts(resp))
	}
	if d := c.Delays(); !slices.Equal(d, []time.Duration{7 * time.Second, time.Second}) {
		t.Errorf("waits %v, want [7s 1s]", d)
	}
}

// A retry that meets its own first attempt still running waits, then gets
// the replay: here the first attempt's connection was cut while the handler
// ran, so the only way to its answer is the store.
func TestInProgressAfterCut(t *testing.T) {
	t.Parallel()
	a := &api{}
	release := make(chan struct{})
	var r *clienttest.Relay
	a.during = func(n int32) {
		if n == 1 {
			r.CutClients()
			<-release
		}
	}
	srv, _ := server(t, a, idem.Config{}, nil)
	r = clienttest.NewRelay(t, srv.Listener.Addr().String())
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	t.Cleanup(free) // a failing test must not leave the handler blocked
	c := clienttest.NewClock()
	tr, tracker := clienttest.NewTransport(t, c)
	var reasons []client.Reason
	var statuses []int
	tr.OnRetry = func(x client.Retry) {
		reasons = append(reasons, x.Reason)
		statuses = append(statuses, x.Status)
		if x.Reason == client.ReasonInProgress {
			free()
		}
	}
	c.OnSleep = func(ctx context.Context, d time.Duration) error {
		if reasons[len(reasons)-1] == client.ReasonInProgress {
			<-r.Dropped // the first execution answered: its record is complete
		}
		return nil
	}
	resp, body, err := clienttest.Post(t, context.Background(), tr, r.URL()+"/v1/charges", `{"amount":100}`)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusCreated || string(body) != `{"id":"ch_1"}` || !client.Replayed(resp) {
		t.Fatalf("got %d %s replayed=%v", resp.StatusCode, body, client.Replayed(resp))
	}
	if n := a.executions.Load(); n != 1 {
		t.Errorf("%d executions, want 1", n)
	}
	if want := []client.Reason{client.ReasonNetwork, client.ReasonInProgress}; !slices.Equal(reasons, want) || statuses[1] != http.StatusConflict {
		t.Errorf("reasons %v statuses %v, want %v", reasons, statuses, want)
	}
	if client.Attempts(resp) != 3 {
		t.Errorf("Attempts %d, want 3", client.Attempts(resp))
	}
	// The 409 asked for 1s, more than the second backoff (1s): the wait
	// honours both.
	if d := c.Delays(); !slices.Equal(d, []time.Duration{500 * time.Millisecond, time.Second}) {
		t.Errorf("waits %v", d)
	}
	checkOneKey(t, a, `"`+client.Key(resp)+`"`, 3)
	clienttest.CheckAllClosed(t, tracker)
}

// Two callers with one key (a double click, two workers): the second waits
// for the first and gets its answer, in either error dialect.
func TestInProgressConcurrentCallers(t *testing.T) {
	t.Parallel()
	// Every answer mode of a duplicate in flight: ietf 409, ietf 202,
	// stripe 429 lock_timeout (its default), stripe 409
	// idempotency_key_in_use.
	for _, tc := range []struct {
		name   string
		cfg    idem.Config
		status int
	}{
		{"ietf 409", idem.Config{}, http.StatusConflict},
		{"ietf 202", idem.Config{InProgressStatus: http.StatusAccepted}, http.StatusAccepted},
		{"stripe 429", idem.Config{Profile: idem.ProfileStripe}, http.StatusTooManyRequests},
		{"stripe 409", idem.Config{Profile: idem.ProfileStripe, InProgressStatus: http.StatusConflict}, http.StatusConflict},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			a := &api{}
			started, release := make(chan struct{}), make(chan struct{})
			a.during = func(n int32) {
				if n == 1 {
					close(started)
					<-release
				}
			}
			srv, _ := server(t, a, tc.cfg, nil)
			var once sync.Once
			free := func() { once.Do(func() { close(release) }) }
			t.Cleanup(free) // a failing test must not leave the handler blocked
			key := client.NewKey()

			type answer struct {
				body []byte
				err  error
			}
			first := make(chan answer, 1)
			plain := &http.Transport{DisableKeepAlives: true}
			go func() {
				req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/charges", strings.NewReader(`{"amount":100}`))
				req.Header.Set("Idempotency-Key", key)
				req.Header.Set("Content-Type", "application/json")
				resp, err := plain.RoundTrip(req)
				if err != nil {
					first <- answer{err: err}
					return
				}
				b, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				first <- answer{b, err}
			}()
			<-started

			c := clienttest.NewClock()
			tr, _ := clienttest.NewTransport(t, c)
			var reasons []client.Reason
			tr.OnRetry = func(x client.Retry) {
				reasons = append(reasons, x.Reason)
				if x.Status != tc.status {
					t.Errorf("retried status %d, want %d", x.Status, tc.status)
				}
				free()
			}
			var got1 answer
			c.OnSleep = func(ctx context.Context, d time.Duration) error {
				got1 = <-first
				return nil
			}
			resp, body, err := clienttest.Post(t, context.Background(), tr, srv.URL+"/v1/charges", `{"amount":100}`, "Idempotency-Key", key)
			if err != nil {
				t.Fatal(err)
			}
			if got1.err != nil {
				t.Fatalf("first caller: %v", got1.err)
			}
			if !client.Replayed(resp) || string(body) != string(got1.body) || client.Attempts(resp) != 2 {
				t.Errorf("second caller got %s replayed=%v after %d attempts; the first got %s",
					body, client.Replayed(resp), client.Attempts(resp), got1.body)
			}
			if !slices.Equal(reasons, []client.Reason{client.ReasonInProgress}) {
				t.Errorf("reasons %v", reasons)
			}
			if n := a.executions.Load(); n != 1 {
				t.Errorf("%d executions, want 1", n)
			}
			if client.Key(resp) != key {
				t.Errorf("Key %q, want the caller's %q", client.Key(resp), key)
			}
		})
	}
}

// The 502 of a request the proxy never sent is retried; other 502s and
// every 504 are returned: the key was released, and a retry would run
// again a request that may have acted behind the gateway. A 202 that is
// not a deferral (an asynchronous acceptance, the application's) is an
// answer.
func TestGatewayErrorsAnd202(t *testing.T) {
	t.Parallel()
	problem := func(status int, slug string) func(http.Handler) http.Handler {
		return func(next http.Handler) http.Handler {
			var seen atomic.Int32
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if seen.Add(1) > 1 {
					next.ServeHTTP(w, r)
					return
				}
				w.Header().Set("Content-Type", "application/problem+json")
				w.WriteHeader(status)
				fmt.Fprintf(w, `{"type":%q,"status":%d}`, idem.ProblemBase+slug, status)
			})
		}
	}
	for _, tc := range []struct {
		name    string
		front   func(http.Handler) http.Handler
		retried bool
	}{
		{"502 upstream-unreachable", problem(502, "upstream-unreachable"), true},
		{"502 upstream-failed", problem(502, "upstream-failed"), false},
		{"502 of the application", failFirst(1, 502, "Retry-After", "1"), false},
		{"504", failFirst(1, 504, "Retry-After", "1"), false},
		{"202 request-accepted", problem(202, "request-accepted"), false},
		{"202 of the application", failFirst(1, 202), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			a := &api{}
			srv, _ := server(t, a, idem.Config{}, tc.front)
			tr, tracker := clienttest.NewTransport(t, clienttest.NewClock())
			resp, _, err := clienttest.Post(t, context.Background(), tr, srv.URL+"/v1/charges", `{"amount":1}`)
			if err != nil {
				t.Fatal(err)
			}
			want, attempts := resp.StatusCode, 1
			if tc.retried {
				want, attempts = http.StatusCreated, 2
			}
			if resp.StatusCode != want || client.Attempts(resp) != attempts {
				t.Errorf("got %d after %d attempts, want %d after %d", resp.StatusCode, client.Attempts(resp), want, attempts)
			}
			clienttest.CheckAllClosed(t, tracker)
		})
	}
}

// firedBy stands in for the timers of AttemptTimeout: the timer of attempt
// i fires when triggers[i-1] is closed, never by itself, and those of
// attempts past the triggers never fire. Each must be d long.
func firedBy(t *testing.T, d time.Duration, triggers ...<-chan struct{}) func(time.Duration, func()) func() bool {
	var started atomic.Int32
	return func(got time.Duration, f func()) func() bool {
		if got != d {
			t.Errorf("an attempt timer of %v, want %v", got, d)
		}
		var trigger <-chan struct{} // nil: never fires
		if i := int(started.Add(1)); i <= len(triggers) {
			trigger = triggers[i-1]
		}
		var state atomic.Int32 // 0 running, 1 fired, 2 stopped
		stopped := make(chan struct{})
		go func() {
			select {
			case <-trigger:
				if state.CompareAndSwap(0, 1) {
					f()
				}
			case <-stopped:
			}
		}()
		return func() bool {
			if !state.CompareAndSwap(0, 2) {
				return false
			}
			close(stopped)
			return true
		}
	}
}

// AttemptTimeout abandons a slow attempt and retries under the same key;
// the server (here waiting for the first execution) answers the retry with
// the first execution's answer, and nothing runs twice. The first
// attempt's timer fires once the server runs that attempt: on a real
// timer, a loaded machine may fire it before the request reserved the key,
// and then the retry is the one that executes.
func TestAttemptTimeout(t *testing.T) {
	t.Parallel()
	a := &api{}
	started, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	t.Cleanup(free)
	a.during = func(n int32) {
		if n == 1 {
			close(started)
			<-release
		}
	}
	srv, _ := server(t, a, idem.Config{Wait: 10 * time.Second}, nil)
	tr, tracker := clienttest.NewTransport(t, clienttest.NewClock())
	tr.AttemptTimeout = 50 * time.Millisecond
	client.SetAttemptTimer(tr, firedBy(t, tr.AttemptTimeout, started))
	var retries []client.Retry
	tr.OnRetry = func(x client.Retry) {
		retries = append(retries, x)
		free() // the first execution ends while the retry waits for it
	}
	resp, body, err := clienttest.Post(t, context.Background(), tr, srv.URL+"/v1/charges", `{"amount":1}`)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusCreated || string(body) != `{"id":"ch_1"}` || !client.Replayed(resp) || client.Attempts(resp) != 2 {
		t.Fatalf("got %d %s replayed=%v after %d attempts", resp.StatusCode, body, client.Replayed(resp), client.Attempts(resp))
	}
	if len(retries) != 1 || retries[0].Reason != client.ReasonNetwork || !errors.Is(retries[0].Err, client.ErrAttemptTimeout) {
		t.Errorf("retries %+v, want one network retry after ErrAttemptTimeout", retries)
	}
	if n := a.executions.Load(); n != 1 {
		t.Errorf("%d executions, want 1", n)
	}
	clienttest.CheckAllClosed(t, tracker)

	// Every attempt too slow, on the real timer: the call ends with the
	// timeout, key kept.
	block := make(chan struct{})
	defer close(block)
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-block }))
	t.Cleanup(slow.Close)
	tr2, _ := clienttest.NewTransport(t, clienttest.NewClock())
	tr2.AttemptTimeout, tr2.MaxAttempts = 20*time.Millisecond, 2
	_, _, err = clienttest.Post(t, context.Background(), tr2, slow.URL, `{}`)
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Attempts != 2 || !errors.Is(err, client.ErrAttemptTimeout) || ce.Key == "" {
		t.Errorf("all attempts slow: %v", err)
	}
}

// An answer whose head arrives and whose problem body then stalls (a
// server or a proxy that stops sending) holds the attempt no longer than
// AttemptTimeout: the transport reads the start of that body to tell the
// answer's case, and that read is part of the attempt. Every attempt times
// out and is retried under the same key, and the call ends with the
// timeout long before its context does.
func TestAttemptTimeoutProblemBodyStalls(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		status int
		slug   string
	}{
		{http.StatusConflict, "request-in-progress"},
		{http.StatusBadGateway, "upstream-unreachable"},
	} {
		t.Run(fmt.Sprint(tc.status), func(t *testing.T) {
			t.Parallel()
			var (
				mu   sync.Mutex
				keys []string
			)
			stall := make(chan struct{})
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				keys = append(keys, r.Header.Get("Idempotency-Key"))
				mu.Unlock()
				w.Header().Set("Content-Type", "application/problem+json")
				w.Header().Set("Content-Length", "4096") // more than is sent
				w.WriteHeader(tc.status)
				fmt.Fprintf(w, `{"type":"https://idem.example/problems.md#%s",`, tc.slug)
				w.(http.Flusher).Flush()
				<-stall
			}))
			t.Cleanup(srv.Close)
			t.Cleanup(func() { close(stall) }) // before srv.Close, which waits for the handlers
			var retries []client.Retry
			resp, tracker, err := attemptTimedCall(t, srv.URL, func(x client.Retry) { retries = append(retries, x) })
			if err == nil {
				resp.Body.Close()
				t.Fatalf("got %d after %d attempts; want the attempt timeout after 3", resp.StatusCode, client.Attempts(resp))
			}
			var ce *client.Error
			if !errors.As(err, &ce) || ce.Attempts != 3 || !errors.Is(err, client.ErrAttemptTimeout) ||
				errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "reading the answer") {
				t.Errorf("err %v; want the attempt timeout while reading the answer, after 3 attempts", err)
			}
			if len(retries) != 2 {
				t.Errorf("retries %+v, want 2", retries)
			}
			for _, x := range retries {
				if x.Reason != client.ReasonNetwork || !errors.Is(x.Err, client.ErrAttemptTimeout) {
					t.Errorf("retry %+v, want a network retry after ErrAttemptTimeout", x)
				}
			}
			mu.Lock()
			got := slices.Clone(keys)
			mu.Unlock()
			if len(got) != 3 {
				t.Fatalf("the server received %d requests, want 3", len(got))
			}
			for i, k := range got {
				if ce != nil && k != `"`+ce.Key+`"` {
					t.Errorf("request %d carried key %s, want %q", i+1, k, ce.Key)
				}
			}
			clienttest.CheckAllClosed(t, tracker)
		})
	}
}

// attemptTimedCall posts to url through a transport whose attempts are
// bounded by AttemptTimeout (200ms, at most 3), on the real clock, within a
// caller's deadline of 10s, and fails the test if that deadline, not the
// attempts' bound, ended the call.
func attemptTimedCall(t *testing.T, url string, onRetry func(client.Retry)) (*http.Response, *clienttest.Tracked, error) {
	t.Helper()
	tr, tracker := clienttest.NewTransport(t, clienttest.NewClock())
	tr.AttemptTimeout, tr.MaxAttempts = 200*time.Millisecond, 3
	tr.Now = time.Now // the deadline is on the real clock
	tr.OnRetry = onRetry
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel) // after the test is done with the response
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(`{"amount":1}`))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := tr.RoundTrip(req)
	if ctx.Err() != nil {
		t.Errorf("the call ended with its context (%v), not with the attempts' bound", ctx.Err())
	}
	return resp, tracker, err
}

// A retried answer whose body stalls after its head (a 503 whose sender
// stopped) is drained before the next attempt for no longer than
// AttemptTimeout: its connection is then closed, and the retries go on.
func TestAttemptTimeoutBoundsTheDrain(t *testing.T) {
	t.Parallel()
	var requests atomic.Int32
	stall := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "0")
		if requests.Add(1) == 3 {
			w.WriteHeader(http.StatusCreated)
			return
		}
		w.Header().Set("Content-Length", "65536") // more than is sent
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, "busy")
		w.(http.Flusher).Flush()
		select {
		case <-stall:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(stall) })
	resp, tracker, err := attemptTimedCall(t, srv.URL, nil)
	if err != nil {
		t.Fatalf("err %v after %d requests, want the third attempt's 201", err, requests.Load())
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated || client.Attempts(resp) != 3 {
		t.Errorf("%d after %d attempts, want 201 after 3", resp.StatusCode, client.Attempts(resp))
	}
	clienttest.CheckAllClosed(t, tracker)
}

// AttemptTimeout ends with the answer the caller gets: the body of a 201 is
// the caller's to read, after RoundTrip returned and as slowly as it comes,
// and is not cut by the timer.
func TestAttemptTimeoutLeavesBodyToCaller(t *testing.T) {
	t.Parallel()
	rest := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"id":`)
		w.(http.Flusher).Flush()
		select {
		case <-rest:
			io.WriteString(w, `"ch_1"}`)
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(srv.Close)
	var once sync.Once
	more := func() { once.Do(func() { close(rest) }) }
	t.Cleanup(more)
	tr, tracker := clienttest.NewTransport(t, clienttest.NewClock())
	tr.AttemptTimeout = 100 * time.Millisecond
	req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, srv.URL, strings.NewReader(`{"amount":1}`))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * tr.AttemptTimeout) // the timer would have fired long ago
	more()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusCreated || string(body) != `{"id":"ch_1"}` {
		t.Errorf("%d %q, err %v; want the whole 201", resp.StatusCode, body, err)
	}
	resp.Body.Close()
	clienttest.CheckAllClosed(t, tracker)
}

// Final answers are returned at once: retrying them could not change them.
func TestNotRetried(t *testing.T) {
	t.Parallel()
	a := &api{}
	srv, _ := server(t, a, idem.Config{}, nil)
	url := srv.URL + "/v1/charges"
	c := clienttest.NewClock()
	tr, tracker := clienttest.NewTransport(t, c)
	tr.OnRetry = func(x client.Retry) { t.Errorf("retried: %+v", x) }

	key := client.NewKey()
	if resp, _, err := clienttest.Post(t, context.Background(), tr, url, `{"amount":1}`, "Idempotency-Key", key); err != nil || resp.StatusCode != 201 {
		t.Fatalf("first use of the key: %v %v", resp, err)
	}
	resp, body, err := clienttest.Post(t, context.Background(), tr, url, `{"amount":2}`, "Idempotency-Key", key)
	if err != nil || resp.StatusCode != http.StatusUnprocessableEntity || client.Attempts(resp) != 1 {
		t.Errorf("key reused with another body: %v %v after %d attempts", resp, err, client.Attempts(resp))
	}
	if !strings.Contains(string(body), "#key-reused") {
		t.Errorf("422 body %s", body)
	}

	resp, _, err = clienttest.Post(t, context.Background(), tr, url, bodyBad)
	if err != nil || resp.StatusCode != http.StatusBadRequest || client.Attempts(resp) != 1 {
		t.Errorf("400: %v %v after %d attempts", resp, err, client.Attempts(resp))
	}

	// An outcome the server cannot know: the 409 is returned whole, with
	// its problem type readable by the caller.
	key = client.NewKey()
	resp, _, err = clienttest.Post(t, context.Background(), tr, url, bodyUncertain, "Idempotency-Key", key)
	if err != nil || resp.StatusCode != http.StatusGatewayTimeout || client.Attempts(resp) != 1 {
		t.Fatalf("uncertain: %v %v", resp, err)
	}
	resp, body, err = clienttest.Post(t, context.Background(), tr, url, bodyUncertain, "Idempotency-Key", key)
	if err != nil || resp.StatusCode != http.StatusConflict || client.Attempts(resp) != 1 {
		t.Fatalf("outcome unknown: %v %v", resp, err)
	}
	if !strings.HasSuffix(jsonField(t, body, "type"), "#outcome-unknown") {
		t.Errorf("409 body %s", body)
	}
	if n := a.executions.Load(); n != 3 {
		t.Errorf("%d executions, want 3 (one per distinct request)", n)
	}
	if d := c.Delays(); len(d) != 0 {
		t.Errorf("waited %v", d)
	}
	clienttest.CheckAllClosed(t, tracker)
}

// A replayed answer is the stored one: a retry with the key would get it
// again, whatever its status, so it ends the call even where the status
// alone (a 503 with Retry-After, stored by a server that keeps 5xx) would
// be retried.
func TestReplayedAnswerNotRetried(t *testing.T) {
	t.Parallel()
	a := &api{}
	srv, _ := server(t, a, idem.Config{StoreServerErrors: true}, nil)
	c := clienttest.NewClock()
	tr, tracker := clienttest.NewTransport(t, c)
	resp, _, err := clienttest.Post(t, context.Background(), tr, srv.URL+"/v1/charges", bodyUnavailable)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusServiceUnavailable || !client.Replayed(resp) || client.Attempts(resp) != 2 {
		t.Errorf("%d replayed=%v after %d attempts; want the replayed 503 after 2", resp.StatusCode, client.Replayed(resp), client.Attempts(resp))
	}
	if n := a.executions.Load(); n != 1 {
		t.Errorf("%d executions, want 1", n)
	}
	if d := c.Delays(); !slices.Equal(d, []time.Duration{time.Second}) {
		t.Errorf("waits %v, want one of 1s", d)
	}
	clienttest.CheckAllClosed(t, tracker)
}

// A plain 409 without Retry-After is a business conflict, not a wait.
func TestPlainConflictWithoutRetryAfter(t *testing.T) {
	t.Parallel()
	a := &api{}
	srv, _ := server(t, a, idem.Config{}, failFirst(1, 409))
	tr, _ := clienttest.NewTransport(t, clienttest.NewClock())
	resp, body, err := clienttest.Post(t, context.Background(), tr, srv.URL+"/v1/charges", `{}`)
	if err != nil || resp.StatusCode != http.StatusConflict || client.Attempts(resp) != 1 || string(body) != "failure 1\n" {
		t.Fatalf("%v %v %q", resp, err, body)
	}
}

// RetryUnknown waits for reconciliation: here an operator settles the
// record during the first wait, or the second, and the retry gets the
// settled answer. The wait doubles after each 409 #outcome-unknown and is
// not capped by MaxBackoff: a caller willing to wait for reconciliation
// does not come back at the pace of a busy server.
func TestRetryUnknown(t *testing.T) {
	t.Parallel()
	for _, settledIn := range []int{1, 2} {
		t.Run(fmt.Sprint("settled during wait ", settledIn), func(t *testing.T) {
			t.Parallel()
			a := &api{}
			srv, st := server(t, a, idem.Config{}, nil)
			url := srv.URL + "/v1/charges"
			c := clienttest.NewClock()
			tr, tracker := clienttest.NewTransport(t, c)
			tr.RetryUnknown = 10 * time.Second
			tr.MaxBackoff = time.Second
			tr.MaxDelay = time.Hour
			key := client.NewKey()
			if resp, _, err := clienttest.Post(t, context.Background(), tr, url, bodyUncertain, "Idempotency-Key", key); err != nil || resp.StatusCode != 504 {
				t.Fatalf("uncertain: %v %v", resp, err)
			}
			var reasons []client.Reason
			tr.OnRetry = func(x client.Retry) { reasons = append(reasons, x.Reason) }
			c.OnSleep = func(ctx context.Context, d time.Duration) error {
				if len(c.Delays()) < settledIn {
					return nil // still unknown at the next attempt
				}
				recs, err := st.ListUnknown(ctx, store.ListUnknownParams{Limit: 10})
				if err != nil || len(recs) != 1 {
					t.Errorf("ListUnknown: %v %v", recs, err)
					return err
				}
				return st.Resolve(ctx, store.ResolveParams{FenceParams: store.FenceParams{Scope: recs[0].Scope, Key: recs[0].Key, Fence: recs[0].Fence}, To: store.StateCompleted,
					Response: &store.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"id":"ch_found"}`)}})
			}
			resp, body, err := clienttest.Post(t, context.Background(), tr, url, bodyUncertain, "Idempotency-Key", key)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != 201 || string(body) != `{"id":"ch_found"}` || !client.Replayed(resp) || client.Attempts(resp) != settledIn+1 {
				t.Errorf("got %d %s replayed=%v after %d attempts, want the settled answer after %d", resp.StatusCode, body, client.Replayed(resp), client.Attempts(resp), settledIn+1)
			}
			wantReasons := []client.Reason{client.ReasonOutcomeUnknown, client.ReasonOutcomeUnknown}[:settledIn]
			if !slices.Equal(reasons, wantReasons) {
				t.Errorf("reasons %v, want %v", reasons, wantReasons)
			}
			if d, want := c.Delays(), []time.Duration{10 * time.Second, 20 * time.Second}[:settledIn]; !slices.Equal(d, want) {
				t.Errorf("waits %v, want %v", d, want)
			}
			if n := a.executions.Load(); n != 1 {
				t.Errorf("%d executions, want 1", n)
			}
			clienttest.CheckAllClosed(t, tracker)
		})
	}
}

func TestMaxAttempts(t *testing.T) {
	t.Parallel()
	a := &api{}
	srv, _ := server(t, a, idem.Config{}, failFirst(100, 503))
	c := clienttest.NewClock()
	tr, tracker := clienttest.NewTransport(t, c)
	tr.MaxAttempts = 3
	resp, body, err := clienttest.Post(t, context.Background(), tr, srv.URL+"/v1/charges", `{}`)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 503 || string(body) != "failure 3\n" || client.Attempts(resp) != 3 {
		t.Errorf("got %d %q after %d attempts; want the third 503 whole", resp.StatusCode, body, client.Attempts(resp))
	}
	if d := c.Delays(); !slices.Equal(d, []time.Duration{500 * time.Millisecond, time.Second}) {
		t.Errorf("waits %v", d)
	}
	clienttest.CheckAllClosed(t, tracker)
}

func TestMaxDelay(t *testing.T) {
	t.Parallel()
	a := &api{}
	srv, _ := server(t, a, idem.Config{}, failFirst(100, 503))
	c := clienttest.NewClock()
	tr, _ := clienttest.NewTransport(t, c)
	tr.BaseDelay, tr.MaxDelay, tr.MaxAttempts = time.Second, 2500*time.Millisecond, 10
	resp, _, err := clienttest.Post(t, context.Background(), tr, srv.URL+"/v1/charges", `{}`)
	if err != nil {
		t.Fatal(err)
	}
	// 1s, then 2s would bring the sum to 3s, past 2.5s.
	if client.Attempts(resp) != 2 || !slices.Equal(c.Delays(), []time.Duration{time.Second}) {
		t.Errorf("%d attempts, waits %v", client.Attempts(resp), c.Delays())
	}
	// A Retry-After beyond the budget is not waited for either.
	a2 := &api{}
	srv2, _ := server(t, a2, idem.Config{}, failFirst(100, 503, "Retry-After", "3600"))
	c2 := clienttest.NewClock()
	tr2, _ := clienttest.NewTransport(t, c2)
	resp, _, err = clienttest.Post(t, context.Background(), tr2, srv2.URL+"/v1/charges", `{}`)
	if err != nil || resp.StatusCode != 503 || client.Attempts(resp) != 1 || len(c2.Delays()) != 0 {
		t.Errorf("Retry-After 3600: %v %v, waits %v", resp, err, c2.Delays())
	}
}

func TestContextBounds(t *testing.T) {
	t.Parallel()
	t.Run("Retry-After past the deadline", func(t *testing.T) {
		t.Parallel()
		a := &api{}
		srv, _ := server(t, a, idem.Config{}, failFirst(100, 503, "Retry-After", "120"))
		c := clienttest.NewClock()
		tr, _ := clienttest.NewTransport(t, c)
		tr.Now = time.Now // the deadline is on the real clock
		tr.MaxDelay = time.Hour
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		resp, _, err := clienttest.Post(t, ctx, tr, srv.URL+"/v1/charges", `{}`)
		if err != nil || resp.StatusCode != 503 || client.Attempts(resp) != 1 || len(c.Delays()) != 0 {
			t.Errorf("%v %v, waits %v; want the 503 at once", resp, err, c.Delays())
		}
	})
	t.Run("cancelled during a wait", func(t *testing.T) {
		t.Parallel()
		a := &api{}
		srv, _ := server(t, a, idem.Config{}, failFirst(100, 503))
		c := clienttest.NewClock()
		tr, tracker := clienttest.NewTransport(t, c)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		c.OnSleep = func(ctx context.Context, d time.Duration) error {
			cancel()
			<-ctx.Done()
			return ctx.Err()
		}
		_, _, err := clienttest.Post(t, ctx, tr, srv.URL+"/v1/charges", `{}`)
		var ce *client.Error
		if !errors.Is(err, context.Canceled) || !errors.As(err, &ce) || ce.Attempts != 1 {
			t.Fatalf("err %v", err)
		}
		checkOneKey(t, a, `"`+ce.Key+`"`, 1)
		clienttest.CheckAllClosed(t, tracker)
	})
	t.Run("deadline during an attempt", func(t *testing.T) {
		t.Parallel()
		a := &api{}
		answered := make(chan struct{})
		a.during = func(int32) { <-answered }
		srv, _ := server(t, a, idem.Config{}, nil)
		defer close(answered)
		c := clienttest.NewClock()
		tr, _ := clienttest.NewTransport(t, c)
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		_, _, err := clienttest.Post(t, ctx, tr, srv.URL+"/v1/charges", `{}`)
		var ce *client.Error
		if !errors.Is(err, context.DeadlineExceeded) || !errors.As(err, &ce) || ce.Attempts != 1 || len(c.Delays()) != 0 {
			t.Fatalf("err %v, waits %v", err, c.Delays())
		}
	})
}

// onlyReader is a body http.NewRequest cannot rewind: no GetBody.
type onlyReader struct {
	r      io.Reader
	closed atomic.Int32
}

func (b *onlyReader) Read(p []byte) (int, error) { return b.r.Read(p) }
func (b *onlyReader) Close() error               { b.closed.Add(1); return nil }

func TestBodyWithoutGetBody(t *testing.T) {
	t.Parallel()
	const payload = `{"amount":100,"currency":"eur"}`
	t.Run("buffered and replayed", func(t *testing.T) {
		t.Parallel()
		a := &api{}
		srv, _ := server(t, a, idem.Config{}, failFirst(2, 503))
		tr, _ := clienttest.NewTransport(t, clienttest.NewClock())
		body := &onlyReader{r: strings.NewReader(payload)}
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/charges", body)
		if req.GetBody != nil {
			t.Fatal("the test needs a body without GetBody")
		}
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 201 || client.Attempts(resp) != 3 {
			t.Fatalf("%d after %d attempts", resp.StatusCode, client.Attempts(resp))
		}
		for i, r := range a.received() {
			if r.body != payload {
				t.Errorf("attempt %d sent %q", i+1, r.body)
			}
		}
		if n := body.closed.Load(); n != 1 {
			t.Errorf("the caller's body was closed %d times", n)
		}
	})
	t.Run("too large to buffer: sent once", func(t *testing.T) {
		t.Parallel()
		a := &api{}
		srv, _ := server(t, a, idem.Config{}, failFirst(100, 503))
		tr, _ := clienttest.NewTransport(t, clienttest.NewClock())
		tr.MaxBufferBytes = 8
		body := &onlyReader{r: strings.NewReader(payload)}
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/charges", body)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 503 || client.Attempts(resp) != 1 {
			t.Errorf("%d after %d attempts; want the 503 of the only attempt", resp.StatusCode, client.Attempts(resp))
		}
		if got := a.received(); len(got) != 1 || got[0].body != payload {
			t.Errorf("the server received %+v", got)
		}
		if n := body.closed.Load(); n != 1 {
			t.Errorf("the caller's body was closed %d times", n)
		}
	})
}

// A body without GetBody is read before the first attempt; a source that
// blocks does not hold the call past its context, as net/http's own
// transport does not.
func TestBodyWithoutGetBodyContextEnds(t *testing.T) {
	t.Parallel()
	a := &api{}
	srv, _ := server(t, a, idem.Config{}, nil)
	tr, _ := clienttest.NewTransport(t, clienttest.NewClock())
	src, feed := io.Pipe()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/charges", src)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		resp, err := tr.RoundTrip(req)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		var ce *client.Error
		if !errors.Is(err, context.DeadlineExceeded) || !errors.As(err, &ce) || ce.Attempts != 0 {
			t.Errorf("err %v; want the context's error before any attempt", err)
		}
	case <-time.After(5 * time.Second):
		feed.Close() // lets the call end
		<-done
		t.Fatal("the call outlived its context by 5s, waiting for the body")
	}
	if got := a.received(); len(got) != 0 {
		t.Errorf("the server received %+v", got)
	}
}

// Every attempt failed to connect: the error carries the key, so the
// caller can come back later without risking a second execution.
func TestNetworkErrorsExhausted(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there any more
	c := clienttest.NewClock()
	tr, _ := clienttest.NewTransport(t, c)
	tr.MaxAttempts = 3
	var errs int
	tr.OnRetry = func(x client.Retry) {
		if x.Err != nil && x.Reason == client.ReasonNetwork && x.Status == 0 {
			errs++
		}
	}
	_, _, err = clienttest.Post(t, context.Background(), tr, "http://"+addr+"/v1/charges", `{}`)
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Attempts != 3 || !uuidV4.MatchString(ce.Key) {
		t.Fatalf("err %v", err)
	}
	var op *net.OpError
	if !errors.As(err, &op) {
		t.Errorf("the last attempt's error is not wrapped: %v", err)
	}
	if errs != 2 || !slices.Equal(c.Delays(), []time.Duration{500 * time.Millisecond, time.Second}) {
		t.Errorf("%d retries, waits %v", errs, c.Delays())
	}
}

// A certificate the client refuses will be refused again: not retried.
func TestTLSErrorNotRetried(t *testing.T) {
	t.Parallel()
	srv := httptest.NewTLSServer(http.NotFoundHandler())
	defer srv.Close()
	c := clienttest.NewClock()
	tr, _ := clienttest.NewTransport(t, c)
	_, _, err := clienttest.Post(t, context.Background(), tr, srv.URL+"/v1/charges", `{}`)
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Attempts != 1 || len(c.Delays()) != 0 {
		t.Fatalf("err %v, waits %v", err, c.Delays())
	}
}

// A key the caller set under another spelling of the header's name (a
// direct map write) is the caller's key: the transport adds none of its
// own, which would send two and get 400.
func TestCallerKeyAnySpelling(t *testing.T) {
	t.Parallel()
	a := &api{}
	srv, _ := server(t, a, idem.Config{}, failFirst(1, 503))
	tr, _ := clienttest.NewTransport(t, clienttest.NewClock())
	req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/charges", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header["idempotency-key"] = []string{`"order-43"`}
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 201 || client.Key(resp) != "order-43" {
		t.Fatalf("%d, Key %q", resp.StatusCode, client.Key(resp))
	}
	checkOneKey(t, a, `"order-43"`, 2)
}

func TestCallerKey(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ sent, key string }{
		{"order-42", "order-42"},
		{`"order-42"`, "order-42"},
		{`"say \"hi\""`, `say "hi"`},
	} {
		a := &api{}
		srv, _ := server(t, a, idem.Config{}, failFirst(1, 503))
		tr, _ := clienttest.NewTransport(t, clienttest.NewClock())
		resp, _, err := clienttest.Post(t, context.Background(), tr, srv.URL+"/v1/charges", `{}`, "Idempotency-Key", tc.sent)
		if err != nil || resp.StatusCode != 201 {
			t.Fatalf("%s: %v %v", tc.sent, resp, err)
		}
		if client.Key(resp) != tc.key {
			t.Errorf("%s: Key %q, want %q", tc.sent, client.Key(resp), tc.key)
		}
		checkOneKey(t, a, tc.sent, 2) // kept as the caller spelled it
	}
}

func TestMalformedCallerKey(t *testing.T) {
	t.Parallel()
	a := &api{}
	srv, _ := server(t, a, idem.Config{}, nil)
	tr, _ := clienttest.NewTransport(t, clienttest.NewClock())
	for _, vals := range [][]string{{"a", "b"}, {""}, {"has space"}, {strings.Repeat("k", 256)}} {
		body := &onlyReader{r: strings.NewReader("{}")}
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/charges", body)
		req.Header["Idempotency-Key"] = vals
		_, err := tr.RoundTrip(req)
		if err == nil || !strings.Contains(err.Error(), "Idempotency-Key") {
			t.Errorf("%q: err %v", vals, err)
		}
		if body.closed.Load() != 1 {
			t.Errorf("%q: the body was not closed", vals)
		}
	}
	if got := a.received(); len(got) != 0 {
		t.Errorf("sent %+v", got)
	}
}

func TestOtherMethodsPassThrough(t *testing.T) {
	t.Parallel()
	a := &api{}
	srv, _ := server(t, a, idem.Config{}, nil)
	tr, _ := clienttest.NewTransport(t, clienttest.NewClock())
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/v1/charges", nil)
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if client.Attempts(resp) != 0 || client.Key(resp) != "" {
		t.Errorf("GET: Attempts %d, Key %q", client.Attempts(resp), client.Key(resp))
	}
	if got := a.received(); len(got) != 1 || got[0].key != "" {
		t.Errorf("received %+v", got)
	}
	if client.Attempts(nil) != 0 || client.Key(nil) != "" || client.Replayed(nil) {
		t.Error("a nil response reports something")
	}
}

func TestCustomHeaderAndMethods(t *testing.T) {
	t.Parallel()
	var got atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.Store(r.Header.Get("X-Request-Key"))
	}))
	defer srv.Close()
	tr, _ := clienttest.NewTransport(t, clienttest.NewClock())
	tr.Header, tr.Methods = "X-Request-Key", []string{"put"}
	req, _ := http.NewRequest(http.MethodPut, srv.URL, strings.NewReader("{}"))
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if k := client.Key(resp); !uuidV4.MatchString(k) || got.Load() != `"`+k+`"` {
		t.Errorf("Key %q, server got %q", k, got.Load())
	}
}

func TestInvalidSettings(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		tr    client.Transport
		field string
	}{
		{client.Transport{MaxAttempts: -1}, "MaxAttempts"},
		{client.Transport{MaxDelay: -1}, "MaxDelay"},
		{client.Transport{BaseDelay: -1}, "BaseDelay"},
		{client.Transport{MaxBackoff: -1}, "MaxBackoff"},
		{client.Transport{RetryUnknown: -time.Second}, "RetryUnknown"},
		{client.Transport{Header: "Idempotency Key"}, "Header"},
	} {
		body := &onlyReader{r: strings.NewReader("{}")}
		req, _ := http.NewRequest(http.MethodPost, "http://127.0.0.1:1/", body)
		_, err := tc.tr.RoundTrip(req)
		if err == nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%s: err %v", tc.field, err)
		}
		if body.closed.Load() != 1 {
			t.Errorf("%s: the body was not closed", tc.field)
		}
	}
}

func TestNewKey(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for range 1000 {
		k := client.NewKey()
		if !uuidV4.MatchString(k) || seen[k] {
			t.Fatalf("NewKey() = %q (seen before: %v)", k, seen[k])
		}
		seen[k] = true
	}
}
