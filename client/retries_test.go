package client_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/client"
	"github.com/idem-go/idem/internal/testkit/clienttest"
)

// Without Sleep, the transport really waits between attempts: a wait of
// an hour is ended by the request's context, and no other attempt is made
// meanwhile.
func TestDefaultSleepWaits(t *testing.T) {
	t.Parallel()
	a := &api{}
	srv, _ := server(t, a, idem.Config{}, failFirst(100, 503))
	tr, tracker := clienttest.NewTransport(t, clienttest.NewClock())
	tr.Sleep = nil
	tr.BaseDelay, tr.MaxBackoff, tr.MaxDelay = time.Hour, time.Hour, 10*time.Hour
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tr.OnRetry = func(client.Retry) { time.AfterFunc(10*time.Millisecond, cancel) }
	_, _, err := clienttest.Post(t, ctx, tr, srv.URL+"/v1/charges", `{}`)
	var ce *client.Error
	if !errors.Is(err, context.Canceled) || !errors.As(err, &ce) || ce.Attempts != 1 {
		t.Fatalf("err %v; want the context's end during the first wait", err)
	}
	checkOneKey(t, a, `"`+ce.Key+`"`, 1)
	clienttest.CheckAllClosed(t, tracker)
}

// A Base that hands back a response whose Request is not the attempt's (a
// recording or stubbing round tripper that builds its own response) does
// not hide what the transport did: Key and Attempts still read it.
func TestKeyAndAttemptsWhateverBaseSetsAsRequest(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		request func(*http.Request) *http.Request
	}{
		{"no request", func(*http.Request) *http.Request { return nil }},
		{"another request", func(r *http.Request) *http.Request { return r.WithContext(context.Background()) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			a := &api{}
			srv, _ := server(t, a, idem.Config{}, failFirst(1, 503))
			tr, tracker := clienttest.NewTransport(t, clienttest.NewClock())
			base := tr.Base
			tr.Base = roundTripFunc(func(r *http.Request) (*http.Response, error) {
				resp, err := base.RoundTrip(r)
				if resp != nil {
					resp.Request = tc.request(r)
				}
				return resp, err
			})
			resp, _, err := clienttest.Post(t, context.Background(), tr, srv.URL+"/v1/charges", `{"amount":1}`)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != http.StatusCreated || client.Attempts(resp) != 2 {
				t.Errorf("got %d after %d attempts, want 201 after 2", resp.StatusCode, client.Attempts(resp))
			}
			key := client.Key(resp)
			if !uuidV4.MatchString(key) {
				t.Fatalf("Key %q", key)
			}
			checkOneKey(t, a, `"`+key+`"`, 2)
			clienttest.CheckAllClosed(t, tracker)
		})
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// Any RFC 9110 token names the key's header, whatever its letters, digits
// and punctuation; a name that is not a token refuses every request.
func TestHeaderNames(t *testing.T) {
	t.Parallel()
	var got atomic.Value
	var name atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.Store(r.Header.Get(name.Load().(string)))
	}))
	defer srv.Close()
	for _, h := range []string{"a", "z", "A", "Z", "0", "9", "Key-a9", "!", "~", "Key.v2_#$%&'*+^`|"} {
		name.Store(h)
		got.Store("")
		tr, _ := clienttest.NewTransport(t, clienttest.NewClock())
		tr.Header = h
		req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("{}"))
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Errorf("Header %q: %v", h, err)
			continue
		}
		resp.Body.Close()
		if k := client.Key(resp); !uuidV4.MatchString(k) || got.Load() != `"`+k+`"` {
			t.Errorf("Header %q: Key %q, server got %q", h, k, got.Load())
		}
	}
	for _, h := range []string{"Key@", "Key[", "Key{", "Key:", "Key/", `Key"`, "Kéy"} {
		tr, _ := clienttest.NewTransport(t, clienttest.NewClock())
		tr.Header = h
		req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("{}"))
		if _, err := tr.RoundTrip(req); err == nil || !strings.Contains(err.Error(), "Header") {
			t.Errorf("Header %q: err %v, want the field named", h, err)
		}
	}
}

// A body without GetBody of up to MaxBufferBytes, its length known or not,
// is kept and sent again on a retry; one byte more, and it is sent once.
func TestBodyAtMaxBufferBytes(t *testing.T) {
	t.Parallel()
	const payload = `{"amount":100,"currency":"eur"}`
	for _, tc := range []struct {
		name     string
		limit    int64
		length   int64 // the request's ContentLength; 0: unknown
		attempts int
	}{
		{"at the limit, length known", int64(len(payload)), int64(len(payload)), 2},
		{"at the limit, length unknown", int64(len(payload)), 0, 2},
		{"over the limit, length known", int64(len(payload)) - 1, int64(len(payload)), 1},
		{"over the limit, length unknown", int64(len(payload)) - 1, 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			a := &api{}
			srv, _ := server(t, a, idem.Config{}, failFirst(1, 503))
			tr, tracker := clienttest.NewTransport(t, clienttest.NewClock())
			tr.MaxBufferBytes = tc.limit
			req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/charges", &onlyReader{r: strings.NewReader(payload)})
			req.ContentLength = tc.length
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if client.Attempts(resp) != tc.attempts {
				t.Errorf("%d after %d attempts, want %d attempts", resp.StatusCode, client.Attempts(resp), tc.attempts)
			}
			for i, r := range a.received() {
				if r.body != payload {
					t.Errorf("attempt %d sent %q", i+1, r.body)
				}
			}
			clienttest.CheckAllClosed(t, tracker)
		})
	}
}

// An answer that arrives just as its attempt's time runs out is abandoned
// like a late one: it is closed, not left open, and the attempt is retried
// under the same key, which gets the stored answer of the execution it
// started.
func TestAttemptTimeoutAsTheAnswerArrives(t *testing.T) {
	t.Parallel()
	a := &api{}
	srv, _ := server(t, a, idem.Config{}, nil)
	tr, tracker := clienttest.NewTransport(t, clienttest.NewClock())
	tr.AttemptTimeout = time.Second
	var timers atomic.Int32
	client.SetAttemptTimer(tr, func(d time.Duration, f func()) func() bool {
		if timers.Add(1) > 1 {
			return func() bool { return true }
		}
		// The first timer fires when the attempt is done, before it is
		// stopped.
		return func() bool { f(); return false }
	})
	var retries []client.Retry
	tr.OnRetry = func(x client.Retry) { retries = append(retries, x) }
	resp, body, err := clienttest.Post(t, context.Background(), tr, srv.URL+"/v1/charges", `{"amount":1}`)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusCreated || string(body) != `{"id":"ch_1"}` || !client.Replayed(resp) || client.Attempts(resp) != 2 {
		t.Fatalf("got %d %s replayed=%v after %d attempts", resp.StatusCode, body, client.Replayed(resp), client.Attempts(resp))
	}
	if len(retries) != 1 || !errors.Is(retries[0].Err, client.ErrAttemptTimeout) {
		t.Errorf("retries %+v, want one after ErrAttemptTimeout", retries)
	}
	if n := a.executions.Load(); n != 1 {
		t.Errorf("%d executions, want 1", n)
	}
	checkOneKey(t, a, `"`+client.Key(resp)+`"`, 2)
	clienttest.CheckAllClosed(t, tracker)
}
