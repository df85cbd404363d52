package outbox_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem/outbox"
)

// deadRecorder is an OnDead that records its calls, and fails the first
// calls for a key as many times as told, as an application whose database
// is briefly down does.
type deadRecorder struct {
	mu    sync.Mutex
	calls map[string][]deadCall // by Message.Key
	fail  map[string]int        // calls still to fail, by Message.Key
}

type deadCall struct {
	msg     outbox.Message
	lastErr string
	at      time.Time
}

// refusedOnce is the configuration of an outbox whose every message dies
// at its first attempt, refused, with OnDead recorded by rec and the
// counters by meters.
func refusedOnce(t *testing.T) (cfg outbox.Config, rec *deadRecorder, meters *meterRecorder) {
	meters, rec = newMeterRecorder(), newDeadRecorder()
	cfg = testConfig(refuse, newLogs(t), meters)
	cfg.Deliverers["refuse"] = refuse
	cfg.MaxAttempts = 1
	cfg.OnDead = rec.onDead
	return cfg, rec, meters
}

func newDeadRecorder() *deadRecorder {
	return &deadRecorder{calls: map[string][]deadCall{}, fail: map[string]int{}}
}

func (r *deadRecorder) onDead(_ context.Context, msg outbox.Message, lastErr error) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := deadCall{msg: msg, at: time.Now()}
	if lastErr != nil {
		c.lastErr = lastErr.Error()
	}
	r.calls[msg.Key] = append(r.calls[msg.Key], c)
	if r.fail[msg.Key] > 0 {
		r.fail[msg.Key]--
		return errors.New("application database unavailable")
	}
	return nil
}

func (r *deadRecorder) failFirst(key string, n int) {
	r.mu.Lock()
	r.fail[key] = n
	r.mu.Unlock()
}

func (r *deadRecorder) get(key string) []deadCall {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]deadCall(nil), r.calls[key]...)
}

// wait waits until OnDead was called at least n times for key and returns
// the calls.
func (r *deadRecorder) wait(t *testing.T, key string, n int, timeout time.Duration) []deadCall {
	t.Helper()
	eventually(t, timeout, fmt.Sprintf("%d OnDead calls for %s", n, key), func() (bool, error) {
		return len(r.get(key)) >= n, nil
	})
	return r.get(key)
}

// refuse is the Deliverer of kind "refuse": every attempt fails.
var refuse = outbox.DelivererFunc(func(context.Context, outbox.Message) (string, error) {
	return "", errors.New("refused")
})

// noMoreCalls checks that OnDead is not called again for key once it has
// been called want times and returned nil. It enqueues (through o, which
// must know kind "refuse") a message that dies at once and waits for its
// OnDead call: that call comes from a pass whose list of dead jobs was
// read after the message was enqueued, so after the call for key that
// returned nil and its record, a pass that then found key settled.
func noMoreCalls[TTx any](t *testing.T, db database[TTx], o *outbox.Outbox[TTx], rec *deadRecorder, key string, want int) {
	t.Helper()
	marker := outbox.Message{Kind: "refuse", Key: key + "-marker", Fence: 1, Payload: json.RawMessage(`{}`)}
	enqueue(t, db, o, marker)
	rec.wait(t, marker.Key, 1, time.Minute)
	if got := len(rec.get(key)); got != want {
		t.Fatalf("OnDead called %d times for %s, want %d", got, key, want)
	}
}

// sameMessage reports whether got is want, payloads compared as JSON
// (PostgreSQL's jsonb respaces them).
func sameMessage(got, want outbox.Message) bool {
	var g, w any
	if json.Unmarshal(got.Payload, &g) != nil || json.Unmarshal(want.Payload, &w) != nil {
		return false
	}
	return got.Kind == want.Kind && got.Key == want.Key && got.Fence == want.Fence && reflect.DeepEqual(g, w)
}

