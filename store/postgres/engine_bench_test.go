package postgres_test

// Figures of the whole stack on PostgreSQL: the engine's middleware over the
// store, against the store's own statements sent straight through pgx. See
// BenchmarkEnginePostgres for throughput, TestPostgresLatency for latency at
// low load and TestPostgresGrowth for the cost of a large table. The
// commands that reproduce each figure are in the doc comment of each.

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/postgres"
)

// The request every figure uses: a small JSON POST answered by a small
// JSON 201, on a route outside any mux (the scope falls back to the path).
const (
	engineURL      = "http://api.test/v1/charges"
	engineRoute    = "/v1/charges"
	engineReqBody  = `{"amount":1000,"currency":"eur","customer":"cus_9s6XKzkNRiz8i3","description":"order 1234"}`
	engineRespBody = `{"id":"ch_1","status":"succeeded"}`

	// engineWorkers is the number of requests in flight, as a server with
	// that many concurrent clients would have; the pool has as many
	// connections (benchConns), so no request waits for one.
	engineWorkers = benchConns

	// engineSlice is the length a slice of one variant aims at in
	// runPaired: long next to one request (a few ms under load), so the
	// drain at the end of a slice costs little, and short next to the
	// drift of a machine shared with other jobs.
	engineSlice = 100 * time.Millisecond
)

// enginePool opens a pool of engineWorkers connections on a fresh,
// migrated schema: benchPool, for tests as well as benchmarks.
func enginePool(tb testing.TB) (*pgxpool.Pool, string) {
	tb.Helper()
	schema := newSchema(tb)
	pcfg, err := pgxpool.ParseConfig(testURL(tb))
	if err != nil {
		tb.Fatal(err)
	}
	pcfg.MaxConns = engineWorkers
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(pool.Close)
	if _, err := postgres.New(context.Background(), pool, postgres.Config{Schema: schema}); err != nil {
		tb.Fatal(err)
	}
	return pool, schema
}

// benchEnabled skips the slow measurements (latency, growth) unless
// IDEM_BENCH=1.
func benchEnabled(t *testing.T) {
	t.Helper()
	if os.Getenv("IDEM_BENCH") != "1" {
		t.Skip("set IDEM_BENCH=1 to run this measurement (it takes a while and loads the database)")
	}
}

func engineHandler(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	io.WriteString(w, engineRespBody)
}

// serveEngine sends one request with key through h and checks the answer:
// a fresh 201 when replayed is false, a replayed 201 otherwise.
func serveEngine(h http.Handler, key string, replayed bool) error {
	r, err := http.NewRequest(http.MethodPost, engineURL, strings.NewReader(engineReqBody))
	if err != nil {
		return err
	}
	r.Header["Content-Type"] = []string{"application/json"}
	r.Header["Idempotency-Key"] = []string{`"` + key + `"`}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != http.StatusCreated {
		return fmt.Errorf("key %s: status %d: %s", key, w.Code, w.Body)
	}
	if got := w.Header().Get("Idempotent-Replayed") == "true"; got != replayed {
		return fmt.Errorf("key %s: replayed %v, want %v", key, got, replayed)
	}
	return nil
}

func newEngine(tb testing.TB, s store.Store) *idem.Engine {
	tb.Helper()
	e, err := idem.New(s, idem.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		tb.Fatal(err)
	}
	return e
}

// ceiling sends the statements the store sends for the engine's request
// (the same SQL text and the same arguments, see TestCeilingStatements),
// straight through pgx: no engine, no store code, no HTTP.
type ceiling struct {
	pool              *pgxpool.Pool
	reserve, complete string
	scope, fp         string
	lease, ttl        int64 // microseconds, as the store sends them
	policy            string
	headers           pgtype.Text
	body              []byte
}

