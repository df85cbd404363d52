package outbox_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/testkit/pgdb"
	"github.com/idem-go/idem/internal/testkit/testenv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	"go.uber.org/goleak"

	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/postgres"
	"github.com/idem-go/idem/store/sqlite"
)

const urlEnv = "IDEM_TEST_POSTGRES_URL"

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// txStore is what the tests need of an idem SQL store: reserve and get
// outside, complete inside the caller's transaction.
type txStore[TTx any] interface {
	store.Store
	store.TxStore[TTx]
	InTx(ctx context.Context, fn func(tx TTx) error) error
}

// database is one test database (a fresh PostgreSQL schema or a fresh
// SQLite file) with idem's store on it and a business table, payments.
type database[TTx any] struct {
	name  string
	store txStore[TTx]
	// newOutboxUnmigrated returns an outbox on a pool of its own, as
	// another process would have.
	newOutboxUnmigrated func(t *testing.T, cfg outbox.Config) *outbox.Outbox[TTx]
	// newOutbox returns a migrated outbox on the store's pool.
	newOutbox func(t *testing.T, cfg outbox.Config) *outbox.Outbox[TTx]
	// insertPayment is the business write.
	insertPayment func(ctx context.Context, tx TTx, key string, amount int) error
	// payments counts the business rows of key.
	payments func(t *testing.T, key string) int
	// env tells a helper process how to open the same database.
	env []string
}

// forEachDB runs test on PostgreSQL and on SQLite, in parallel.
func forEachDB(t *testing.T, pg func(*testing.T, database[pgx.Tx]), lite func(*testing.T, database[*sql.Tx])) {
	t.Parallel()
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		pg(t, newPostgresDB(t))
	})
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		lite(t, newSQLiteDB(t))
	})
}

func testURL(t testing.TB) string {
	t.Helper()
	u := os.Getenv(urlEnv)
	if u == "" {
		testenv.Skip(t, fmt.Sprintf("%s is not set; set it to e.g. postgres://postgres@127.0.0.1:5432/test?sslmode=disable to run the PostgreSQL outbox tests", urlEnv))
	}
	return u
}

// newSchema creates an empty schema for one test and drops it afterwards.
func newSchema(t testing.TB, url string) string {
	t.Helper()
	return pgdb.Schema(t, url)
}

// openPool opens a pool whose search_path is schema: River, the outbox and
// idem's store all find their tables there.
func openPool(ctx context.Context, url, schema string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	return pgxpool.NewWithConfig(ctx, cfg)
}

