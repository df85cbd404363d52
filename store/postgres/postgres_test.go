package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/testkit/pgdb"
	"github.com/idem-go/idem/internal/testkit/testenv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib"
	"go.uber.org/goleak"

	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/postgres"
	"github.com/idem-go/idem/store/storetest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testURL returns the server URL or skips the test.
func testURL(tb testing.TB) string {
	tb.Helper()
	return testenv.PostgresURL(tb)
}

// newSchema creates an empty schema for one test and drops it afterwards.
func newSchema(tb testing.TB) string {
	tb.Helper()
	return pgdb.Schema(tb, testURL(tb))
}

// withSearchPath returns the test URL with search_path set to schema, so
// the store finds its tables the way a deployment without Config.Schema
// does.
func withSearchPath(tb testing.TB, schema string) string {
	tb.Helper()
	return testenv.WithParam(tb, testURL(tb), "search_path", schema)
}

func openStore(tb testing.TB, schema string, clock store.Clock) *postgres.Store {
	tb.Helper()
	s, err := postgres.Open(context.Background(), testURL(tb), postgres.Config{Schema: schema, Clock: clock})
	if err != nil {
		tb.Fatalf("open: %v", err)
	}
	tb.Cleanup(func() { s.Close() })
	return s
}

func adminConn(tb testing.TB) *pgx.Conn {
	tb.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, testURL(tb))
	if err != nil {
		tb.Fatalf("connect: %v", err)
	}
	tb.Cleanup(func() { conn.Close(ctx) })
	return conn
}

func reserveParams(key string) store.ReserveParams {
	return store.ReserveParams{
		Scope:       "tenant-1 POST /payments",
		Key:         key,
		Fingerprint: "fp-" + key,
		Lease:       30 * time.Second,
		TTL:         24 * time.Hour,
		LeasePolicy: store.LeaseUnknown,
	}
}

func okResponse() store.Response {
	return store.Response{
		Status: http.StatusCreated,
		Header: http.Header{"Content-Type": {"application/json"}, "X-Id": {"a", "b"}},
		Body:   []byte(`{"id":"pay_1"}`),
	}
}

func TestConformance(t *testing.T) {
	conformance(t, testURL(t), postgres.Config{}, true)
}

// TestConformancePartitioned runs the store suite on a table partitioned
// by retention, six hours per partition (the suite's TTL is a day, so its
// records spread over the partitions made ahead), alone, batched with the
// multi-row statements, and with the tenant cap.
func TestConformancePartitioned(t *testing.T) {
	base := postgres.Config{Partitions: 6 * time.Hour, PartitionsAhead: 5, MaxConns: smallPool}
	for name, mod := range map[string]func(*postgres.Config){
		"alone":      func(c *postgres.Config) { c.MaxBatches = -1 },
		"batched":    func(c *postgres.Config) { c.ForceBatches = true },
		"tenant cap": func(c *postgres.Config) { c.TenantCap = true },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cfg := base
			mod(&cfg)
			conformance(t, testURL(t), cfg, false)
		})
	}
}

// roundTrips counts what one connection sends: statements (tracer),
// prepares (tracer) and network writes (one per round trip, since pgx
// sends a whole extended-protocol exchange in one write).
type roundTrips struct {
	queries, prepares, writes atomic.Int64
}

func (c *roundTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.queries.Add(1)
	return ctx
}
func (c *roundTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (c *roundTrips) TracePrepareStart(ctx context.Context, _ *pgx.Conn, _ pgx.TracePrepareStartData) context.Context {
	c.prepares.Add(1)
	return ctx
}
func (c *roundTrips) TracePrepareEnd(context.Context, *pgx.Conn, pgx.TracePrepareEndData) {}

func (c *roundTrips) reset() {
	c.queries.Store(0)
	c.prepares.Store(0)
	c.writes.Store(0)
}

// expect checks the counts since the last reset, then resets.
func (c *roundTrips) expect(t *testing.T, what string, queries int64) {
	t.Helper()
	q, p, w := c.queries.Load(), c.prepares.Load(), c.writes.Load()
	if q != queries || p != 0 || w != queries {
		t.Errorf("%s: %d statements, %d prepares, %d network writes; want %d, 0, %d", what, q, p, w, queries, queries)
	}
	c.reset()
}

type countingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c countingConn) Write(b []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(b)
}