func newCeiling(tb testing.TB, pool *pgxpool.Pool, schema string, e *idem.Engine) *ceiling {
	tb.Helper()
	fp, err := e.Fingerprint(idem.Call{Method: http.MethodPost, Route: engineRoute, Target: engineRoute,
		ContentType: "application/json", Body: []byte(engineReqBody)})
	if err != nil {
		tb.Fatal(err)
	}
	headers, err := json.Marshal(http.Header{"Content-Type": {"application/json"}})
	if err != nil {
		tb.Fatal(err)
	}
	// The engine's defaults: a 30s lease, a 24h TTL, lease policy unknown.
	return &ceiling{
		pool:     pool,
		reserve:  inSchema(postgres.SQLReserve, schema),
		complete: inSchema(postgres.SQLComplete, schema),
		scope:    (&idem.Request{Method: http.MethodPost, Route: engineRoute}).Scope(),
		fp:       fp,
		lease:    (30 * time.Second).Microseconds(),
		ttl:      (24 * time.Hour).Microseconds(),
		policy:   string(store.LeaseUnknown),
		headers:  pgtype.Text{String: string(headers), Valid: true},
		body:     []byte(engineRespBody),
	}
}

// reserveArgs and completeArgs are the statements' arguments in the
// store's order; the nil is the clock (the database's).
func (c *ceiling) reserveArgs(key string) []any {
	return []any{c.scope, key, c.fp, c.lease, c.ttl, c.policy, nil, "", int64(0)}
}

func (c *ceiling) completeArgs(key string, fence int64) []any {
	return []any{c.scope, key, fence, nil, http.StatusCreated, c.headers, c.body, false, c.ttl}
}

// newKey reserves and completes a fresh key. It decodes only what it needs
// to check and to go on (action, fence); pgx skips the other columns.
func (c *ceiling) newKey(ctx context.Context, key string) error {
	var action string
	var fence int64
	dest := make([]any, 23) // action + the 22 record columns
	dest[0], dest[5] = &action, &fence
	if err := c.pool.QueryRow(ctx, c.reserve, c.reserveArgs(key)...).Scan(dest...); err != nil {
		return fmt.Errorf("reserve: %w", err)
	}
	if action != "created" {
		return fmt.Errorf("reserve of a fresh key: %s", action)
	}
	return expectOne(c.pool.Exec(ctx, c.complete, c.completeArgs(key, fence)...))
}

// replay sends the reserve of a completed key: the one statement a replay
// costs.
func (c *ceiling) replay(ctx context.Context, key string) error {
	var action, state string
	dest := make([]any, 23)
	dest[0], dest[4] = &action, &state
	if err := c.pool.QueryRow(ctx, c.reserve, c.reserveArgs(key)...).Scan(dest...); err != nil {
		return fmt.Errorf("replay: %w", err)
	}
	if action != "existing" || state != string(store.StateCompleted) {
		return fmt.Errorf("replay: %s on a %s record", action, state)
	}
	return nil
}

// keyGen hands out fresh keys, unique within one schema.
type keyGen struct {
	prefix string
	seq    atomic.Int64
}

func (g *keyGen) next() string { return fmt.Sprint(g.prefix, g.seq.Add(1)) }

// variant is one way of serving a request, as one operation.
type variant struct {
	name string
	op   func(ctx context.Context) error
}

