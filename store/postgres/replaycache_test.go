package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/testkit/pgdb"
	"github.com/idem-go/idem/internal/testkit/testenv"
	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/postgres"
	"github.com/idem-go/idem/store/storetest"
)

// cachedStore opens a store with a replay cache on schema.
func cachedStore(t *testing.T, schema string, clock store.Clock) *postgres.Store {
	t.Helper()
	s, err := postgres.Open(context.Background(), testURL(t), postgres.Config{Schema: schema, Clock: clock,
		MaxConns: 4, ReplayCache: 1 << 20})
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestReplayCacheTwoProxies: two instances (engines, each with its own
// store and cache) serve one schema. Once both answer a key's replays from
// memory, an operator's delete from a third process (`idem delete`: a
// store without a cache) returns only when no instance can replay the old
// answer any more: the next request with that key runs again, on either
// instance, at once. A settlement likewise: both replay the settled
// answer as soon as Resolve returns.
func TestReplayCacheTwoProxies(t *testing.T) {
	t.Parallel()
	schema := newSchema(t)
	var runs atomic.Int64
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"run":%d}`, runs.Add(1))
	})
	var stores []*postgres.Store
	var proxies []http.Handler
	for range 2 {
		s := cachedStore(t, schema, nil)
		e, err := idem.New(s, idem.Config{Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		stores, proxies = append(stores, s), append(proxies, e.Middleware(handler))
	}
	operator := openStore(t, schema, nil)
	post := func(h http.Handler, key string) string {
		r := httptest.NewRequest("POST", "/v1/charges", strings.NewReader(`{"amount":1}`))
		r.Header.Set("Idempotency-Key", key)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return fmt.Sprint(w.Code, " ", w.Body.String())
	}
	first := post(proxies[0], "k")
	for i := range 4 {
		if got := post(proxies[i%2], "k"); got != first {
			t.Fatalf("replay %d: %q, want %q", i, got, first)
		}
	}
	for i, s := range stores {
		if s.CacheHits() == 0 {
			t.Fatalf("instance %d answered no replay from memory", i)
		}
	}
	// One instance is slow to apply invalidations: the delete must wait
	// for it, not only for the notification to be sent.
	stores[1].SlowInvalidations(300 * time.Millisecond)
	scope := (&idem.Request{Method: "POST", Route: "/v1/charges"}).Scope()
	if err := operator.Delete(context.Background(), store.DeleteParams{Scope: scope, Key: "k"}); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if got := post(proxies[1-i], "k"); got == first {
			t.Fatalf("instance %d replayed the deleted answer %q after the delete returned", 1-i, got)
		}
	}

	// A settlement: the record is unknown (never in memory), then settled.
	r, err := operator.Reserve(context.Background(), store.ReserveParams{Scope: scope, Key: "u",
		Fingerprint: mustRecord(t, operator, scope, "k").Fingerprint, Lease: time.Minute, TTL: time.Hour,
		LeasePolicy: store.LeaseUnknown})
	if err != nil {
		t.Fatal(err)
	}
	if err := operator.MarkUnknown(context.Background(), store.ReleaseParams{FenceParams: fence(r)}); err != nil {
		t.Fatal(err)
	}
	for _, h := range proxies {
		if got := post(h, "u"); !strings.HasPrefix(got, "409 ") {
			t.Fatalf("unknown record: %q, want 409", got)
		}
	}
	settled := store.Response{Status: 200, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"settled":true}`)}
	if err := operator.Resolve(context.Background(), store.ResolveParams{FenceParams: fence(r), To: store.StateCompleted,
		Response: &settled, TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	for i, h := range proxies {
		if got := post(h, "u"); got != `200 {"settled":true}` {
			t.Fatalf("instance %d after the settlement: %q", i, got)
		}
	}
}

func mustRecord(t *testing.T, s store.Store, scope, key string) store.Record {
	t.Helper()
	rec, err := s.Get(context.Background(), scope, key)
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

// TestReplayCacheKeepsOnlyAnswers: an in-flight record is never kept (a
// replay after its completion gets the answer, not the in-flight state),
// another fingerprint is answered by the database (422's record), and a
// record past its expiry is not replayed from memory: the key starts over.
func TestReplayCacheKeepsOnlyAnswers(t *testing.T) {
	t.Parallel()
	clock := storetest.NewClock()
	s := cachedStore(t, newSchema(t), clock.Now)
	ctx := context.Background()
	p := reserveParams("k")
	p.TTL = time.Hour
	r, err := s.Reserve(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if again, err := s.Reserve(ctx, p); err != nil || again.Record.State != store.StateInProgress {
		t.Fatalf("in flight: %v %v", again.Record.State, err)
	}
	if err := s.Complete(ctx, store.CompleteParams{FenceParams: fence(r), Response: store.Response{Status: 201}, TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		got, err := s.Reserve(ctx, p)
		if err != nil || got.Outcome != store.Existing || got.Record.State != store.StateCompleted {
			t.Fatalf("replay %d: %v %v %v", i, got.Outcome, got.Record.State, err)
		}
	}
	if s.CacheHits() != 2 {
		t.Fatalf("%d replays from memory, want 2 (the first one reads the database)", s.CacheHits())
	}
	other := p
	other.Fingerprint = "another"
	if got, err := s.Reserve(ctx, other); err != nil || got.Record.Fingerprint != p.Fingerprint || s.CacheHits() != 2 {
		t.Fatalf("another fingerprint: %+v %v, %d hits", got.Record, err, s.CacheHits())
	}
	clock.Advance(time.Hour)
	got, err := s.Reserve(ctx, p)
	if err != nil || got.Outcome != store.Created {
		t.Fatalf("after the expiry: %v %v, want a new record", got.Outcome, err)
	}
}

// TestReplayCacheStopsWithoutItsConnection: a cache whose listening
// connection is cut stops answering from memory (a Delete could no longer
// reach it), and serves again once it has listened and registered anew.
func TestReplayCacheStopsWithoutItsConnection(t *testing.T) {
	t.Parallel()
	schema := newSchema(t)
	s := cachedStore(t, schema, nil)
	ctx := context.Background()
	_, replay := completedKey(t, s)
	replay()
	if replay() != 1 {
		t.Fatal("no replay from memory")
	}
	conn := adminConn(t)
	var cut int
	err := conn.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE application_name = 'idem replay cache ' || $1`, s.CacheNode()).Scan(&cut)
	if err != nil || cut != 1 {
		t.Fatalf("cutting the listening connection: %d cut, %v", cut, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for replay() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the cache kept answering from memory without its connection")
		}
		time.Sleep(50 * time.Millisecond)
	}
	for replay(); replay() != 1; replay() {
		if time.Now().After(deadline.Add(10 * time.Second)) {
			t.Fatal("the cache did not serve again after reconnecting")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// completedKey completes a key on s and returns its parameters and a
// replay of it, which reports whether the replay came from memory (1) or
// not (0).
func completedKey(t *testing.T, s *postgres.Store) (store.ReserveParams, func() int64) {
	t.Helper()
	ctx := t.Context()
	p := reserveParams("k")
	r, err := s.Reserve(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, store.CompleteParams{FenceParams: fence(r), Response: store.Response{Status: 201}, TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	return p, func() int64 {
		t.Helper()
		before := s.CacheHits()
		if _, err := s.Reserve(ctx, p); err != nil {
			t.Fatal(err)
		}
		return s.CacheHits() - before
	}
}

// cachedKey is completedKey, replayed until the cache answers it.
func cachedKey(t *testing.T, s *postgres.Store) (store.ReserveParams, func() int64) {
	t.Helper()
	p, replay := completedKey(t, s)
	if n := replay() + replay(); n != 1 {
		t.Fatalf("%d replays from memory, want 1", n)
	}
	return p, replay
}

// TestReplayCacheBehindPooler: behind pgbouncer in transaction mode a
// LISTEN does not hold, so a cache without Config.ListenURL is refused at
// Open; with a direct ListenURL it answers from memory, and a Delete made
// through the pooler still reaches it before it returns.
func TestReplayCacheBehindPooler(t *testing.T) {
	t.Parallel()
	pooled := testenv.PgbouncerURL(t, testenv.PgbouncerTx)
	schema := pgdb.Schema(t, pooled)
	cfg := postgres.Config{Schema: schema, MaxConns: 2, ReplayCache: 1 << 20}
	if s, err := postgres.Open(context.Background(), pooled, cfg); err == nil {
		s.Close()
		t.Fatal("a replay cache listening through the pooler was accepted")
	} else if !strings.Contains(err.Error(), "ListenURL") {
		t.Fatalf("refusal does not say what to set: %v", err)
	}
	// The pooler's database, reached directly.
	pc, err := pgx.Connect(context.Background(), pooled)
	if err != nil {
		t.Fatal(err)
	}
	var db string
	err = pc.QueryRow(context.Background(), "SELECT current_database()", pgx.QueryExecModeSimpleProtocol).Scan(&db)
	pc.Close(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	direct, err := url.Parse(testURL(t))
	if err != nil {
		t.Fatal(err)
	}
	direct.Path = "/" + db
	cfg.ListenURL = direct.String()
	s, err := postgres.Open(context.Background(), pooled, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	p, _ := cachedKey(t, s)
	operator, err := postgres.Open(ctx, pooled, postgres.Config{Schema: schema, MaxConns: 2, SkipMigrate: true})
	if err != nil {
		t.Fatal(err)
	}
	defer operator.Close()
	if err := operator.Delete(ctx, store.DeleteParams{Scope: p.Scope, Key: p.Key}); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Reserve(ctx, p); err != nil || got.Outcome != store.Created {
		t.Fatalf("after the delete through the pooler: %v %v, want a new record", got.Outcome, err)
	}
}

// TestReplayCacheInvalidationsCommitInOrder: invalidations commit in the
// order of their numbers, so a cache that applied one has applied every
// earlier one. Here an invalidation (played by hand, as the store's own
// transaction runs it) holds its number uncommitted: an operator's Delete
// of another key waits for it instead of taking the next number and
// committing first, and once the Delete returns the cache has applied
// both. Before the lock, the Delete returned as soon as the cache applied
// its own later number, with the earlier one still to come.
func TestReplayCacheInvalidationsCommitInOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := newSchema(t)
	s := cachedStore(t, schema, nil)
	operator := openStore(t, schema, nil)
	keys := cachedAnswers(t, s, operator, "a", "b")
	a, b := keys[0], keys[1]
	x := adminConn(t)
	tx, err := x.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, postgres.Filled(postgres.SQLCacheLock, schema)); err != nil {
		t.Fatal(err)
	}
	var v int64
	if err := tx.QueryRow(ctx, `SELECT nextval('`+pgx.Identifier{schema, "idem_cache_seq"}.Sanitize()+`')`).Scan(&v); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- operator.Delete(ctx, store.DeleteParams{Scope: b.Scope, Key: b.Key}) }()
	select {
	case err := <-done:
		t.Fatalf("Delete returned (%v) while an invalidation numbered before its own was uncommitted", err)
	case <-time.After(300 * time.Millisecond):
	}
	var channel string
	if err := tx.QueryRow(ctx, postgres.SQLCacheChannel, schema).Scan(&channel); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT pg_notify($1, $2)`, channel, fmt.Sprintf("%d %d %s%s", v, len(a.Scope), a.Scope, a.Key)); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	hits := s.CacheHits()
	if _, err := s.Reserve(ctx, a); err != nil {
		t.Fatal(err)
	}
	if s.CacheHits() != hits {
		t.Fatal("the Delete returned, yet the cache still holds a record whose earlier invalidation it had not applied")
	}
}

// TestReplayCacheDeleteRetriedAfterAFailedInvalidation: a Delete whose
// DELETE committed but whose invalidation failed returns an error; the
// operator's retry finds nothing to delete, and still tells the caches, so
// none replays the record from then on.
func TestReplayCacheDeleteRetriedAfterAFailedInvalidation(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := newSchema(t)
	s := cachedStore(t, schema, nil)
	operator := openStore(t, schema, nil)
	p, replay := cachedKey(t, s)
	// The registry is held for a moment: the invalidation cannot run.
	tx, err := adminConn(t).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `LOCK TABLE `+pgx.Identifier{schema, "idem_cache_nodes"}.Sanitize()+` IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	dctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	err = operator.Delete(dctx, store.DeleteParams{Scope: p.Scope, Key: p.Key})
	cancel()
	tx.Rollback(ctx)
	if err == nil || !strings.Contains(err.Error(), "telling the replay caches failed") {
		t.Fatalf("first delete: %v, want the invalidation's failure", err)
	}
	if err := operator.Delete(ctx, store.DeleteParams{Scope: p.Scope, Key: p.Key}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("retry: %v, want not found", err)
	}
	if replay() != 0 {
		t.Fatal("the record is deleted and the retry returned, yet the cache replays it")
	}
}

// TestReplayCacheStopsWithoutItsRegistration: a cache whose registration
// was removed (another node's start removes those gone for an hour: here
// this one's, backdated) no longer serves, since invalidations stop waiting
// for it; it registers again and serves once more.
func TestReplayCacheStopsWithoutItsRegistration(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := newSchema(t)
	s := cachedStore(t, schema, nil)
	p, replay := cachedKey(t, s)
	nodes := pgx.Identifier{schema, "idem_cache_nodes"}.Sanitize()
	admin := adminConn(t)
	if _, err := admin.Exec(ctx, `DELETE FROM `+nodes+` WHERE node = $1`, s.CacheNode()); err != nil {
		t.Fatal(err)
	}
	// Within a renewal the cache learns it and stops, then registers again
	// (emptied); a Delete from now on waits for it.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
		var n int
		if err := admin.QueryRow(ctx, `SELECT count(*) FROM `+nodes+` WHERE node = $1`, s.CacheNode()).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the cache did not register again within a minute")
		}
	}
	if replay() != 0 {
		t.Fatal("a cache that lost its registration answered from memory what it held before")
	}
	if err := openStore(t, schema, nil).Delete(ctx, store.DeleteParams{Scope: p.Scope, Key: p.Key}); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Reserve(ctx, p); err != nil || got.Outcome == store.Existing {
		t.Fatalf("after the delete: %v %v", got.Outcome, err)
	}
}

// TestReplayCacheSchemaFromThePool: without Config.Schema the tables are
// the search_path's, which the pool's connections may set for themselves
// (here AfterConnect); the listening connection registers and listens in
// that same schema, so a Delete there reaches the cache.
func TestReplayCacheSchemaFromThePool(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a, b := newSchema(t), newSchema(t)
	openStore(t, b, nil) // b has idem's tables too
	cfg, err := pgxpool.ParseConfig(withSearchPath(t, b))
	if err != nil {
		t.Fatal(err)
	}
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		_, err := c.Exec(ctx, "SET search_path TO "+pgx.Identifier{a}.Sanitize())
		return err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	s, err := postgres.New(ctx, pool, postgres.Config{ReplayCache: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	p, _ := cachedKey(t, s)
	if err := openStore(t, a, nil).Delete(ctx, store.DeleteParams{Scope: p.Scope, Key: p.Key}); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Reserve(ctx, p); err != nil || got.Outcome == store.Existing {
		t.Fatalf("deleted in %s, yet answered %v (%v)", a, got.Outcome, err)
	}
}

// TestReplayCacheRefusesWhatTheDatabaseWould: parameters the store refuses
// are refused before the cache is asked, as the statement would refuse
// them.
func TestReplayCacheRefusesWhatTheDatabaseWould(t *testing.T) {
	t.Parallel()
	s := cachedStore(t, newSchema(t), nil)
	p, _ := cachedKey(t, s)
	for _, bad := range []func(*store.ReserveParams){
		func(p *store.ReserveParams) { p.Lease = 0 },
		func(p *store.ReserveParams) { p.MaxActive = 5 }, // without TenantCap
	} {
		q := p
		bad(&q)
		if got, err := s.Reserve(context.Background(), q); err == nil {
			t.Fatalf("refused parameters answered %v", got.Outcome)
		}
	}
}

// TestReplayCacheInAnotherEncoding: in a LATIN1 database an invalidation
// of a scope with non-ASCII characters still reaches the cache, whose
// listener receives the notification in UTF-8 (the scope's bytes are
// counted there, not in the server's encoding).
func TestReplayCacheInAnotherEncoding(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	admin := adminConn(t)
	_, err := admin.Exec(ctx, `CREATE DATABASE idem_latin1 ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0`)
	var pgErr *pgconn.PgError
	if err != nil && !(errors.As(err, &pgErr) && (pgErr.Code == "42P04" || pgErr.Code == "23505")) {
		t.Fatal(err) // 42P04 exists already; 23505 another test run created it meanwhile
	}
	u, err := url.Parse(testURL(t))
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/idem_latin1"
	q := u.Query()
	q.Set("client_encoding", "UTF8") // pgx's simple protocol needs it; the server's default is LATIN1
	u.RawQuery = q.Encode()
	schema := pgdb.Schema(t, u.String())
	open := func(cache int64) *postgres.Store {
		s, err := postgres.Open(ctx, u.String(), postgres.Config{Schema: schema, MaxConns: 4, ReplayCache: cache})
		if err != nil {
			t.Fatalf("open: %v", err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	cached, operator := open(1<<20), open(0)
	p := reserveParams("k")
	p.Scope = "café POST /paiements"
	r, err := cached.Reserve(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if err := cached.Complete(ctx, store.CompleteParams{FenceParams: fence(r), Response: store.Response{Status: 201}, TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := cached.Reserve(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	if cached.CacheHits() != 1 {
		t.Fatalf("%d replays from memory, want 1", cached.CacheHits())
	}
	if err := operator.Delete(ctx, store.DeleteParams{Scope: p.Scope, Key: p.Key}); err != nil {
		t.Fatal(err)
	}
	if got, err := cached.Reserve(ctx, p); err != nil || got.Outcome == store.Existing {
		t.Fatalf("deleted, yet answered %v (%v)", got.Outcome, err)
	}
}

// TestReplayCacheEmptiedAfterALapse: a cache that stalls past its lease
// while keeping its connection (a paused process, a stalled link) is no
// longer waited for, and Deletes made meanwhile return with their
// notifications still queued on its connection. Once it renews, it must
// not answer from memory what one of those still names: it empties
// itself, as after a reconnection. Before, it applied the first queued
// notification, renewed, and answered the others' records from memory
// until it reached their notifications.
func TestReplayCacheEmptiedAfterALapse(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := newSchema(t)
	s := cachedStore(t, schema, nil)
	operator := openStore(t, schema, nil)
	keys := cachedAnswers(t, s, operator, "a", "b")
	// Each notification is applied 4s after it arrives, and the cache
	// renews nothing meanwhile: a's Delete returns once the cache's
	// registration lapses (3s), b's at once. The cache applies a's
	// notification at 4s, renews, and applies b's at 8s.
	s.SlowInvalidations(4 * time.Second)
	for _, p := range keys {
		if err := operator.Delete(ctx, store.DeleteParams{Scope: p.Scope, Key: p.Key}); err != nil {
			t.Fatal(err)
		}
	}
	deleted := time.Now()
	for time.Since(deleted) < 6*time.Second {
		got, err := s.Reserve(ctx, keys[1])
		if err != nil {
			t.Fatal(err)
		}
		if got.Record.State == store.StateCompleted {
			t.Fatalf("%v after its Delete returned, the deleted record was replayed", time.Since(deleted).Round(time.Millisecond))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestReplayCacheStaysWithinItsBudget: the records a cache keeps take no
// more memory than Config.ReplayCache, for answers of the usual shape (a
// header or two and a short body), where the structures that hold a
// record weigh more than its bytes. The estimate used to leave most of
// them out, and such a cache held nearly twice its budget.
func TestReplayCacheStaysWithinItsBudget(t *testing.T) {
	// Not parallel: it measures the heap.
	ctx := context.Background()
	schema := newSchema(t)
	const budget, n = 2 << 20, 6000 // records: about three times what fits
	operator := openStore(t, schema, nil)
	params := func(i int) store.ReserveParams {
		p := reserveParams(fmt.Sprintf("key-%06d", i))
		p.Fingerprint = fmt.Sprintf("%064x", i)
		return p
	}
	const workers = 16
	var wg sync.WaitGroup
	errs := make([]error, workers)
	for w := range workers {
		wg.Go(func() {
			for i := w; i < n && errs[w] == nil; i += workers {
				p := params(i)
				r, err := operator.Reserve(ctx, p)
				if err != nil {
					errs[w] = err
					break
				}
				resp := store.Response{Status: 201,
					Header: http.Header{"Content-Type": {"application/json"}, "Location": {"/v1/payments/py_" + p.Key}},
					Body:   []byte(`{"id":"py_` + p.Key + `","status":"succeeded"}`)}
				errs[w] = operator.Complete(ctx, store.CompleteParams{FenceParams: fence(r), Response: resp, TTL: time.Hour})
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	s, err := postgres.Open(ctx, testURL(t), postgres.Config{Schema: schema, MaxConns: 2, ReplayCache: budget})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Reserve(ctx, params(0)); err != nil { // the pool's connection made before measuring
		t.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := range n {
		if _, err := s.Reserve(ctx, params(i)); err != nil {
			t.Fatal(err)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	held := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	hits := s.CacheHits()
	if _, err := s.Reserve(ctx, params(n-1)); err != nil || s.CacheHits() != hits+1 {
		t.Fatalf("the last record read is not answered from memory (%v)", err)
	}
	if held > budget*5/4 {
		t.Fatalf("a cache of %d bytes holds %d bytes of records (%.2f times)", budget, held, float64(held)/budget)
	}
}

// cachedAnswers completes a record for each key through operator and
// replays each twice through s, which then holds them in memory (the
// second replay is a hit). It returns the keys' reservations.
func cachedAnswers(t *testing.T, s, operator *postgres.Store, keys ...string) []store.ReserveParams {
	t.Helper()
	ctx := context.Background()
	var out []store.ReserveParams
	for _, k := range keys {
		p := reserveParams(k)
		r, err := operator.Reserve(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		if err := operator.Complete(ctx, store.CompleteParams{FenceParams: fence(r), Response: store.Response{Status: 201}, TTL: time.Hour}); err != nil {
			t.Fatal(err)
		}
		for range 2 { // read, then answered from memory
			if _, err := s.Reserve(ctx, p); err != nil {
				t.Fatal(err)
			}
		}
		out = append(out, p)
	}
	if got := s.CacheHits(); got != int64(len(keys)) {
		t.Fatalf("%d replays from memory, want %d", got, len(keys))
	}
	return out
}