// A message whose last allowed attempt fails in the worker is passed to
// OnDead once, with that attempt's error and the message as enqueued.
func TestOnDeadAfterTheLastAttemptFailed(t *testing.T) {
	forEachDB(t, testOnDeadAfterTheLastAttemptFailed[pgx.Tx], testOnDeadAfterTheLastAttemptFailed[*sql.Tx])
}

func testOnDeadAfterTheLastAttemptFailed[TTx any](t *testing.T, db database[TTx]) {
	logs, meters := newLogs(t), newMeterRecorder()
	var (
		mu       sync.Mutex
		attempts int
	)
	cfg := testConfig(outbox.DelivererFunc(func(context.Context, outbox.Message) (string, error) {
		mu.Lock()
		defer mu.Unlock()
		attempts++
		return "", fmt.Errorf("provider refused attempt %d", attempts)
	}), logs, meters)
	cfg.Deliverers["refuse"] = refuse
	cfg.MaxAttempts = 2
	rec := newDeadRecorder()
	cfg.OnDead = rec.onDead
	o := db.newOutbox(t, cfg)
	start(t, o)

	msg := outbox.Message{Kind: "charge", Key: outbox.KeyFor("t", "last-failed", "charge"), Fence: 6,
		Payload: json.RawMessage(`{"amount":300,"currency":"eur"}`)}
	enqueue(t, db, o, msg)
	calls := rec.wait(t, msg.Key, 1, time.Minute)
	if !sameMessage(calls[0].msg, msg) {
		t.Errorf("OnDead got message %+v (payload %s), want %+v (payload %s)", calls[0].msg, calls[0].msg.Payload, msg, msg.Payload)
	}
	if calls[0].lastErr != "provider refused attempt 2" {
		t.Errorf("OnDead got lastErr %q, want the last attempt's, %q", calls[0].lastErr, "provider refused attempt 2")
	}
	noMoreCalls(t, db, o, rec, msg.Key, 1)
	if got := meters.get(outbox.MetricDead, "charge"); got != 1 {
		t.Errorf("%s = %d, want 1", outbox.MetricDead, got)
	}
	if got := logs.count("outbox: dead-lettered after its last attempt"); got != 2 { // the message and the marker
		t.Errorf("%d dead-letter events logged, want 2", got)
	}
}

// OnDead fails (the application's database is down) the first three times
// it is called for a message: later passes call it again until it returns
// nil, then never again; the message is counted dead once.
func TestOnDeadIsRetriedUntilItSucceeds(t *testing.T) {
	forEachDB(t, testOnDeadIsRetriedUntilItSucceeds[pgx.Tx], testOnDeadIsRetriedUntilItSucceeds[*sql.Tx])
}

func testOnDeadIsRetriedUntilItSucceeds[TTx any](t *testing.T, db database[TTx]) {
	cfg, rec, meters := refusedOnce(t)
	o := db.newOutbox(t, cfg)

	msg := outbox.Message{Kind: "charge", Key: outbox.KeyFor("t", "on-dead-fails", "charge"), Fence: 2, Payload: json.RawMessage(`{}`)}
	rec.failFirst(msg.Key, 3)
	enqueue(t, db, o, msg)
	start(t, o)
	calls := rec.wait(t, msg.Key, 4, time.Minute)
	for i, c := range calls {
		if !sameMessage(c.msg, msg) || c.lastErr != "refused" {
			t.Errorf("call %d: message %+v, lastErr %q; want %+v and the attempt's error", i+1, c.msg, c.lastErr, msg)
		}
		// After the n-th failed call the message waits DeadLetterInterval
		// (the poll interval here) doubled n-1 times.
		if i == 0 {
			continue
		}
		if wait := cfg.PollInterval << (i - 1); c.at.Sub(calls[i-1].at) < wait {
			t.Errorf("call %d came %v after the failed call before it, want at least %v", i+1, c.at.Sub(calls[i-1].at), wait)
		}
	}
	noMoreCalls(t, db, o, rec, msg.Key, 4)
	if got := meters.get(outbox.MetricDead, "charge"); got != 1 {
		t.Errorf("%s = %d, want 1 however many times OnDead ran", outbox.MetricDead, got)
	}
}