// BenchmarkEnginePostgres measures requests through the engine's
// middleware on the PostgreSQL store (httptest recorders, a handler that
// writes a small JSON 201) against their ceiling: the store's own
// statements sent straight through pgx on a pool of the same size, with no
// engine, store code or HTTP around them. 16 requests are in flight.
//
//   - new: a fresh key per request (reserve + complete, two round trips);
//   - replay: one completed key replayed (one round trip, no write).
//
// Each group has the leaves engine and ceiling; the store batches as
// configured (IDEM_BENCH_MAX_BATCHES=-1 turns its group commit off). Every
// leaf runs its own variant for b.N requests in slices of about 100ms that
// alternate with slices of its companion (the ceiling for engine, engine
// for the ceiling), so that both see the same machine at
// the same time. ns/op is the wall time per request of the leaf's own
// slices (1/throughput with 16 in flight); ops/s is the same figure as a
// rate, pair-ops/s the companion's, and ratio the non-ceiling variant's
// throughput over the ceiling's measured within that leaf. cpu-us/op is
// the CPU time of this process per request and pg-cpu-us/op that of the
// pool's server backends (read from /proc when the server is local), each
// with its pair- counterpart: on a machine whose cores the client and the
// server share, throughput follows their sum.
//
// Reproduce. benchratio divides the median ns/op of each leaf by the
// ceiling leaf's (a time ratio, the inverse of a throughput ratio), and
// those leaves ran one after the other; the ratio metric, taken within
// one leaf, is the steadier figure on a busy machine.
//
//	export IDEM_TEST_POSTGRES_URL='postgres://postgres@127.0.0.1:5432/test?sslmode=disable'
//	go test -run '^$' -bench BenchmarkEnginePostgres -benchtime 2s -count 5 ./store/postgres/ | tee /tmp/pg.txt
//	go run ./internal/tools/benchratio < /tmp/pg.txt
func BenchmarkEnginePostgres(b *testing.B) {
	groups := []struct {
		name string
		// variants builds the engine and ceiling operations of the group
		// on a handler and a ceiling that share one schema.
		variants func(b *testing.B, h http.Handler, c *ceiling) (engine, ceil variant)
	}{
		{"new", func(b *testing.B, h http.Handler, c *ceiling) (engine, ceil variant) {
			ek, ck := &keyGen{prefix: "new-"}, &keyGen{prefix: "cei-"}
			engine = variant{"engine", func(context.Context) error { return serveEngine(h, ek.next(), false) }}
			ceil = variant{"ceiling", func(ctx context.Context) error { return c.newKey(ctx, ck.next()) }}
			return engine, ceil
		}},
		{"replay", func(b *testing.B, h http.Handler, c *ceiling) (engine, ceil variant) {
			const key = "done-1"
			if err := serveEngine(h, key, false); err != nil {
				b.Fatal(err)
			}
			engine = variant{"engine", func(context.Context) error { return serveEngine(h, key, true) }}
			ceil = variant{"ceiling", func(ctx context.Context) error { return c.replay(ctx, key) }}
			return engine, ceil
		}},
	}
	for _, g := range groups {
		// setup opens a fresh schema and returns the group's variants.
		setup := func(b *testing.B) (pool *pgxpool.Pool, engine, ceil variant) {
			pool, schema := enginePool(b)
			s, err := postgres.New(context.Background(), pool, postgres.Config{Schema: schema, SkipMigrate: true,
				MaxBatches: benchMaxBatches(b)})
			if err != nil {
				b.Fatal(err)
			}
			e := newEngine(b, s)
			engine, ceil = g.variants(b, e.Middleware(http.HandlerFunc(engineHandler)), newCeiling(b, pool, schema, e))
			return pool, engine, ceil
		}
		b.Run(g.name, func(b *testing.B) {
			b.Run("engine", func(b *testing.B) {
				pool, engine, ceil := setup(b)
				runPaired(b, pool, engine, ceil)
			})
			b.Run("ceiling", func(b *testing.B) {
				pool, engine, ceil := setup(b)
				runPaired(b, pool, ceil, engine)
			})
		})
	}
}