func newPostgresDB(t *testing.T) database[pgx.Tx] {
	url := testURL(t)
	schema := newSchema(t, url)
	ctx := context.Background()
	pool, err := openPool(ctx, url, schema)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s, err := postgres.New(ctx, pool, postgres.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE payments (key text NOT NULL, amount int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return database[pgx.Tx]{
		name:  "postgres",
		store: s,
		newOutbox: func(t *testing.T, cfg outbox.Config) *outbox.Outbox[pgx.Tx] {
			o, err := outbox.NewPostgres(pool, cfg)
			if err != nil {
				t.Fatal(err)
			}
			migrate(t, o)
			return o
		},
		newOutboxUnmigrated: func(t *testing.T, cfg outbox.Config) *outbox.Outbox[pgx.Tx] {
			other, err := openPool(ctx, url, schema)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(other.Close)
			o, err := outbox.NewPostgres(other, cfg)
			if err != nil {
				t.Fatal(err)
			}
			return o
		},
		insertPayment: func(ctx context.Context, tx pgx.Tx, key string, amount int) error {
			_, err := tx.Exec(ctx, `INSERT INTO payments (key, amount) VALUES ($1, $2)`, key, amount)
			return err
		},
		payments: func(t *testing.T, key string) int {
			var n int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM payments WHERE key = $1`, key).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		},
		env: []string{helperDBEnv + "=postgres", helperDSNEnv + "=" + schema},
	}
}

func newSQLiteDB(t *testing.T) database[*sql.Tx] {
	path := filepath.Join(t.TempDir(), "idem.db")
	ctx := context.Background()
	s, err := sqlite.Open(ctx, path, sqlite.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	})
	db := s.DB()
	if _, err := db.ExecContext(ctx, `CREATE TABLE payments (key TEXT NOT NULL, amount INTEGER NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return database[*sql.Tx]{
		name:  "sqlite",
		store: s,
		newOutbox: func(t *testing.T, cfg outbox.Config) *outbox.Outbox[*sql.Tx] {
			// The outbox shares the store's writer: one connection,
			// immediate transactions, the handler's transaction.
			o, err := outbox.NewSQLite(db, cfg)
			if err != nil {
				t.Fatal(err)
			}
			migrate(t, o)
			return o
		},
		newOutboxUnmigrated: func(t *testing.T, cfg outbox.Config) *outbox.Outbox[*sql.Tx] {
			other, err := sqlite.Open(ctx, path, sqlite.Config{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { other.Close() })
			o, err := outbox.NewSQLite(other.DB(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			return o
		},
		insertPayment: func(ctx context.Context, tx *sql.Tx, key string, amount int) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO payments (key, amount) VALUES (?, ?)`, key, amount)
			return err
		},
		payments: func(t *testing.T, key string) int {
			var n int
			if err := db.QueryRowContext(ctx, `SELECT count(*) FROM payments WHERE key = ?`, key).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		},
		env: []string{helperDBEnv + "=sqlite", helperDSNEnv + "=" + path},
	}
}

type migrator interface{ Migrate(context.Context) error }

func migrate(t *testing.T, o migrator) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := o.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
}

type startStopper interface {
	Start(context.Context) error
	Stop(context.Context) error
}

// start starts o and stops it at cleanup, before the database closes.
func start(t *testing.T, o startStopper) {
	t.Helper()
	if err := o.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := o.Stop(ctx); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
}

// stop stops o now, so that no delivery happens after it.
func stop(t *testing.T, o startStopper) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := o.Stop(ctx); err != nil {
		t.Fatalf("stop: %v", err)
	}
}

// testConfig is a configuration that retries at once and polls often, so
// tests wait milliseconds instead of River's production delays.
func testConfig(d outbox.Deliverer, logs *logBuffer, meters *meterRecorder) outbox.Config {
	return outbox.Config{
		Deliverers:    map[string]outbox.Deliverer{"charge": d},
		Backoff:       func(int) time.Duration { return 10 * time.Millisecond },
		PollInterval:  50 * time.Millisecond,
		Logger:        logs.logger(),
		MeterProvider: meters,
	}
}

// eventually polls cond until it holds or timeout passes.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, err := cond()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitState waits until the message reaches state and returns it.
func waitState[TTx any](t *testing.T, o *outbox.Outbox[TTx], key, kind string, state outbox.State, timeout time.Duration) outbox.Delivery {
	t.Helper()
	var d outbox.Delivery
	var lastErr error
	defer func() {
		if t.Failed() {
			t.Logf("message %s/%s when the wait ended: %+v (%v)", key, kind, d, lastErr)
		}
	}()
	eventually(t, timeout, fmt.Sprintf("message %s/%s %s", key, kind, state), func() (bool, error) {
		var err error
		d, err = o.Delivery(context.Background(), key, kind)
		if errors.Is(err, outbox.ErrNotFound) {
			lastErr = err
			return false, nil
		}
		return d.State == state, err
	})
	return d
}

// downstream is a payment provider that honours Idempotency-Key: the same
// key gets the same object back and makes no second effect. It can fail
// calls before doing anything, as a provider's 5xx does.
type downstream struct {
	srv *httptest.Server

	mu       sync.Mutex
	objects  map[string]string // key -> object id
	effects  map[string]int    // key -> objects created (the side effects)
	calls    map[string]int    // key -> requests received
	fences   map[string]int64  // key -> last Idempotency-Fence received
	failures int               // requests still to fail with 503
	poison   map[string]bool   // keys refused with 422, always
	onEffect func(key, id string)
}

func newDownstream(t *testing.T) *downstream {
	d := &downstream{
		objects: map[string]string{}, effects: map[string]int{}, calls: map[string]int{},
		fences: map[string]int64{}, poison: map[string]bool{},
	}
	d.srv = httptest.NewServer(http.HandlerFunc(d.serve))
	t.Cleanup(d.srv.Close)
	return d
}

func (d *downstream) serve(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	if r.Method != http.MethodPost || key == "" {
		http.Error(w, "POST with an Idempotency-Key", http.StatusBadRequest)
		return
	}
	fence, _ := strconv.ParseInt(r.Header.Get("Idempotency-Fence"), 10, 64)
	d.mu.Lock()
	d.calls[key]++
	d.fences[key] = fence
	if d.poison[key] {
		d.mu.Unlock()
		http.Error(w, "card declined", http.StatusUnprocessableEntity)
		return
	}
	if d.failures > 0 {
		d.failures--
		d.mu.Unlock()
		http.Error(w, "try again", http.StatusServiceUnavailable)
		return
	}
	id, replay := d.objects[key]
	if !replay {
		id = fmt.Sprintf("ch_%d", len(d.objects)+1)
		d.objects[key] = id
		d.effects[key]++
	}
	onEffect := d.onEffect
	d.mu.Unlock()
	if !replay && onEffect != nil {
		onEffect(key, id)
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]string{"id": id}) //nolint:errcheck // the client sees a short body
}

func (d *downstream) stats(key string) (calls, effects int, fence int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.calls[key], d.effects[key], d.fences[key]
}

func (d *downstream) failNext(n int) {
	d.mu.Lock()
	d.failures = n
	d.mu.Unlock()
}

func (d *downstream) setPoison(key string, on bool) {
	d.mu.Lock()
	d.poison[key] = on
	d.mu.Unlock()
}

// httpDeliverer posts the payload to a provider with the message's key and
// fence, as a real Deliverer would.
type httpDeliverer struct{ url string }

// client has no keep-alive, so no connection goroutine outlives a test.
var client = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}

func (h httpDeliverer) Deliver(ctx context.Context, msg outbox.Message) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.url, bytes.NewReader(msg.Payload))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", msg.Key)
	req.Header.Set("Idempotency-Fence", strconv.FormatInt(msg.Fence, 10))
	resp, err := client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var body struct {
		ID string `json:"id"`
	}
	if resp.StatusCode/100 != 2 {
		return "", fmt.Errorf("provider: %s", resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return "", fmt.Errorf("provider: %w", err)
	}
	return body.ID, nil
}

// logBuffer collects JSON log lines for assertions.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// newLogs returns a log buffer whose lines are printed if t fails: what
// the workers logged tells why a message did not reach the state a test
// waited for.
func newLogs(t *testing.T) *logBuffer {
	l := &logBuffer{}
	t.Cleanup(func() {
		if t.Failed() {
			l.mu.Lock()
			defer l.mu.Unlock()
			t.Logf("outbox logs:\n%s", l.buf.String())
		}
	})
	return l
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) logger() *slog.Logger {
	return slog.New(slog.NewJSONHandler(l, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// count returns how many log lines have msg.
func (l *logBuffer) count(msg string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, line := range strings.Split(l.buf.String(), "\n") {
		var rec struct {
			Msg string `json:"msg"`
		}
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == msg {
			n++
		}
	}
	return n
}

// meterRecorder is a MeterProvider whose Int64Counters sum what they are
// given per name and "kind" attribute; every other instrument is a no-op.
type meterRecorder struct {
	noop.MeterProvider
	mu     sync.Mutex
	counts map[string]int64
}

func newMeterRecorder() *meterRecorder { return &meterRecorder{counts: map[string]int64{}} }

func (r *meterRecorder) Meter(string, ...metric.MeterOption) metric.Meter { return recMeter{r: r} }

// get returns the sum of counter name for kind.
func (r *meterRecorder) get(name, kind string) int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.counts[name+"/"+kind]
}

type recMeter struct {
	noop.Meter
	r *meterRecorder
}

func (m recMeter) Int64Counter(name string, _ ...metric.Int64CounterOption) (metric.Int64Counter, error) {
	return recCounter{r: m.r, name: name}, nil
}

type recCounter struct {
	noop.Int64Counter
	r    *meterRecorder
	name string
}

func (c recCounter) Add(_ context.Context, incr int64, opts ...metric.AddOption) {
	attrs := metric.NewAddConfig(opts).Attributes()
	kind, _ := attrs.Value("kind")
	c.r.mu.Lock()
	c.r.counts[c.name+"/"+kind.AsString()] += incr
	c.r.mu.Unlock()
}