func TestRoundTrips(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := newSchema(t)
	counts := &roundTrips{}
	pcfg, err := pgxpool.ParseConfig(testURL(t))
	if err != nil {
		t.Fatal(err)
	}
	pcfg.MaxConns = 1
	// The pool pings connections idle for a second; that health check is
	// not part of the statement cost measured here.
	pcfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	pcfg.ConnConfig.Tracer = counts
	var d net.Dialer
	pcfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return countingConn{Conn: c, writes: &counts.writes}, nil
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	s, err := postgres.New(ctx, pool, postgres.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	// Warm the connection's statement cache: the first use of a statement
	// on a connection costs one extra round trip to prepare it.
	warm := reserveParams("warm-up")
	r, err := s.Reserve(ctx, warm)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, store.CompleteParams{FenceParams: fence(r), Response: okResponse()}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Reserve(ctx, warm); err != nil {
		t.Fatal(err)
	}
	counts.reset()

	p := reserveParams("k1")
	r, err = s.Reserve(ctx, p)
	if err != nil || r.Outcome != store.Created {
		t.Fatalf("reserve: %v %v", r.Outcome, err)
	}
	counts.expect(t, "reserve of a new key", 1)

	if err := s.Complete(ctx, store.CompleteParams{FenceParams: fence(r), Response: okResponse()}); err != nil {
		t.Fatal(err)
	}
	counts.expect(t, "complete", 1)

	admin := adminConn(t)
	before := rowVersion(t, admin, schema, p)

	r, err = s.Reserve(ctx, p)
	if err != nil || r.Outcome != store.Existing || r.Record.State != store.StateCompleted {
		t.Fatalf("replay: %v %v %v", r.Outcome, r.Record.State, err)
	}
	counts.expect(t, "replay", 1)

	if after := rowVersion(t, admin, schema, p); after != before {
		t.Errorf("replay wrote the row: (xmin, xmax, ctid) %s before, %s after", before, after)
	}

	// Inside a transaction a replay must not even take a transaction id: no
	// tuple written, no row locked (a row lock stamps xmax with one).
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	statsBefore := tableStats(t, tx, schema)
	counts.reset()
	r, err = s.ReserveTx(ctx, tx, p)
	if err != nil || r.Outcome != store.Existing {
		t.Fatalf("replay in tx: %v %v", r.Outcome, err)
	}
	counts.expect(t, "replay in a transaction", 1)
	var xid *int64
	if err := tx.QueryRow(ctx, "SELECT txid_current_if_assigned()").Scan(&xid); err != nil {
		t.Fatal(err)
	}
	if xid != nil {
		t.Error("replay in a transaction was assigned a transaction id: it wrote or locked")
	}
	if d := tableStats(t, tx, schema).sub(statsBefore); d != (tupleStats{}) {
		t.Errorf("replay in a transaction changed tuples: %+v", d)
	}
	if after := rowVersion(t, admin, schema, p); after != before {
		t.Errorf("replay in tx wrote the row: %s before, %s after", before, after)
	}
}

type tupleStats struct{ ins, upd, hot, del int64 }

func (a tupleStats) sub(b tupleStats) tupleStats {
	return tupleStats{a.ins - b.ins, a.upd - b.upd, a.hot - b.hot, a.del - b.del}
}

// tableStats reads this backend's pending tuple counters for idem_records.
// On PostgreSQL 15 they include earlier, not yet flushed transactions of
// the same connection, so callers compare two readings.
func tableStats(t *testing.T, tx pgx.Tx, schema string) tupleStats {
	t.Helper()
	var s tupleStats
	err := tx.QueryRow(context.Background(), `
		SELECT n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del
		FROM pg_stat_xact_user_tables WHERE schemaname = $1 AND relname = 'idem_records'`,
		schema).Scan(&s.ins, &s.upd, &s.hot, &s.del)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func fence(r store.ReserveResult) store.FenceParams {
	return store.FenceParams{Scope: r.Record.Scope, Key: r.Record.Key, Fence: r.Record.Fence}
}

// rowVersion identifies the physical row version: a write (new version) or
// a row lock (xmax) changes it.
func rowVersion(t *testing.T, conn *pgx.Conn, schema string, p store.ReserveParams) string {
	t.Helper()
	var v string
	err := conn.QueryRow(context.Background(),
		fmt.Sprintf(`SELECT xmin::text || ',' || xmax::text || ',' || ctid::text FROM %s.idem_records WHERE scope = $1 AND key = $2`,
			pgx.Identifier{schema}.Sanitize()), p.Scope, p.Key).Scan(&v)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// waitForLockWait waits until a backend running a statement on schema is
// blocked on a lock: the other side of a race this test stages.
func waitForLockWait(t *testing.T, conn *pgx.Conn, schema string, done <-chan struct{}) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-done:
			t.Fatal("the racing statement finished without waiting")
		default:
		}
		var n int
		err := conn.QueryRow(context.Background(), `
			SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND position($1 in query) > 0`, schema).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
	t.Fatal("the racing statement never blocked")
}

// TestSnapshotGap stages the READ COMMITTED gap deterministically: B's
// statement takes its snapshot, then its INSERT waits on A's uncommitted
// row for the same key; A commits. B's insert now conflicts, but its
// snapshot predates A's row, so the read part of the statement sees
// nothing. Reserve must notice and look again, not fail or report nothing.
func TestSnapshotGap(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := newSchema(t)
	s := openStore(t, schema, nil)
	admin := adminConn(t)
	p := reserveParams("gap")

	txA, err := s.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer txA.Rollback(ctx)
	a, err := s.ReserveTx(ctx, txA, p)
	if err != nil || a.Outcome != store.Created {
		t.Fatalf("A: %v %v", a.Outcome, err)
	}

	before := s.ReserveReruns()
	done := make(chan struct{})
	var b store.ReserveResult
	var errB error
	go func() {
		defer close(done)
		b, errB = s.Reserve(ctx, p)
	}()
	waitForLockWait(t, admin, schema, done)
	if err := txA.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	<-done
	if errB != nil {
		t.Fatalf("B: %v", errB)
	}
	if b.Outcome != store.Existing || b.Record.State != store.StateInProgress || b.Record.Fence != a.Record.Fence {
		t.Errorf("B: %v %v fence %d; want existing in_progress fence %d", b.Outcome, b.Record.State, b.Record.Fence, a.Record.Fence)
	}
	if n := s.ReserveReruns() - before; n != 1 {
		t.Errorf("reruns: %d, want 1", n)
	}
}

// TestStaleTransition stages the other race: B's snapshot shows a
// failed_retryable record and B's UPDATE waits on A, who is reclaiming it.
// After A commits, B's UPDATE no longer matches; B must report the record
// A now holds, not the failed_retryable one from its snapshot.
func TestStaleTransition(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := newSchema(t)
	s := openStore(t, schema, nil)
	admin := adminConn(t)
	p := reserveParams("stale")

	r, err := s.Reserve(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Release(ctx, store.ReleaseParams{FenceParams: fence(r), Error: "refused"}); err != nil {
		t.Fatal(err)
	}

	txA, err := s.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer txA.Rollback(ctx)
	a, err := s.ReserveTx(ctx, txA, p)
	if err != nil || a.Outcome != store.Reclaimed || a.Record.Fence <= r.Record.Fence {
		t.Fatalf("A: %v fence %d %v", a.Outcome, a.Record.Fence, err)
	}

	before := s.ReserveReruns()
	done := make(chan struct{})
	var b store.ReserveResult
	var errB error
	go func() {
		defer close(done)
		b, errB = s.Reserve(ctx, p)
	}()
	waitForLockWait(t, admin, schema, done)
	if err := txA.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	<-done
	if errB != nil {
		t.Fatalf("B: %v", errB)
	}
	if b.Outcome != store.Existing || b.Record.State != store.StateInProgress || b.Record.Fence != a.Record.Fence {
		t.Errorf("B: %v %v fence %d; want existing in_progress fence %d", b.Outcome, b.Record.State, b.Record.Fence, a.Record.Fence)
	}
	if n := s.ReserveReruns() - before; n != 1 {
		t.Errorf("reruns: %d, want 1", n)
	}
}

// TestReserveRace races many goroutines (over two pools, as two processes
// would) on fresh keys and then on released keys. Every call must return a
// record; each key has exactly one winner.
func TestReserveRace(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := newSchema(t)
	stores := []*postgres.Store{openStore(t, schema, nil), openStore(t, schema, nil)}
	const keys, racers = 40, 12

	race := func(round string, p func(k int) store.ReserveParams, want store.ReserveOutcome) []store.ReserveResult {
		winners := make([]store.ReserveResult, keys)
		var wg sync.WaitGroup
		for k := range keys {
			start := make(chan struct{})
			var won atomic.Int64
			for i := range racers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					r, err := stores[i%2].Reserve(ctx, p(k))
					switch {
					case err != nil:
						t.Errorf("%s key %d: %v", round, k, err)
					case r.Outcome == want:
						won.Add(1)
						winners[k] = r
					case r.Outcome != store.Existing || r.Record.State != store.StateInProgress:
						t.Errorf("%s key %d: %v %v", round, k, r.Outcome, r.Record.State)
					}
				}()
			}
			close(start)
			wg.Wait()
			if n := won.Load(); n != 1 {
				t.Errorf("%s key %d: %d winners", round, k, n)
			}
		}
		return winners
	}

	fresh := func(k int) store.ReserveParams { return reserveParams(fmt.Sprintf("race-%d", k)) }
	winners := race("fresh", fresh, store.Created)
	first := winners
	for _, w := range winners {
		if err := stores[0].Release(ctx, store.ReleaseParams{FenceParams: fence(w), Error: "refused"}); err != nil {
			t.Fatal(err)
		}
	}
	winners = race("reclaim", fresh, store.Reclaimed)
	for k, w := range winners {
		if w.Record.Fence <= first[k].Record.Fence || w.Record.Attempts != 2 {
			t.Errorf("reclaim key %d: fence %d attempts %d", k, w.Record.Fence, w.Record.Attempts)
		}
	}
	t.Logf("reserve reruns after a race: %d and %d (of %d calls)",
		stores[0].ReserveReruns(), stores[1].ReserveReruns(), 2*keys*racers)
}

