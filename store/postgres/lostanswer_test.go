package postgres_test

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/postgres"
)

// TestLostReservationAnswer cuts the connection between the engine and
// PostgreSQL after the server committed a reservation and before its
// answer reached the engine: the statement's row went out, and the server
// then committed and said so (ReadyForQuery), but the engine only sees the
// connection drop. The engine reads the record back on a new connection,
// finds it in progress under its own owner, and releases it; the client's
// retry then runs the request, once.
func TestLostReservationAnswer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	relay, s, _, runs, send := lostSetup(t, `"lost"`)

	relay.arm()
	if code := send(); code != http.StatusServiceUnavailable {
		t.Fatalf("the request whose reservation's answer was lost: %d, want 503", code)
	}
	if !relay.cut.Load() {
		t.Fatal("the relay never cut a connection")
	}
	r, err := s.Get(ctx, "0:POST "+engineRoute, "lost")
	if err != nil {
		t.Fatalf("the reservation was not committed: %v", err)
	}
	if r.State != store.StateFailedRetryable || r.LastError != "reservation_unacknowledged" {
		t.Fatalf("the reservation whose answer was lost: %s %q, want failed_retryable reservation_unacknowledged", r.State, r.LastError)
	}
	if code := send(); code != http.StatusCreated {
		t.Fatalf("the retry: %d, want 201", code)
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("the handler ran %d times, want 1", n)
	}
}

// TestLostReservationAnswerWhileServerAway cuts the connection as
// TestLostReservationAnswer does, and the server then stays out of reach
// for a while, as in a failover: the engine cannot read the record back,
// and remembers the reservation. Once the server answers again, the
// client's retry reads it back first, releases it, and runs the request,
// once.
func TestLostReservationAnswerWhileServerAway(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	relay, _, direct, runs, send := lostSetup(t, `"away"`)

	relay.down.Store(true) // from the cut on
	relay.arm()
	if code := send(); code != http.StatusServiceUnavailable {
		t.Fatalf("the request whose reservation's answer was lost: %d, want 503", code)
	}
	if !relay.cut.Load() {
		t.Fatal("the relay never cut a connection")
	}
	r, err := direct.Get(ctx, "0:POST "+engineRoute, "away")
	if err != nil || r.State != store.StateInProgress {
		t.Fatalf("while the server is away, the reservation: %s %v, want in_progress", r.State, err)
	}
	if code := send(); code != http.StatusServiceUnavailable {
		t.Fatalf("a retry while the server is away: %d, want 503", code)
	}
	relay.down.Store(false)
	if code := send(); code != http.StatusCreated {
		t.Fatalf("the retry once the server is back: %d, want 201", code)
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("the handler ran %d times, want 1", n)
	}
	if r, err := direct.Get(ctx, "0:POST "+engineRoute, "away"); err != nil || r.State != store.StateCompleted {
		t.Fatalf("the record: %s %v, want completed", r.State, err)
	}
}

// lostSetup opens a store that reaches PostgreSQL through a
// cuttingRelay, and one on the same schema that does not (direct), and
// returns send, which posts one request with key through an engine over
// the first, to a handler that counts its runs.
func lostSetup(t *testing.T, key string) (relay *cuttingRelay, s, direct *postgres.Store, runs *atomic.Int64, send func() int) {
	t.Helper()
	ctx := context.Background()
	relay = newCuttingRelay(t, testURL(t))
	schema := newSchema(t)
	var err error
	if s, err = postgres.Open(ctx, relay.url, postgres.Config{Schema: schema}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	if direct, err = postgres.Open(ctx, testURL(t), postgres.Config{Schema: schema}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = direct.Close() })
	runs = new(atomic.Int64)
	h := newEngine(t, s).Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	send = func() int {
		r := httptest.NewRequest(http.MethodPost, engineURL, strings.NewReader(engineReqBody))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Idempotency-Key", key)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code
	}
	return relay, s, direct, runs, send
}

// cuttingRelay relays TCP connections to a PostgreSQL server. Once armed,
// it closes the connection that carries the first statement answered with
// a row, instead of passing on the ReadyForQuery that follows it: the
// server has committed the statement's implicit transaction by then.
// While down is set after a cut, it closes every connection at once, as
// a server out of reach.
type cuttingRelay struct {
	url   string
	armed atomic.Bool
	cut   atomic.Bool
	down  atomic.Bool
}

func newCuttingRelay(t *testing.T, target string) *cuttingRelay {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	server := u.Host
	if u.Port() == "" {
		server = net.JoinHostPort(u.Hostname(), "5432")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	u.Host = ln.Addr().String()
	q := u.Query()
	q.Set("sslmode", "disable")
	u.RawQuery = q.Encode()
	r := &cuttingRelay{url: u.String()}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				r.relay(c, server)
			}()
		}
	}()
	return r
}

func (r *cuttingRelay) arm() { r.armed.Store(true) }

func (r *cuttingRelay) relay(client net.Conn, server string) {
	defer client.Close()
	if r.cut.Load() && r.down.Load() {
		return
	}
	s, err := net.Dial("tcp", server)
	if err != nil {
		return
	}
	defer s.Close()
	go func() {
		_, _ = io.Copy(s, client)
		s.Close()
	}()
	// Server to client, message by message: a type byte, then a length
	// that counts itself.
	sawRow := false
	head := make([]byte, 5)
	for {
		if _, err := io.ReadFull(s, head); err != nil {
			return
		}
		body := make([]byte, int(binary.BigEndian.Uint32(head[1:]))-4)
		if _, err := io.ReadFull(s, body); err != nil {
			return
		}
		switch head[0] {
		case 'D':
			sawRow = true
		case 'Z':
			if sawRow && r.armed.CompareAndSwap(true, false) {
				r.cut.Store(true)
				return // the commit's answer is lost with the connection
			}
			sawRow = false
		}
		if _, err := client.Write(append(head, body...)); err != nil {
			return
		}
	}
}