// runPaired runs b.N operations of own and, interleaved with them, slices
// of pair, each slice with engineWorkers operations in flight until its
// quota is done. Slices alternate and swap which goes first every turn;
// each variant's quota follows its own rate so that its slices last about
// engineSlice. Only own's slices make up ns/op.
func runPaired(b *testing.B, pool *pgxpool.Pool, own, pair variant) {
	ctx := context.Background()
	vs := [2]variant{own, pair}
	var ops [2]int64
	var dur, client, server [2]time.Duration
	quota := [2]int64{engineWorkers * 4, engineWorkers * 4}
	// Warm up both before timing: the pool dials its connections and
	// prepares the statements on each (the same texts for both variants)
	// as they are first used, which would fall on whoever went first.
	for _, v := range vs {
		if _, err := runSlice(ctx, v.op, engineWorkers*8); err != nil {
			b.Fatalf("%s: %v", v.name, err)
		}
	}
	cpu := newCPUMeter(ctx, pool)
	left := int64(b.N)
	b.ResetTimer()
	for turn := 0; left > 0; turn++ {
		for j := range 2 {
			w := (turn + j) % 2
			q := quota[w]
			if w == 0 {
				if left < 2*q {
					q = left // no short slice at the end
				}
				left -= q
			}
			c0, s0 := cpu.read()
			d, err := runSlice(ctx, vs[w].op, q)
			if err != nil {
				b.Fatalf("%s: %v", vs[w].name, err)
			}
			c1, s1 := cpu.read()
			ops[w] += q
			dur[w] += d
			client[w] += c1 - c0
			server[w] += s1 - s0
			quota[w] = max(engineWorkers, min(int64(float64(q)*float64(engineSlice)/float64(d)), 100_000))
		}
	}
	b.StopTimer()
	rate := func(w int) float64 { return float64(ops[w]) / dur[w].Seconds() }
	b.ReportMetric(float64(dur[0].Nanoseconds())/float64(ops[0]), "ns/op")
	b.ReportMetric(rate(0), "ops/s")
	b.ReportMetric(rate(1), "pair-ops/s")
	if own.name == "ceiling" {
		b.ReportMetric(rate(1)/rate(0), "ratio")
	} else {
		b.ReportMetric(rate(0)/rate(1), "ratio")
	}
	perOp := func(d [2]time.Duration, w int) float64 { return float64(d[w].Microseconds()) / float64(ops[w]) }
	b.ReportMetric(perOp(client, 0), "cpu-us/op")
	b.ReportMetric(perOp(client, 1), "pair-cpu-us/op")
	if cpu.server {
		b.ReportMetric(perOp(server, 0), "pg-cpu-us/op")
		b.ReportMetric(perOp(server, 1), "pair-pg-cpu-us/op")
	}
}

// cpuMeter reads the CPU time used by this process (client) and by the
// server processes behind a pool's connections, when the server runs on
// this machine. Unlike wall time, CPU time per request hardly depends on
// what else the machine runs, so it shows where a difference comes from.
type cpuMeter struct {
	pids   []uint32
	server bool // the backends' /proc entries are readable
}

// newCPUMeter notes the backend of every connection the pool holds; call
// it once the pool is warm.
func newCPUMeter(ctx context.Context, pool *pgxpool.Pool) *cpuMeter {
	m := &cpuMeter{}
	for _, c := range pool.AcquireAllIdle(ctx) {
		m.pids = append(m.pids, c.Conn().PgConn().PID())
		c.Release()
	}
	_, err := m.serverTime()
	m.server = err == nil && len(m.pids) > 0
	return m
}

func (m *cpuMeter) read() (client, server time.Duration) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err == nil {
		client = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	if m.server {
		server, _ = m.serverTime()
	}
	return client, server
}

// serverTime adds up utime and stime (fields 14 and 15 of
// /proc/PID/stat, in clock ticks of 10ms) of the backends.
func (m *cpuMeter) serverTime() (time.Duration, error) {
	var total time.Duration
	for _, pid := range m.pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return 0, err
		}
		// The command name (field 2) may hold spaces; fields count from
		// the parenthesis that closes it.
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		if len(f) < 13 {
			return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
		}
		for _, s := range f[11:13] {
			ticks, err := strconv.ParseInt(s, 10, 64)
			if err != nil {
				return 0, err
			}
			total += time.Duration(ticks) * 10 * time.Millisecond
		}
	}
	return total, nil
}