// TestMigrateConcurrent starts several processes (pools) on one empty
// schema at once, with a plain table and with a partitioned one (made from
// the plain one's migrations): each migration must be applied exactly
// once, and running the migrations again is a no-op.
func TestMigrateConcurrent(t *testing.T) {
	t.Run("plain", func(t *testing.T) { migrateConcurrent(t, postgres.Config{}) })
	t.Run("partitioned", func(t *testing.T) { migrateConcurrent(t, postgres.Config{Partitions: time.Hour}) })
}

func migrateConcurrent(t *testing.T, cfg postgres.Config) {
	t.Parallel()
	ctx := context.Background()
	schema := newSchema(t)
	cfg.Schema = schema
	const procs = 6
	stores := make([]*postgres.Store, procs)
	var wg sync.WaitGroup
	for i := range procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := postgres.Open(ctx, testURL(t), cfg)
			if err != nil {
				t.Errorf("open %d: %v", i, err)
				return
			}
			stores[i] = s
		}()
	}
	wg.Wait()
	for _, s := range stores {
		if s != nil {
			defer s.Close()
		}
	}
	if t.Failed() {
		return
	}
	for range 2 {
		if err := stores[0].Migrate(ctx); err != nil {
			t.Fatalf("migrate again: %v", err)
		}
	}
	var n, maxVersion int
	err := stores[0].Pool().QueryRow(ctx,
		"SELECT count(*), max(version) FROM "+pgx.Identifier{schema, "idem_migrations"}.Sanitize()).Scan(&n, &maxVersion)
	if err != nil {
		t.Fatal(err)
	}
	files, last := migrationFiles(t)
	if n != files || maxVersion != last {
		t.Fatalf("idem_migrations: %d rows, max version %d; want %d, %d", n, maxVersion, files, last)
	}
	// The schema is usable from every process.
	for i, s := range stores {
		if _, err := s.Reserve(ctx, reserveParams(fmt.Sprintf("m%d", i))); err != nil {
			t.Fatalf("reserve via store %d: %v", i, err)
		}
	}
}