// The process delivering a message crashes (SIGKILL) during its last
// allowed attempt. No worker returns from it: River's rescuer, in another
// process, discards the job once RescueAfter has passed, and that
// process's dead-letter pass calls OnDead for it, once.
func TestOnDeadAfterTheLastAttemptCrashed(t *testing.T) {
	forEachDB(t, testOnDeadAfterTheLastAttemptCrashed[pgx.Tx], testOnDeadAfterTheLastAttemptCrashed[*sql.Tx])
}

func testOnDeadAfterTheLastAttemptCrashed[TTx any](t *testing.T, db database[TTx]) {
	down := newDownstream(t)
	logs, meters := newLogs(t), newMeterRecorder()
	cfg := testConfig(httpDeliverer{down.srv.URL}, logs, meters)
	cfg.Deliverers["refuse"] = refuse
	cfg.MaxAttempts = 1
	cfg.RescueAfter = time.Second
	rec := newDeadRecorder()
	cfg.OnDead = rec.onDead

	web := db.newOutbox(t, cfg)
	msg := outbox.Message{Kind: "charge", Key: outbox.KeyFor("t", "last-crashed", "charge"), Fence: 9,
		Payload: json.RawMessage(`{"amount":100}`)}
	enqueue(t, db, web, msg)
	// The worker process starts the only allowed attempt, calls the
	// provider and is killed before it returns.
	_, kill := workerProcess(t, db, down.srv.URL)
	kill()

	// Another process: once it is River's leader (the dead one may have
	// held leadership until it expires), its rescuer discards the job.
	other := db.newOutbox(t, cfg)
	began := time.Now()
	start(t, other)
	calls := rec.wait(t, msg.Key, 1, 2*time.Minute)
	t.Logf("%s: OnDead called %s after the crash", db.name, time.Since(began).Round(100*time.Millisecond))
	if !sameMessage(calls[0].msg, msg) || !strings.Contains(strings.ToLower(calls[0].lastErr), "rescue") {
		t.Errorf("OnDead got message %+v, lastErr %q; want %+v and the rescuer's error", calls[0].msg, calls[0].lastErr, msg)
	}
	noMoreCalls(t, db, other, rec, msg.Key, 1)
	if got := meters.get(outbox.MetricDead, "charge"); got != 1 {
		t.Errorf("%s = %d, want 1", outbox.MetricDead, got)
	}
	if calls, effects, _ := down.stats(msg.Key); calls != 1 || effects != 1 {
		t.Errorf("downstream: %d calls, %d effects; want the crashed attempt's only", calls, effects)
	}
}

// Two processes run the dead-letter pass on the same tables: each dead
// message gets one OnDead call (a claim keeps the other pass off it) and
// is counted dead once; DeadLetters shows each settled.
func TestDeadLetterPassesOfTwoProcesses(t *testing.T) {
	forEachDB(t, testDeadLetterPassesOfTwoProcesses[pgx.Tx], testDeadLetterPassesOfTwoProcesses[*sql.Tx])
}

func testDeadLetterPassesOfTwoProcesses[TTx any](t *testing.T, db database[TTx]) {
	ctx := context.Background()
	cfg, rec, meters := refusedOnce(t)
	cfg.DeadLetterInterval = 10 * time.Millisecond
	a := db.newOutbox(t, cfg)
	b := db.newOutboxUnmigrated(t, cfg)
	start(t, a)
	start(t, b)

	var keys []string
	for i := range 5 {
		msg := outbox.Message{Kind: "charge", Key: fmt.Sprintf("k-two-%d", i), Fence: 1, Payload: json.RawMessage(`{}`)}
		keys = append(keys, msg.Key)
		enqueue(t, db, a, msg)
	}
	for _, k := range keys {
		rec.wait(t, k, 1, time.Minute)
	}
	noMoreCalls(t, db, a, rec, keys[0], 1)
	for _, k := range keys {
		if n := len(rec.get(k)); n != 1 {
			t.Errorf("OnDead called %d times for %s, want 1", n, k)
		}
	}
	if got := meters.get(outbox.MetricDead, "charge"); got != int64(len(keys)) {
		t.Errorf("%s = %d, want %d", outbox.MetricDead, got, len(keys))
	}
	var letters []outbox.Delivery
	eventually(t, time.Minute, "dead letters settled", func() (bool, error) {
		var err error
		letters, err = a.DeadLetters(ctx, 100)
		settled := 0
		for _, l := range letters {
			if l.Kind == "charge" && !l.SettledAt.IsZero() {
				settled++
			}
		}
		return settled == len(keys), err
	})
}