// runSlice runs n operations with up to engineWorkers in flight and
// returns the wall time. The first error stops the slice.
func runSlice(ctx context.Context, op func(context.Context) error, n int64) (time.Duration, error) {
	var (
		next    atomic.Int64
		errOnce sync.Once
		first   error
		wg      sync.WaitGroup
	)
	start := time.Now()
	for range min(engineWorkers, n) {
		wg.Go(func() {
			for next.Add(1) <= n {
				if err := op(ctx); err != nil {
					errOnce.Do(func() { first = err })
					next.Store(n)
					return
				}
			}
		})
	}
	wg.Wait()
	return time.Since(start), first
}

// sqlTracer records the statements and arguments a pool sends.
type sqlTracer struct {
	mu   sync.Mutex
	sent []sentQuery
}

type sentQuery struct {
	sql  string
	args []any
}

func (t *sqlTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.sent = append(t.sent, sentQuery{d.SQL, slices.Clone(d.Args)})
	return ctx
}

func (t *sqlTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (t *sqlTracer) take() []sentQuery {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.sent
	t.sent = nil
	return s
}

// TestCeilingStatements checks that the ceiling of BenchmarkEnginePostgres
// sends exactly what the engine makes the store send for the same request,
// statement for statement and argument for argument (the key aside), and
// that the engine sends nothing else: a new key costs two statements, a
// replay one.
func TestCeilingStatements(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := newSchema(t)
	tracer := &sqlTracer{}
	pcfg, err := pgxpool.ParseConfig(testURL(t))
	if err != nil {
		t.Fatal(err)
	}
	pcfg.MaxConns = 2
	pcfg.ConnConfig.Tracer = tracer
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	s, err := postgres.New(ctx, pool, postgres.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	e := newEngine(t, s)
	h := e.Middleware(http.HandlerFunc(engineHandler))
	c := newCeiling(t, pool, schema, e)

	// The key is the only argument that differs; both sides use the same
	// one, on records deleted in between.
	const key = "k-1"
	drop := func() {
		t.Helper()
		if _, err := pool.Exec(ctx, "DELETE FROM "+pgx.Identifier{schema, "idem_records"}.Sanitize()); err != nil {
			t.Fatal(err)
		}
		tracer.take()
	}
	compare := func(what string, engine, ceiling []sentQuery, want ...string) {
		t.Helper()
		if len(engine) != len(want) {
			t.Fatalf("%s: the engine sent %d statements, want %d: %v", what, len(engine), len(want), engine)
		}
		for i := range want {
			if engine[i].sql != want[i] {
				t.Errorf("%s: engine statement %d is not the exported one:\n%s", what, i, engine[i].sql)
			}
		}
		if len(ceiling) != len(engine) {
			t.Fatalf("%s: the ceiling sent %d statements, the engine %d", what, len(ceiling), len(engine))
		}
		for i := range engine {
			switch engine[i].sql {
			case c.complete:
				// The fence is the store clock at each record's creation.
				ceiling[i].args[2], engine[i].args[2] = positive(ceiling[i].args[2]), positive(engine[i].args[2])
			case c.reserve:
				// The engine draws each reservation's owner at random.
				engine[i].args[8] = nonZero(engine[i].args[8])
				ceiling[i].args[8] = "non-zero"
			}
			if ceiling[i].sql != engine[i].sql {
				t.Errorf("%s: statement %d: the ceiling sent\n%s", what, i, ceiling[i].sql)
			}
			if !reflect.DeepEqual(ceiling[i].args, engine[i].args) {
				t.Errorf("%s: statement %d: arguments differ\nengine:  %#v\nceiling: %#v", what, i, engine[i].args, ceiling[i].args)
			}
		}
	}
	tracer.take() // migration

	if err := serveEngine(h, key, false); err != nil {
		t.Fatal(err)
	}
	engineNew := tracer.take()
	drop()
	if err := c.newKey(ctx, key); err != nil {
		t.Fatal(err)
	}
	compare("new key", engineNew, tracer.take(), c.reserve, c.complete)

	if err := serveEngine(h, key, true); err != nil {
		t.Fatal(err)
	}
	engineReplay := tracer.take()
	if err := c.replay(ctx, key); err != nil {
		t.Fatal(err)
	}
	compare("replay", engineReplay, tracer.take(), c.reserve)
}

// latencies collects per-request durations of one variant.
type latencies []time.Duration

func (l latencies) quantile(q float64) time.Duration {
	s := slices.Clone(l)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

func (l latencies) String() string {
	return fmt.Sprintf("p50 %v  p90 %v  p99 %v  max %v",
		l.quantile(0.50).Round(time.Microsecond), l.quantile(0.90).Round(time.Microsecond),
		l.quantile(0.99).Round(time.Microsecond), slices.Max(l).Round(time.Microsecond))
}

// TestPostgresLatency measures latency at low load: one request at a time,
// 2000 new keys then 2000 replays (each key replayed once), through the
// engine's middleware and, alternating with it request by request, through
// the ceiling (the same statements straight through pgx).
//
//	IDEM_BENCH=1 go test -run TestPostgresLatency -v -count 1 ./store/postgres/
func TestPostgresLatency(t *testing.T) {
	benchEnabled(t)
	ctx := context.Background()
	const n = 2000
	pool, schema := enginePool(t)
	s, err := postgres.New(ctx, pool, postgres.Config{Schema: schema, SkipMigrate: true})
	if err != nil {
		t.Fatal(err)
	}
	e := newEngine(t, s)
	h := e.Middleware(http.HandlerFunc(engineHandler))
	c := newCeiling(t, pool, schema, e)

	type way struct {
		name string
		do   func(i int) error
	}
	// measure runs request i of every way in turn, rotating which goes
	// first so that none always follows another.
	measure := func(what string, ways ...way) {
		t.Helper()
		lat := make([]latencies, len(ways))
		for i := range n {
			for j := range ways {
				k := (i + j) % len(ways)
				start := time.Now()
				if err := ways[k].do(i); err != nil {
					t.Fatalf("%s %s: %v", what, ways[k].name, err)
				}
				lat[k] = append(lat[k], time.Since(start))
			}
		}
		for k, w := range ways {
			t.Logf("%-6s %-16s %s", what, w.name+":", lat[k])
		}
		base := lat[len(ways)-1]
		for k, w := range ways[:len(ways)-1] {
			t.Logf("%-6s %s/ceiling: p50 %.2f, p99 %.2f", what, w.name,
				float64(lat[k].quantile(0.5))/float64(base.quantile(0.5)),
				float64(lat[k].quantile(0.99))/float64(base.quantile(0.99)))
		}
	}
	key := func(side string, i int) string { return fmt.Sprint(side, "-", i) }
	// Warm up the statement cache of the connection(s) in use.
	for i := range 50 {
		if err := serveEngine(h, key("we", i), false); err != nil {
			t.Fatal(err)
		}
		if err := c.newKey(ctx, key("wc", i)); err != nil {
			t.Fatal(err)
		}
	}
	measure("new",
		way{"engine", func(i int) error { return serveEngine(h, key("e", i), false) }},
		way{"ceiling", func(i int) error { return c.newKey(ctx, key("c", i)) }})
	measure("replay",
		way{"engine", func(i int) error { return serveEngine(h, key("e", i), true) }},
		way{"ceiling", func(i int) error { return c.replay(ctx, key("c", i)) }})
}

// sqlFill appends rows $1 .. $2 (by number) to idem_records in one
// statement, shaped like a busy deployment's completed records: 1000
// tenants on one route, UUID-like keys in random index order, SHA-256 hex
// fingerprints, a stored JSON response, creation spread over the last day.
const sqlFill = `
INSERT INTO {schema}idem_records
	(scope, key, fingerprint, state, fence, lease_policy, locked_until,
	 response_status, response_headers, response_body, attempts,
	 created_at, updated_at, completed_at, expires_at)
SELECT '11:tenant-' || lpad((i % 1000)::text, 4, '0') || 'POST /v1/charges',
	md5(i::text)::uuid::text,
	encode(sha256(i::text::bytea), 'hex'),
	'completed', 1, 'unknown', t + interval '30 seconds',
	201, '{"Content-Type": ["application/json"]}'::jsonb,
	convert_to('{"id":"ch_' || i || '","status":"succeeded"}', 'UTF8'), 1,
	t, t, t, t + interval '24 hours'
FROM generate_series($1::bigint, $2::bigint) AS i,
	LATERAL (SELECT now() - (i % 86400) * interval '1 second' AS t) AS c`

// TestPostgresGrowth compares Reserve and Reserve+Complete latency (p50,
// one request at a time, fresh random UUID keys) on a table of 10 thousand
// records and on the same table grown to 10 million with one INSERT ...
// SELECT over generate_series. A second table kept at 10 thousand records
// is measured alternately with the large one, so the comparison also
// holds against a control taken at the same time.
//
// It needs about 6 GB of disk and several minutes; the schemas are dropped
// at the end.
//
//	IDEM_BENCH=1 go test -run TestPostgresGrowth -v -count 1 -timeout 60m ./store/postgres/
func TestPostgresGrowth(t *testing.T) {
	benchEnabled(t)
	ctx := context.Background()
	const (
		small   = 10_000
		samples = 2000
	)
	large := int64(10_000_000)
	if v := os.Getenv("IDEM_BENCH_GROWTH_ROWS"); v != "" { // a quicker trial run
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n <= small {
			t.Fatalf("IDEM_BENCH_GROWTH_ROWS=%q: want a number above %d", v, small)
		}
		large = n
	}
	admin := adminConn(t)
	type table struct {
		name   string
		schema string
		s      *postgres.Store
		rows   int64
	}
	open := func(name string) *table {
		pool, schema := enginePool(t)
		s, err := postgres.New(ctx, pool, postgres.Config{Schema: schema, SkipMigrate: true})
		if err != nil {
			t.Fatal(err)
		}
		return &table{name: name, schema: schema, s: s}
	}
	exec := func(what, sql string, args ...any) time.Duration {
		t.Helper()
		start := time.Now()
		if _, err := admin.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		return time.Since(start)
	}
	fill := func(tb *table, from, to int64) {
		t.Helper()
		d := exec("fill", inSchema(sqlFill, tb.schema), from, to)
		da := exec("analyze", "ANALYZE "+pgx.Identifier{tb.schema, "idem_records"}.Sanitize())
		// Write the load out now rather than during the measurement.
		dc := exec("checkpoint", "CHECKPOINT")
		var size string
		if err := admin.QueryRow(ctx, "SELECT pg_size_pretty(pg_total_relation_size($1::regclass))",
			pgx.Identifier{tb.schema, "idem_records"}.Sanitize()).Scan(&size); err != nil {
			t.Fatal(err)
		}
		tb.rows = to
		t.Logf("%s: rows %d..%d inserted in %v, ANALYZE %v, CHECKPOINT %v; table with indexes %s",
			tb.name, from, to, d.Round(time.Millisecond), da.Round(time.Millisecond), dc.Round(time.Millisecond), size)
	}
	// One request: a fresh random key, reserved then completed.
	type sample struct{ reserve, total time.Duration }
	request := func(tb *table) sample {
		var raw [16]byte
		rand.Read(raw[:])
		h := hex.EncodeToString(raw[:])
		p := store.ReserveParams{
			Scope: fmt.Sprintf("11:tenant-%04dPOST /v1/charges", raw[0]%100), Key: h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:],
			Fingerprint: h + h, Lease: 30 * time.Second, TTL: 24 * time.Hour, LeasePolicy: store.LeaseUnknown,
		}
		start := time.Now()
		r, err := tb.s.Reserve(ctx, p)
		reserved := time.Since(start)
		if err != nil || r.Outcome != store.Created {
			t.Fatalf("%s: reserve: %v %v", tb.name, r.Outcome, err)
		}
		err = tb.s.Complete(ctx, store.CompleteParams{
			FenceParams: store.FenceParams{Scope: p.Scope, Key: p.Key, Fence: r.Record.Fence},
			Response:    benchResponse, TTL: 24 * time.Hour,
		})
		if err != nil {
			t.Fatalf("%s: complete: %v", tb.name, err)
		}
		return sample{reserved, time.Since(start)}
	}
	// measure runs samples requests on each table, alternating between
	// them request by request, after a warm-up.
	measure := func(tables ...*table) map[*table][2]time.Duration {
		t.Helper()
		for range 200 {
			for _, tb := range tables {
				request(tb)
			}
		}
		res := map[*table][2]time.Duration{}
		lat := make([][2]latencies, len(tables))
		for i := range samples {
			for j := range tables {
				k := (i + j) % len(tables)
				s := request(tables[k])
				lat[k][0] = append(lat[k][0], s.reserve)
				lat[k][1] = append(lat[k][1], s.total)
			}
		}
		for k, tb := range tables {
			t.Logf("%s, %d rows: reserve %s", tb.name, tb.rows, lat[k][0])
			t.Logf("%s, %d rows: reserve+complete %s", tb.name, tb.rows, lat[k][1])
			res[tb] = [2]time.Duration{lat[k][0].quantile(0.5), lat[k][1].quantile(0.5)}
		}
		return res
	}

	grown, control := open("grown"), open("control")
	fill(grown, 1, small)
	fill(control, 1, small)
	before := measure(grown, control)[grown]

	start := time.Now()
	fill(grown, small+1, large)
	t.Logf("growth to %d rows (insert, analyze, checkpoint): %v", large, time.Since(start).Round(time.Second))
	after := measure(grown, control)
	ratio := func(a, b time.Duration) float64 { return float64(a) / float64(b) }
	t.Logf("reserve p50: %v at %d rows, %v at %d: %.2fx (control table at %d meanwhile: %v, %.2fx)",
		before[0].Round(time.Microsecond), small, after[grown][0].Round(time.Microsecond), large, ratio(after[grown][0], before[0]),
		small, after[control][0].Round(time.Microsecond), ratio(after[grown][0], after[control][0]))
	t.Logf("reserve+complete p50: %v at %d rows, %v at %d: %.2fx (control table at %d meanwhile: %v, %.2fx)",
		before[1].Round(time.Microsecond), small, after[grown][1].Round(time.Microsecond), large, ratio(after[grown][1], before[1]),
		small, after[control][1].Round(time.Microsecond), ratio(after[grown][1], after[control][1]))
}

// benchMaxBatches reads IDEM_BENCH_MAX_BATCHES (Config.MaxBatches of the
// engine's store; -1 turns group commit off), to compare settings.
func benchMaxBatches(b *testing.B) int {
	v := os.Getenv("IDEM_BENCH_MAX_BATCHES")
	if v == "" {
		return 0
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		b.Fatalf("IDEM_BENCH_MAX_BATCHES=%q: %v", v, err)
	}
	return n
}

// positive replaces a positive int64 by 1, so two fences issued at
// different instants compare equal when both are valid.
func positive(v any) any {
	if f, ok := v.(int64); ok && f > 0 {
		return int64(1)
	}
	return v
}

// nonZero stands for any owner the engine may draw: every int64 but 0.
func nonZero(v any) any {
	if o, ok := v.(int64); ok && o != 0 {
		return "non-zero"
	}
	return v
}