func TestSkipMigrate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := newSchema(t)
	s, err := postgres.Open(ctx, testURL(t), postgres.Config{Schema: schema, SkipMigrate: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// No tables yet: the error must surface, never an empty success.
	if _, err := s.Reserve(ctx, reserveParams("k")); err == nil {
		t.Fatal("reserve on an unmigrated schema succeeded")
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if r, err := s.Reserve(ctx, reserveParams("k")); err != nil || r.Outcome != store.Created {
		t.Fatalf("reserve after migrate: %v %v", r.Outcome, err)
	}
}

// TestErrorsSurface: cancellation and a dead pool come back as errors that
// keep their cause, so the engine can fail closed.
func TestErrorsSurface(t *testing.T) {
	t.Parallel()
	schema := newSchema(t)
	s := openStore(t, schema, nil)

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := s.Reserve(ctx, reserveParams("k"))
	if !errors.Is(err, context.Canceled) {
		t.Errorf("reserve with a canceled context: %v", err)
	}
	if err := s.Complete(ctx, store.CompleteParams{FenceParams: store.FenceParams{Scope: "s", Key: "k", Fence: 1}, Response: store.Response{Status: 200}}); !errors.Is(err, context.Canceled) {
		t.Errorf("complete with a canceled context: %v", err)
	}
	if err := s.Ping(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("ping with a canceled context: %v", err)
	}

	s.Close()
	if _, err := s.Reserve(context.Background(), reserveParams("k")); err == nil {
		t.Error("reserve on a closed store succeeded")
	}

	if _, err := postgres.Open(context.Background(), "postgres://nobody@127.0.0.1:1/none?connect_timeout=2", postgres.Config{}); err == nil {
		t.Error("open of an unreachable server succeeded")
	}
}

// TestDatabaseClock runs with the server's clock (no Config.Clock): times
// come back in UTC and leases are measured from the database's now.
func TestDatabaseClock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := openStore(t, newSchema(t), nil)
	r, err := s.Reserve(ctx, reserveParams("k"))
	if err != nil {
		t.Fatal(err)
	}
	rec := r.Record
	if rec.CreatedAt.Location() != time.UTC || time.Since(rec.CreatedAt).Abs() > time.Minute {
		t.Errorf("created at %v", rec.CreatedAt)
	}
	if d := rec.LockedUntil.Sub(rec.CreatedAt); d != 30*time.Second {
		t.Errorf("lease %v, want 30s", d)
	}
	if d := rec.ExpiresAt.Sub(rec.CreatedAt); d != 24*time.Hour {
		t.Errorf("ttl %v, want 24h", d)
	}
}

// TestHOTCheckpoint: the fillfactor leaves room on the page, so an update
// that touches no indexed column (Checkpoint) is a heap-only tuple update.
// Complete cannot be HOT: it changes state, which the partial indexes'
// predicates read.
func TestHOTCheckpoint(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := newSchema(t)
	s := openStore(t, schema, nil)
	r, err := s.Reserve(ctx, reserveParams("hot"))
	if err != nil {
		t.Fatal(err)
	}
	tx, err := s.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	before := tableStats(t, tx, schema)
	for i := range 3 {
		if err := s.CheckpointTx(ctx, tx, store.CheckpointParams{FenceParams: fence(r), RecoveryPoint: fmt.Sprint("phase", i)}); err != nil {
			t.Fatal(err)
		}
	}
	d := tableStats(t, tx, schema).sub(before)
	if d.upd != 3 || d.hot != 3 {
		t.Errorf("checkpoints: %d updates, %d HOT; want 3, 3", d.upd, d.hot)
	}
}

func TestConformanceTx(t *testing.T) {
	conformanceTx(t, 0)
}

// TestConformanceTxPartitioned runs the transactional suite on a table
// partitioned by retention: ReserveTx takes the key's lock in the
// caller's transaction.
func TestConformanceTxPartitioned(t *testing.T) {
	conformanceTx(t, 6*time.Hour)
}

func conformanceTx(t *testing.T, partitions time.Duration) {
	storetest.RunTx(t, storetest.TxHarness[pgx.Tx]{
		NewDatabase: func(t *testing.T, clock store.Clock) storetest.TxDatabase[pgx.Tx] {
			schema := newSchema(t)
			s, err := postgres.Open(context.Background(), testURL(t), postgres.Config{Schema: schema, Clock: clock,
				Partitions: partitions, PartitionsAhead: 5})
			if err != nil {
				t.Fatalf("open: %v", err)
			}
			t.Cleanup(func() { s.Close() })
			payments := pgx.Identifier{schema, "payments"}.Sanitize()
			if _, err := s.Pool().Exec(context.Background(), "CREATE TABLE "+payments+" (id text PRIMARY KEY)"); err != nil {
				t.Fatal(err)
			}
			return storetest.TxDatabase[pgx.Tx]{
				Store: s,
				Write: func(ctx context.Context, tx pgx.Tx, id string) error {
					_, err := tx.Exec(ctx, "INSERT INTO "+payments+" (id) VALUES ($1)", id)
					return err
				},
				Count: func(ctx context.Context, id string) (n int, err error) {
					err = s.Pool().QueryRow(ctx, "SELECT count(*) FROM "+payments+" WHERE id = $1", id).Scan(&n)
					return n, err
				},
			}
		},
	})
}

// migrationFiles counts the migration files and returns the last version.
func migrationFiles(t *testing.T) (n, last int) {
	t.Helper()
	entries, err := os.ReadDir("migrations")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		v, _, _ := strings.Cut(e.Name(), "_")
		version, err := strconv.Atoi(v)
		if err != nil {
			t.Fatalf("migration %s: %v", e.Name(), err)
		}
		n, last = n+1, max(last, version)
	}
	return n, last
}