// A message enqueued again after OnDead settled its death is a new
// delivery: if it dies again, OnDead is called for it again.
func TestOnDeadAgainAfterARedeliveryDies(t *testing.T) {
	t.Parallel()
	db := newSQLiteDB(t)
	cfg, rec, _ := refusedOnce(t)
	o := db.newOutbox(t, cfg)
	start(t, o)
	msg := outbox.Message{Kind: "charge", Key: "k-twice", Fence: 1, Payload: json.RawMessage(`{}`)}
	enqueue(t, db, o, msg)
	rec.wait(t, msg.Key, 1, time.Minute)
	noMoreCalls(t, db, o, rec, msg.Key, 1)
	enqueue(t, db, o, msg)
	calls := rec.wait(t, msg.Key, 2, time.Minute)
	if c := calls[1]; !sameMessage(c.msg, msg) || c.lastErr != "refused" {
		t.Errorf("second OnDead call: message %+v, lastErr %q", c.msg, c.lastErr)
	}
}

// An operator redelivers a dead message once what killed it is mended: a
// new job with the full attempts carries the same key, fence and payload,
// and the message is delivered. Redeliver refuses a message that is not
// dead, and one the outbox does not know.
func TestRedeliver(t *testing.T) {
	forEachDB(t, testRedeliver[pgx.Tx], testRedeliver[*sql.Tx])
}

func testRedeliver[TTx any](t *testing.T, db database[TTx]) {
	ctx := context.Background()
	var mended atomic.Bool
	var got atomic.Value
	cfg, rec, _ := refusedOnce(t)
	cfg.Deliverers["charge"] = outbox.DelivererFunc(func(_ context.Context, m outbox.Message) (string, error) {
		if !mended.Load() {
			return "", errors.New("provider down")
		}
		got.Store(m)
		return "ch_" + m.Key, nil
	})
	o := db.newOutbox(t, cfg)
	start(t, o)
	msg := outbox.Message{Kind: "charge", Key: "k-redeliver", Fence: 7, Payload: json.RawMessage(`{"amount":5}`)}
	enqueue(t, db, o, msg)
	rec.wait(t, msg.Key, 1, time.Minute)
	dead := waitState(t, o, msg.Key, "charge", outbox.Dead, time.Minute)

	// An outbox of another queue on the same database neither lists nor
	// moves it.
	otherCfg := cfg
	otherCfg.Queue, otherCfg.OnDead = "other_outbox", nil
	other := db.newOutbox(t, otherCfg)
	if letters, err := other.DeadLetters(ctx, 10); err != nil || len(letters) != 0 {
		t.Errorf("DeadLetters of another queue: %+v %v; want none", letters, err)
	}
	if _, err := other.Redeliver(ctx, msg.Key, "charge"); err == nil || !strings.Contains(err.Error(), `died in queue "idem_outbox"`) {
		t.Errorf("Redeliver from another queue: %v; want a refusal naming the queue", err)
	}

	mended.Store(true)
	d, err := o.Redeliver(ctx, msg.Key, "charge")
	if err != nil || d.State != outbox.Pending || d.JobID == dead.JobID {
		t.Fatalf("Redeliver: %+v %v; want pending on a new job (the dead one was %d)", d, err, dead.JobID)
	}
	d = waitState(t, o, msg.Key, "charge", outbox.Delivered, time.Minute)
	if d.DownstreamID != "ch_k-redeliver" || d.Fence != msg.Fence {
		t.Errorf("after the redelivery: %+v", d)
	}
	if m, _ := got.Load().(outbox.Message); !sameMessage(m, msg) {
		t.Errorf("the deliverer got %+v, want %+v", m, msg)
	}
	if _, err := o.Redeliver(ctx, msg.Key, "charge"); !errors.Is(err, outbox.ErrNotDead) {
		t.Errorf("Redeliver of a delivered message: %v, want ErrNotDead", err)
	}
	if _, err := o.Redeliver(ctx, "k-unknown", "charge"); !errors.Is(err, outbox.ErrNotFound) {
		t.Errorf("Redeliver of an unknown message: %v, want ErrNotFound", err)
	}
}

