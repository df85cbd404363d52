package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-go/idem/internal/testkit/pgdb"
	"github.com/idem-go/idem/internal/testkit/testenv"
	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/postgres"
)

// blockedCall is a store call that waits for a lock another session holds.
type blockedCall struct {
	name string
	lock string // what the other session locks; %s: the schema
	call func(context.Context, *postgres.Store, store.FenceParams) error
}

var blockedCalls = []blockedCall{
	{"complete", `SELECT 1 FROM %s.idem_records FOR UPDATE`,
		func(ctx context.Context, s *postgres.Store, f store.FenceParams) error {
			return s.Complete(ctx, store.CompleteParams{FenceParams: f, Response: okResponse()})
		}},
	{"sweep", `SELECT 1 FROM %s.idem_sweep_mark FOR UPDATE`,
		func(ctx context.Context, s *postgres.Store, _ store.FenceParams) error {
			_, err := s.SweepExpiredLeases(ctx, store.SweepParams{Limit: 10})
			return err
		}},
}

// TestContextEndStopsTheStatement: a store call waiting for a lock whose
// caller gives up returns the context's error, and its statement stops on
// the server too, instead of waiting for the lock and then writing. pgx
// does this for the pools Open makes: a context that ends during a
// statement closes the connection, and pgx sends the server a cancel
// request first. Through pgbouncer in transaction mode the pooler forwards
// the request to the server connection that runs the statement.
func TestContextEndStopsTheStatement(t *testing.T) {
	for _, via := range []string{"direct", "pgbouncer"} {
		for _, c := range blockedCalls {
			t.Run(via+"/"+c.name, func(t *testing.T) {
				u := testURL(t)
				if via == "pgbouncer" {
					u = testenv.PgbouncerURL(t, testenv.PgbouncerTx)
				}
				schema := pgdb.Schema(t, u)
				s, err := postgres.Open(t.Context(), u, postgres.Config{Schema: schema, MaxConns: 2})
				if err != nil {
					t.Fatalf("open: %v", err)
				}
				defer s.Close()
				stopsTheStatement(t, u, s, schema, c, 0)
			})
		}
	}
}

// TestCancelRequestHandlerReportsTheContext gives New a pool whose
// connections, when a context ends, only send the server a cancel request
// and stay open (pgx's CancelRequestContextWatcherHandler), so the call
// ends with the server's cancellation rather than a closed connection: the
// store still reports the context's deadline, which the engine retries as
// a slow store, not as a server error.
func TestCancelRequestHandlerReportsTheContext(t *testing.T) {
	u := testURL(t)
	schema := pgdb.Schema(t, u)
	s, err := postgres.New(t.Context(), cancelRequestPool(t, u, 10*time.Second), postgres.Config{Schema: schema})
	if err != nil {
		t.Fatalf("new: %v", err)
	}
	defer s.Close()
	for _, c := range blockedCalls {
		t.Run(c.name, func(t *testing.T) { stopsTheStatement(t, u, s, schema, c, 2*time.Second) })
	}
}