// A record written before migration 011 has no owner (NULL): it reads as
// Owner 0, and the next execution a Reserve starts on it stores its own.
func TestOwnerOfRecordsBeforeMigration(t *testing.T) {
	ctx := context.Background()
	s, schema := openSchema(t, postgres.Config{})
	p := reserveParams("old")
	p.Owner = 42
	res, err := s.Reserve(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := adminConn(t).Exec(ctx, "UPDATE "+pgx.Identifier{schema, "idem_records"}.Sanitize()+" SET owner = NULL"); err != nil {
		t.Fatal(err)
	}
	r, err := s.Get(ctx, p.Scope, p.Key)
	if err != nil || r.Owner != 0 || r.Fence != res.Record.Fence {
		t.Fatalf("a record without an owner: Owner %d fence %d (%v), want 0 %d", r.Owner, r.Fence, err, res.Record.Fence)
	}
	if err := s.Release(ctx, store.ReleaseParams{FenceParams: store.FenceParams{Scope: p.Scope, Key: p.Key, Fence: r.Fence}, Error: "x"}); err != nil {
		t.Fatal(err)
	}
	p.Owner = -43
	if res, err := s.Reserve(ctx, p); err != nil || res.Outcome != store.Reclaimed || res.Record.Owner != -43 {
		t.Fatalf("reclaim of a record without an owner: %v Owner %d (%v)", res.Outcome, res.Record.Owner, err)
	}
}