// The steps docs/postgres-production.md gives for a large idem_outbox
// (the columns, then the index built concurrently, before upgrading) leave
// migration 002 nothing to do: it runs after them without an error and
// without a second index.
func TestDeadLetterMigrationAfterTheDocumentedSteps(t *testing.T) {
	t.Parallel()
	url := testURL(t)
	ctx := context.Background()
	pool, err := openPool(ctx, url, newSchema(t, url))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	doc, err := os.ReadFile("../docs/postgres-production.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, _ := strings.Cut(string(doc), "### The outbox's dead letters")
	_, steps, _ := strings.Cut(section, "```sql\n")
	steps, _, found := strings.Cut(steps, "```")
	if !found {
		t.Fatal("no SQL block under \"The outbox's dead letters\" in docs/postgres-production.md")
	}
	first, err := outbox.MigrationSQL("migrations/postgres/001_outbox.sql")
	if err != nil {
		t.Fatal(err)
	}
	second, err := outbox.MigrationSQL("migrations/postgres/002_dead_letters.sql")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, first); err != nil {
		t.Fatal(err)
	}
	// The documented steps, one statement at a time (CREATE INDEX
	// CONCURRENTLY runs outside a transaction block).
	for _, stmt := range strings.Split(steps, ";") {
		if strings.TrimSpace(stmt) == "" {
			continue
		}
		if _, err := pool.Exec(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", strings.TrimSpace(stmt), err)
		}
	}
	if _, err := pool.Exec(ctx, second); err != nil {
		t.Fatalf("migration 002 after the documented steps: %v", err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_indexes WHERE schemaname = current_schema()
AND tablename = 'idem_outbox' AND indexdef LIKE '%dead_settled_at IS NULL%'`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d indexes for the dead-letter pass, want 1 (%v)", n, err)
	}
}

// A deliverer's error whose text holds a NUL (a provider's message passed
// through) is recorded by River all the same: the message dies after its
// last attempt, and OnDead gets the text with the NUL replaced. Before,
// River could not store the error on PostgreSQL, and the message was never
// retried nor dead-lettered.
func TestDeliveryErrorWithNUL(t *testing.T) {
	forEachDB(t, testDeliveryErrorWithNUL[pgx.Tx], testDeliveryErrorWithNUL[*sql.Tx])
}

func testDeliveryErrorWithNUL[TTx any](t *testing.T, db database[TTx]) {
	cfg, rec, _ := refusedOnce(t)
	cfg.Deliverers["charge"] = outbox.DelivererFunc(func(context.Context, outbox.Message) (string, error) {
		return "", errors.New("provider: 503: down\x00for maintenance")
	})
	o := db.newOutbox(t, cfg)
	start(t, o)
	msg := outbox.Message{Kind: "charge", Key: "k-nul", Fence: 1, Payload: json.RawMessage(`{}`)}
	enqueue(t, db, o, msg)
	calls := rec.wait(t, msg.Key, 1, time.Minute)
	if want := "provider: 503: down\uFFFDfor maintenance"; calls[0].lastErr != want {
		t.Errorf("OnDead's lastErr %q, want %q", calls[0].lastErr, want)
	}
}