// cancelRequestPool is a pool on u whose connections, when a context ends
// during a statement, send a cancel request and close only if the server
// has not answered after deadlineDelay.
func cancelRequestPool(t *testing.T, u string, deadlineDelay time.Duration) *pgxpool.Pool {
	t.Helper()
	pcfg, err := pgxpool.ParseConfig(u)
	if err != nil {
		t.Fatal(err)
	}
	pcfg.MaxConns = 2
	pcfg.ConnConfig.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.CancelRequestContextWatcherHandler{Conn: pc, DeadlineDelay: deadlineDelay}
	}
	pool, err := pgxpool.NewWithConfig(t.Context(), pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// TestReplayCacheWithCancelRequests: the replay cache's listening
// connection waits for notifications one renewal period at a time, ending
// each wait by its context. Copied from a pool whose connections answer a
// context's end with a cancel request and a deadline 4 s later, each wait
// would last 4 s longer, and the cache's registration would lapse between
// renewals; it keeps pgx's default instead, and answers from memory
// throughout.
func TestReplayCacheWithCancelRequests(t *testing.T) {
	t.Parallel()
	u := testURL(t)
	s, err := postgres.New(t.Context(), cancelRequestPool(t, u, 4*time.Second),
		postgres.Config{Schema: pgdb.Schema(t, u), ReplayCache: 1 << 20})
	if err != nil {
		t.Fatalf("new: %v", err)
	}
	defer s.Close()
	_, replay := completedKey(t, s)
	replay()
	// Past a lease (3 s) and two renewals (one a second).
	for end := time.Now().Add(4 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if replay() != 1 {
			t.Fatal("a replay missed the cache: its registration lapsed between renewals")
		}
	}
}

// stopsTheStatement runs c on s, on a fresh record, while another session
// holds c's lock. The call's context ends once the call waits for the
// lock: by a cancel, or by its deadline when timeout is positive.
func stopsTheStatement(t *testing.T, u string, s *postgres.Store, schema string, c blockedCall, timeout time.Duration) {
	ctx := t.Context()
	p := reserveParams(testenv.Name("stopped-"))
	res, err := s.Reserve(ctx, p)
	if err != nil || res.Outcome != store.Created {
		t.Fatalf("reserve: %+v %v", res, err)
	}

	// The other session: through the same route, in the simple protocol
	// (a pooler in transaction mode keeps no prepared statement), in a
	// transaction that holds the lock until the call is over.
	holder, err := pgx.Connect(ctx, testenv.WithParam(t, u, "default_query_exec_mode", "simple_protocol"))
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close(context.WithoutCancel(ctx))
	tx, err := holder.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	var holderPID uint32
	if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&holderPID); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, fmt.Sprintf(c.lock, pgx.Identifier{schema}.Sanitize())); err != nil {
		t.Fatal(err)
	}
	// How many backends the holder blocks, seen from a direct connection.
	monitor := adminConn(t)
	blocked := func() int {
		t.Helper()
		var n int
		if err := monitor.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))`,
			holderPID).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	callCtx, cancel := context.WithCancel(ctx)
	want := context.Canceled
	if timeout > 0 {
		callCtx, cancel = context.WithTimeout(ctx, timeout)
		want = context.DeadlineExceeded
	}
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.call(callCtx, s, fence(res)) }()
	waited := time.Now().Add(10 * time.Second)
	for blocked() == 0 {
		select {
		case err := <-done:
			t.Fatalf("the call returned before it waited for the lock: %v", err)
		case <-time.After(2 * time.Millisecond):
		}
		if time.Now().After(waited) {
			t.Fatal("the call's statement never waited for the lock")
		}
	}
	if timeout == 0 {
		cancel()
	}
	select {
	case err = <-done:
	case <-time.After(timeout + 10*time.Second):
		t.Fatal("the call still waits for the lock 10 s after its context ended")
	}
	if !errors.Is(err, want) || store.IsRetryable(err) {
		t.Fatalf("call: %v, want %v (not marked retryable)", err, want)
	}

	// The statement no longer waits on the server (it would wait as long as
	// the holder holds the lock, and write once it lets go).
	stopped := time.Now().Add(10 * time.Second)
	for blocked() > 0 {
		if time.Now().After(stopped) {
			t.Fatal("the statement still waits for the lock on the server 10 s after its call returned")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	// Nothing was written once the lock was free, and the store serves.
	rec, err := s.Get(ctx, p.Scope, p.Key)
	if err != nil || rec.State != store.StateInProgress {
		t.Fatalf("after the holder let go: %+v %v, want the record still in progress", rec, err)
	}
	if _, err := s.SweepExpiredLeases(ctx, store.SweepParams{Limit: 10}); err != nil {
		t.Fatalf("sweep after the call: %v", err)
	}
}
