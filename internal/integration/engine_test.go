package integration_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/testkit/enginetest"
	"github.com/idem-go/idem/internal/testkit/obstest"
	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/memory"
)

// Every 2xx/3xx/4xx a client receives is the answer every later retry
// replays: answers are stored before they are sent, completion survives
// transient store failures, and clients racing with the same key (one
// retrying the moment it got its large answer) never see anything but
// 409 before the answer and the same answer after it. On every store.
func TestAcknowledgedAnswersAreReplayed(t *testing.T) {
	t.Parallel()
	for _, ns := range engineStores(t) {
		t.Run(ns.Name, func(t *testing.T) {
			t.Parallel()
			s := &enginetest.Flaky{Store: ns.Open(t, nil)}
			e, err := idem.New(s, idem.Config{Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			var executions atomic.Int64
			srv := httptest.NewServer(e.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				n := executions.Add(1)
				w.Header().Set("Content-Type", "text/plain")
				w.WriteHeader(http.StatusCreated)
				// 900 KB, different for every execution: a second
				// execution could not pass for the first.
				fmt.Fprintf(w, "execution %d\n", n)
				w.Write(bytes.Repeat([]byte("x"), 900<<10))
			})))
			defer srv.Close()
			send := func(key string) (int, []byte) {
				req, _ := http.NewRequest("POST", srv.URL+"/v1/exports", strings.NewReader(`{"q":1}`))
				req.Header.Set("Idempotency-Key", key)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Error(err)
					return 0, nil
				}
				defer resp.Body.Close()
				b, err := io.ReadAll(resp.Body)
				if err != nil {
					t.Error(err)
				}
				return resp.StatusCode, b
			}
			for round := range 3 {
				key := fmt.Sprintf("export-%d", round)
				// Completion fails twice and renewals once before they
				// succeed: a database blip while the answer is recorded.
				s.FailCompletes.Store(2)
				s.FailExtends.Store(1)
				var mu sync.Mutex
				var answers [][]byte
				var wg sync.WaitGroup
				for range 4 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for {
							code, body := send(key)
							if code == http.StatusConflict {
								continue // in flight: retry, as a client would
							}
							if code != http.StatusCreated {
								t.Errorf("answer %d: %.80s", code, body)
								return
							}
							// Retry the moment the answer arrived.
							again, replayed := send(key)
							if again != http.StatusCreated || !bytes.Equal(replayed, body) {
								t.Errorf("retry right after a %d-byte answer: %d with %d bytes", len(body), again, len(replayed))
							}
							mu.Lock()
							answers = append(answers, body)
							mu.Unlock()
							return
						}
					}()
				}
				wg.Wait()
				_, final := send(key)
				for _, a := range answers {
					if !bytes.Equal(a, final) {
						t.Fatalf("a client got an answer (%.20q) that retries do not replay (%.20q)", a, final)
					}
				}
			}
			if n := executions.Load(); n != 3 {
				t.Fatalf("%d executions for 3 keys", n)
			}
			if s.Completes.Load() < 9 {
				t.Fatalf("%d completion attempts, want the failed ones retried", s.Completes.Load())
			}
		})
	}
}

// refusingStore answers every reservation as a store whose own limits the
// request breaks.
type refusingStore struct{ store.Store }

func (refusingStore) Reserve(context.Context, store.ReserveParams) (store.ReserveResult, error) {
	return store.ReserveResult{}, errors.Join(store.ErrInvalidParams, errors.New("scope holds a byte the column refuses"))
}

// A path that cannot name a record is the client's error, never a store
// outage: 414 for a scope too long, 400 for bytes that are not UTF-8,
// without an ERROR log or a store-error metric, on every store.
func TestPathsThatCannotNameARecord(t *testing.T) {
	t.Parallel()
	stores := engineStores(t)
	stores = append(stores, enginetest.Store{Name: "refusing", Open: func(t *testing.T, clock store.Clock) store.Store {
		return refusingStore{memory.New(memory.Config{})}
	}})
	for _, ns := range stores {
		t.Run(ns.Name, func(t *testing.T) {
			t.Parallel()
			logs := &enginetest.Logs{}
			obs := &obstest.Recorder{}
			e, err := idem.New(ns.Open(t, nil), idem.Config{Logger: slog.New(logs), Observer: obs})
			if err != nil {
				t.Fatal(err)
			}
			var calls atomic.Int64
			h := e.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				calls.Add(1)
				w.WriteHeader(201)
			}))
			send := func(target string) *httptest.ResponseRecorder {
				r := httptest.NewRequest("POST", target, strings.NewReader(`{}`))
				r.Header.Set("Idempotency-Key", "k")
				w := httptest.NewRecorder()
				h.ServeHTTP(w, r)
				return w
			}
			if ns.Name == "refusing" {
				// As often as would open the breaker were it fed: it
				// is not, and no refusal says to come back later.
				for range idem.DefaultBreakerFailures + 1 {
					w := send("/ok")
					enginetest.WantProblem(t, w, 400, "scope-invalid")
					if ra := w.Header().Get("Retry-After"); ra != "" {
						t.Fatalf("a refusal of the client's request with Retry-After %s", ra)
					}
				}
			} else {
				enginetest.WantProblem(t, send("/"+strings.Repeat("a", 3000)), 414, "scope-too-long")
				enginetest.WantProblem(t, send("/bad%FFpath"), 400, "scope-invalid")
				// The query is not part of the scope: its bytes are only hashed.
				if w := send("/fine?q=%FF%00"); w.Code != 201 {
					t.Fatalf("invalid UTF-8 in the query: %d %s", w.Code, w.Body)
				}
				if calls.Load() != 1 {
					t.Fatalf("handler ran %d times, want 1", calls.Load())
				}
			}
			if errs := logs.At(slog.LevelError); len(errs) != 0 {
				t.Fatalf("ERROR records for a client's bad request: %q", errs)
			}
			if errs := obs.StoreErrors(); len(errs) != 0 {
				t.Fatalf("store errors counted for a client's bad request: %v", errs)
			}
			if n := obs.Reserves()["rejected"]; n == 0 {
				t.Fatalf("refusals not counted as rejected: %v", obs.Reserves())
			}
		})
	}
}
