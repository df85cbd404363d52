package outbox_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/store"
)

var errRollback = errors.New("rolled back on purpose")

// enqueue commits msg alone in a transaction of db's store.
func enqueue[TTx any](t *testing.T, db database[TTx], o *outbox.Outbox[TTx], msg outbox.Message) {
	t.Helper()
	ctx := context.Background()
	if err := db.store.InTx(ctx, func(tx TTx) error { return o.EnqueueTx(ctx, tx, msg) }); err != nil {
		t.Fatal(err)
	}
}

// A handler behind idem's middleware writes its payment, completes the key
// and enqueues the charge in one transaction. The first attempt rolls
// back: nothing exists to deliver. The retry commits: the charge is
// delivered once, with the downstream key and the execution's fence, and
// its id recorded; a third request is a replay that enqueues nothing.
func TestEnqueueCommitsWithTheBusinessWrite(t *testing.T) {
	forEachDB(t, testEnqueueCommitsWithTheBusinessWrite[pgx.Tx], testEnqueueCommitsWithTheBusinessWrite[*sql.Tx])
}

func testEnqueueCommitsWithTheBusinessWrite[TTx any](t *testing.T, db database[TTx]) {
	ctx := context.Background()
	down := newDownstream(t)
	logs, meters := newLogs(t), newMeterRecorder()
	ob := db.newOutbox(t, testConfig(httpDeliverer{down.srv.URL}, logs, meters))
	start(t, ob)
	eng, err := idem.New(db.store, idem.Config{Logger: logs.logger()})
	if err != nil {
		t.Fatal(err)
	}

	var (
		rollback    = true
		runs        int
		downKey     string
		commitFence int64
	)
	h := eng.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs++
		x := idem.FromContext(r.Context())
		body := []byte(`{"status":"accepted"}`)
		resp := store.Response{Status: http.StatusAccepted, Header: http.Header{"Content-Type": {"application/json"}}, Body: body}
		msg := outbox.Message{
			Kind:    "charge",
			Key:     outbox.KeyFor(x.Scope(), x.Key(), "charge"),
			Fence:   x.Fence(),
			Payload: json.RawMessage(`{"amount":100,"currency":"eur"}`),
		}
		downKey = msg.Key
		err := db.store.InTx(r.Context(), func(tx TTx) error {
			if err := db.insertPayment(r.Context(), tx, x.Key(), 100); err != nil {
				return err
			}
			if err := db.store.CompleteTx(r.Context(), tx, x.CompleteParams(resp)); err != nil {
				return err
			}
			if err := ob.EnqueueTx(r.Context(), tx, msg); err != nil {
				return err
			}
			if rollback {
				rollback = false
				return errRollback
			}
			return nil
		})
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		x.Committed()
		commitFence = x.Fence()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusAccepted)
		w.Write(body) //nolint:errcheck // a recorder
	}))
	send := func() *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, "/charges", strings.NewReader(`{"amount":100}`))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Idempotency-Key", "order-1")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}

	if w := send(); w.Code != http.StatusInternalServerError {
		t.Fatalf("first attempt: status %d, want 500: %s", w.Code, w.Body)
	}
	if n := db.payments(t, "order-1"); n != 0 {
		t.Fatalf("rolled back: %d payments", n)
	}
	if _, err := ob.Delivery(ctx, downKey, "charge"); !errors.Is(err, outbox.ErrNotFound) {
		t.Fatalf("rolled back: Delivery = %v, want ErrNotFound", err)
	}
	if n, err := ob.JobCount(ctx); err != nil || n != 0 {
		t.Fatalf("rolled back: %d River jobs (err %v), want none", n, err)
	}

	if w := send(); w.Code != http.StatusAccepted {
		t.Fatalf("retry: status %d, want 202: %s", w.Code, w.Body)
	}
	d := waitState(t, ob, downKey, "charge", outbox.Delivered, 15*time.Second)
	if w := send(); w.Code != http.StatusAccepted || w.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay: status %d, replayed %q", w.Code, w.Header().Get("Idempotent-Replayed"))
	}
	if runs != 2 || db.payments(t, "order-1") != 1 {
		t.Fatalf("handler ran %d times, %d payments; want 2 runs, 1 payment", runs, db.payments(t, "order-1"))
	}
	if n, err := ob.JobCount(ctx); err != nil || n != 1 {
		t.Fatalf("%d River jobs (err %v), want 1", n, err)
	}

	stop(t, ob) // no delivery can happen after this
	calls, effects, fence := down.stats(downKey)
	if calls != 1 || effects != 1 {
		t.Errorf("downstream: %d calls, %d effects; want exactly one delivery", calls, effects)
	}
	if fence != commitFence || d.Fence != commitFence {
		t.Errorf("fence: downstream got %d, recorded %d; want the committing execution's %d", fence, d.Fence, commitFence)
	}
	if d.DownstreamID != down.objects[downKey] || d.Attempts != 1 || d.DeliveredAt.IsZero() || d.EnqueuedAt.IsZero() {
		t.Errorf("delivery = %+v; want downstream id %q after 1 attempt, with times", d, down.objects[downKey])
	}
	if got := meters.get(outbox.MetricDelivered, "charge"); got != 1 {
		t.Errorf("%s = %d, want 1", outbox.MetricDelivered, got)
	}
	if got := logs.count("outbox: delivered"); got != 1 {
		t.Errorf("%d delivered events logged, want 1", got)
	}
}

// The provider fails the first three calls: the message is retried with the
// configured backoff and delivered once, on the fourth attempt.
func TestRetriesWithBackoff(t *testing.T) {
	forEachDB(t, testRetriesWithBackoff[pgx.Tx], testRetriesWithBackoff[*sql.Tx])
}

func testRetriesWithBackoff[TTx any](t *testing.T, db database[TTx]) {
	down := newDownstream(t)
	down.failNext(3)
	logs, meters := newLogs(t), newMeterRecorder()
	cfg := testConfig(httpDeliverer{down.srv.URL}, logs, meters)
	var (
		mu      sync.Mutex
		backoff []int
	)
	cfg.Backoff = func(attempt int) time.Duration {
		mu.Lock()
		defer mu.Unlock()
		backoff = append(backoff, attempt)
		return time.Duration(attempt) * 10 * time.Millisecond
	}
	ob := db.newOutbox(t, cfg)
	start(t, ob)

	msg := outbox.Message{Kind: "charge", Key: outbox.KeyFor("tenant-1", "k-retry", "charge"), Fence: 7, Payload: json.RawMessage(`{"amount":5}`)}
	enqueue(t, db, ob, msg)
	d := waitState(t, ob, msg.Key, "charge", outbox.Delivered, 20*time.Second)
	stop(t, ob)

	calls, effects, fence := down.stats(msg.Key)
	if calls != 4 || effects != 1 || fence != 7 {
		t.Errorf("downstream: %d calls, %d effects, fence %d; want 4, 1, 7", calls, effects, fence)
	}
	if d.Attempts != 4 || d.DownstreamID == "" {
		t.Errorf("delivery = %+v; want delivered on attempt 4", d)
	}
	mu.Lock()
	if !slices.Equal(backoff, []int{1, 2, 3}) {
		t.Errorf("backoff asked for attempts %v, want [1 2 3]", backoff)
	}
	mu.Unlock()
	for name, want := range map[string]int64{outbox.MetricDelivered: 1, outbox.MetricRetried: 3, outbox.MetricDead: 0} {
		if got := meters.get(name, "charge"); got != want {
			t.Errorf("%s = %d, want %d", name, got, want)
		}
	}
	if got := logs.count("outbox: delivery failed; will retry"); got != 3 {
		t.Errorf("%d retry events logged, want 3", got)
	}
}

// A message the provider always refuses, and one whose Deliverer panics,
// are dead-lettered after MaxAttempts and listed by DeadLetters. Enqueued
// again once the provider accepts it, the first is delivered and leaves
// the list.
func TestPoisonMessagesAreDeadLettered(t *testing.T) {
	forEachDB(t, testPoisonMessagesAreDeadLettered[pgx.Tx], testPoisonMessagesAreDeadLettered[*sql.Tx])
}

func testPoisonMessagesAreDeadLettered[TTx any](t *testing.T, db database[TTx]) {
	ctx := context.Background()
	down := newDownstream(t)
	logs, meters := newLogs(t), newMeterRecorder()
	cfg := testConfig(httpDeliverer{down.srv.URL}, logs, meters)
	cfg.MaxAttempts = 3
	cfg.Deliverers["explode"] = outbox.DelivererFunc(func(context.Context, outbox.Message) (string, error) {
		panic("boom")
	})
	var deadMu sync.Mutex
	deadKeys := map[string]bool{}
	cfg.OnDead = func(_ context.Context, m outbox.Message, lastErr error) error {
		deadMu.Lock()
		defer deadMu.Unlock()
		deadKeys[m.Key] = lastErr != nil
		return nil
	}
	ob := db.newOutbox(t, cfg)
	start(t, ob)

	poison := outbox.Message{Kind: "charge", Key: outbox.KeyFor("t", "declined", "charge"), Fence: 1, Payload: json.RawMessage(`{}`)}
	panics := outbox.Message{Kind: "explode", Key: outbox.KeyFor("t", "declined", "explode"), Fence: 1}
	good := outbox.Message{Kind: "charge", Key: outbox.KeyFor("t", "fine", "charge"), Fence: 1, Payload: json.RawMessage(`{}`)}
	down.setPoison(poison.Key, true)
	for _, m := range []outbox.Message{poison, panics, good} {
		enqueue(t, db, ob, m)
	}
	dead := waitState(t, ob, poison.Key, "charge", outbox.Dead, 20*time.Second)
	waitState(t, ob, panics.Key, "explode", outbox.Dead, 20*time.Second)
	waitState(t, ob, good.Key, "charge", outbox.Delivered, 20*time.Second)
	if dead.Attempts != 3 || !strings.Contains(dead.LastError, "422") {
		t.Errorf("dead delivery = %+v; want 3 attempts and the provider's 422", dead)
	}
	// The dead-letter pass calls OnDead, then records each settled.
	var letters []outbox.Delivery
	eventually(t, 20*time.Second, "both dead letters settled", func() (bool, error) {
		var err error
		letters, err = ob.DeadLetters(ctx, 10)
		settled := 0
		for _, l := range letters {
			if !l.SettledAt.IsZero() {
				settled++
			}
		}
		return settled == 2, err
	})
	deadMu.Lock()
	if len(deadKeys) != 2 || !deadKeys[poison.Key] || !deadKeys[panics.Key] {
		t.Errorf("OnDead saw %v; want the refused and the panicking message, each with its error", deadKeys)
	}
	deadMu.Unlock()
	byKind := map[string]outbox.Delivery{}
	for _, l := range letters {
		byKind[l.Kind] = l
	}
	if len(letters) != 2 || byKind["charge"].Key != poison.Key || byKind["explode"].Key != panics.Key {
		t.Fatalf("DeadLetters = %+v; want the refused and the panicking message", letters)
	}
	if l := byKind["explode"]; l.State != outbox.Dead || l.Attempts != 3 || !strings.Contains(l.LastError, "panicked: boom") {
		t.Errorf("panicking dead letter = %+v", l)
	}
	if one, err := ob.DeadLetters(ctx, 1); err != nil || len(one) != 1 {
		t.Errorf("DeadLetters(1) = %d letters, %v", len(one), err)
	}
	for name, want := range map[string]int64{outbox.MetricDead: 1, outbox.MetricRetried: 2, outbox.MetricDelivered: 1} {
		if got := meters.get(name, "charge"); got != want {
			t.Errorf("%s{charge} = %d, want %d", name, got, want)
		}
	}
	if got := meters.get(outbox.MetricDead, "explode"); got != 1 {
		t.Errorf("%s{explode} = %d, want 1", outbox.MetricDead, got)
	}
	if got := logs.count("outbox: dead-lettered after its last attempt"); got != 2 {
		t.Errorf("%d dead-letter events logged, want 2", got)
	}

	// An operator fixed the cause: enqueuing the message again delivers it.
	down.setPoison(poison.Key, false)
	enqueue(t, db, ob, poison)
	waitState(t, ob, poison.Key, "charge", outbox.Delivered, 20*time.Second)
	letters, err := ob.DeadLetters(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(letters) != 1 || letters[0].Key != panics.Key || letters[0].SettledAt.IsZero() {
		t.Errorf("after redelivery, DeadLetters = %+v; want only the panicking message, settled", letters)
	}
	if d, err := ob.Delivery(ctx, panics.Key, "explode"); err != nil || d.State != outbox.Dead || d.SettledAt.IsZero() {
		t.Errorf("Delivery of the panicking message = %+v, %v; want dead and settled", d, err)
	}
	if _, effects, _ := down.stats(poison.Key); effects != 1 {
		t.Errorf("%d effects, want 1", effects)
	}
}

// A job that runs again after its delivery was recorded (River lost the
// completion) finds the downstream id and does not call the provider; a
// second EnqueueTx of the same message is a no-op.
func TestRecordedDeliveryIsNotRepeated(t *testing.T) {
	forEachDB(t, testRecordedDeliveryIsNotRepeated[pgx.Tx], testRecordedDeliveryIsNotRepeated[*sql.Tx])
}

func testRecordedDeliveryIsNotRepeated[TTx any](t *testing.T, db database[TTx]) {
	ctx := context.Background()
	down := newDownstream(t)
	logs, meters := newLogs(t), newMeterRecorder()
	ob := db.newOutbox(t, testConfig(httpDeliverer{down.srv.URL}, logs, meters))
	start(t, ob)

	msg := outbox.Message{Kind: "charge", Key: outbox.KeyFor("t", "once", "charge"), Fence: 3, Payload: json.RawMessage(`{}`)}
	enqueue(t, db, ob, msg)
	first := waitState(t, ob, msg.Key, "charge", outbox.Delivered, 15*time.Second)
	enqueue(t, db, ob, msg)
	if n, err := ob.JobCount(ctx); err != nil || n != 1 {
		t.Fatalf("after a second EnqueueTx: %d jobs (err %v), want 1", n, err)
	}

	// River completes the job after the worker returns; only a finished
	// job can be retried.
	eventually(t, 15*time.Second, "job completed", func() (bool, error) {
		state, _, err := ob.Job(ctx, first.JobID)
		return state == "completed", err
	})
	if err := ob.RetryJob(ctx, first.JobID); err != nil {
		t.Fatal(err)
	}
	eventually(t, 15*time.Second, "job worked again", func() (bool, error) {
		state, attempt, err := ob.Job(ctx, first.JobID)
		return state == "completed" && attempt == 2, err
	})
	stop(t, ob)
	if calls, effects, _ := down.stats(msg.Key); calls != 1 || effects != 1 {
		t.Errorf("downstream: %d calls, %d effects; want the provider called once", calls, effects)
	}
	again, err := ob.Delivery(ctx, msg.Key, "charge")
	if err != nil {
		t.Fatal(err)
	}
	if again.DownstreamID != first.DownstreamID || again.Attempts != 1 || !again.DeliveredAt.Equal(first.DeliveredAt) {
		t.Errorf("delivery changed: %+v, was %+v", again, first)
	}
	if got := logs.count("outbox: already delivered; provider not called again"); got != 1 {
		t.Errorf("%d already-delivered events logged, want 1", got)
	}
	if got := meters.get(outbox.MetricDelivered, "charge"); got != 1 {
		t.Errorf("%s = %d, want 1", outbox.MetricDelivered, got)
	}
}

func TestEnqueueRefusesInvalidMessages(t *testing.T) {
	t.Parallel()
	db := newSQLiteDB(t)
	ob := db.newOutbox(t, testConfig(httpDeliverer{"http://127.0.0.1:1"}, newLogs(t), newMeterRecorder()))
	ctx := context.Background()
	for name, m := range map[string]outbox.Message{
		"no kind":      {Key: "k"},
		"no key":       {Kind: "charge"},
		"unknown kind": {Kind: "refund", Key: "k"},
		"bad payload":  {Kind: "charge", Key: "k", Payload: json.RawMessage(`{"a":`)},
	} {
		err := db.store.InTx(ctx, func(tx *sql.Tx) error { return ob.EnqueueTx(ctx, tx, m) })
		if !errors.Is(err, outbox.ErrInvalidMessage) {
			t.Errorf("%s: err = %v, want ErrInvalidMessage", name, err)
		}
	}
	if n, err := ob.JobCount(ctx); err != nil || n != 0 {
		t.Errorf("%d jobs (err %v), want none", n, err)
	}
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	db := newSQLiteDB(t)
	d := httpDeliverer{"http://127.0.0.1:1"}
	for name, cfg := range map[string]outbox.Config{
		"timeout over rescue": {Deliverers: map[string]outbox.Deliverer{"c": d}, DeliveryTimeout: time.Minute, RescueAfter: time.Second},
		"negative attempts":   {Deliverers: map[string]outbox.Deliverer{"c": d}, MaxAttempts: -1},
		"negative dead pass":  {Deliverers: map[string]outbox.Deliverer{"c": d}, DeadLetterInterval: -time.Second},
		"nil deliverer":       {Deliverers: map[string]outbox.Deliverer{"c": nil}},
		"empty kind":          {Deliverers: map[string]outbox.Deliverer{"": d}},
	} {
		if _, err := outbox.NewSQLite(db.store.(interface{ DB() *sql.DB }).DB(), cfg); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	// Without Deliverers an outbox only enqueues.
	ob := db.newOutbox(t, outbox.Config{Logger: (newLogs(t)).logger()})
	if err := ob.Start(context.Background()); err == nil {
		t.Error("Start without Deliverers succeeded")
	}
	ctx := context.Background()
	if err := db.store.InTx(ctx, func(tx *sql.Tx) error {
		return ob.EnqueueTx(ctx, tx, outbox.Message{Kind: "anything", Key: "k"})
	}); err != nil {
		t.Errorf("enqueue-only outbox: %v", err)
	}
}

// The default delivery timeout leaves a margin below RescueAfter: an
// attempt cut off at its timeout still records its outcome before the
// rescuer may presume it dead and start it again.
func TestDefaultDeliveryTimeoutBelowRescue(t *testing.T) {
	for _, c := range []struct{ rescue, want time.Duration }{
		{0, time.Minute}, // the default RescueAfter, 5 minutes
		{90 * time.Second, 45 * time.Second},
		{time.Second, 500 * time.Millisecond},
	} {
		if got := outbox.DeliveryTimeout(outbox.Config{RescueAfter: c.rescue}); got != c.want {
			t.Errorf("RescueAfter %s: DeliveryTimeout %s, want %s", c.rescue, got, c.want)
		}
	}
}

// Processes starting together migrate the same database once; Migrate is
// then a no-op.
func TestMigrateConcurrently(t *testing.T) {
	forEachDB(t, testMigrateConcurrently[pgx.Tx], testMigrateConcurrently[*sql.Tx])
}

func testMigrateConcurrently[TTx any](t *testing.T, db database[TTx]) {
	cfg := outbox.Config{Logger: (newLogs(t)).logger()}
	obs := []*outbox.Outbox[TTx]{db.newOutbox(t, cfg)} // migrated once already
	for range 3 {
		obs = append(obs, db.newOutboxUnmigrated(t, cfg))
	}
	var wg sync.WaitGroup
	errs := make([]error, len(obs))
	for i, o := range obs {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			errs[i] = o.Migrate(ctx)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}

func TestKeyFor(t *testing.T) {
	t.Parallel()
	k := outbox.KeyFor("tenant-a POST /charges", "order-1", "charge")
	if k != outbox.KeyFor("tenant-a POST /charges", "order-1", "charge") {
		t.Fatal("KeyFor is not deterministic")
	}
	if !strings.HasPrefix(k, "idem_") || len(k) != 48 {
		t.Errorf("KeyFor = %q (%d chars), want idem_ and 43 base64 characters", k, len(k))
	}
	seen := map[string][3]string{}
	for _, in := range [][3]string{
		{"tenant-a POST /charges", "order-1", "charge"},
		{"tenant-b POST /charges", "order-1", "charge"}, // another tenant, same client key
		{"tenant-a POST /charges", "order-1", "email"},  // another message of the request
		{"tenant-a POST /charges", "order-", "1charge"}, // the same bytes, cut elsewhere
		{"tenant-a POST /charges", "", "order-1charge"},
		{"", "tenant-a POST /chargesorder-1", "charge"},
	} {
		k := outbox.KeyFor(in[0], in[1], in[2])
		if prev, dup := seen[k]; dup {
			t.Errorf("KeyFor%q = KeyFor%q", in, prev)
		}
		seen[k] = in
	}
}

// The first downstream id recorded for a message stays, with the attempt
// that delivered it: a second delivery of the same message (two workers, or
// a crash between the record and River's completion that runs the job
// again) is told the id already kept and cannot replace it.
func TestFirstDownstreamIDWins(t *testing.T) {
	forEachDB(t, firstDownstreamIDWins[pgx.Tx], firstDownstreamIDWins[*sql.Tx])
}

func firstDownstreamIDWins[TTx any](t *testing.T, db database[TTx]) {
	ctx := context.Background()
	ob := db.newOutbox(t, testConfig(httpDeliverer{"http://127.0.0.1:1"}, newLogs(t), newMeterRecorder()))
	for i, try := range []struct {
		id      string
		attempt int
	}{{"ch_first", 1}, {"ch_second", 2}, {"ch_third", 3}} {
		kept, err := ob.RecordDelivery(ctx, "k1", "charge", 7, 42, try.id, try.attempt)
		if err != nil {
			t.Fatal(err)
		}
		if kept != "ch_first" {
			t.Fatalf("delivery %d recorded %q: the table keeps %q, want ch_first", i+1, try.id, kept)
		}
	}
	d, err := ob.Delivery(ctx, "k1", "charge")
	if err != nil {
		t.Fatal(err)
	}
	if d.State != outbox.Delivered || d.DownstreamID != "ch_first" || d.Attempts != 1 {
		t.Fatalf("delivery %+v, want delivered as ch_first at attempt 1", d)
	}
}

// A provider that performs the effect and answers just as the attempt's
// DeliveryTimeout ends: its id is recorded anyway (the write has its own
// time), so the message is delivered once, never dead-lettered, although
// this was its last allowed attempt.
func TestDeliveredAtTheDeadlineIsRecorded(t *testing.T) {
	t.Parallel()
	db := newSQLiteDB(t)
	down := newDownstream(t)
	logs, meters := newLogs(t), newMeterRecorder()
	var dead atomic.Bool
	cfg := testConfig(outbox.DelivererFunc(func(ctx context.Context, msg outbox.Message) (string, error) {
		id, err := httpDeliverer{down.srv.URL}.Deliver(context.WithoutCancel(ctx), msg)
		<-ctx.Done() // the provider's answer arrives at the deadline
		return id, err
	}), logs, meters)
	cfg.MaxAttempts = 1
	cfg.DeliveryTimeout = 300 * time.Millisecond
	cfg.OnDead = func(context.Context, outbox.Message, error) error { dead.Store(true); return nil }
	o := db.newOutbox(t, cfg)
	msg := outbox.Message{Kind: "charge", Key: "k1", Fence: 1, Payload: json.RawMessage(`{}`)}
	enqueue(t, db, o, msg)
	start(t, o)
	d := waitState(t, o, "k1", "charge", outbox.Delivered, 20*time.Second)
	if _, effects, _ := down.stats("k1"); effects != 1 || d.DownstreamID == "" {
		t.Fatalf("delivery %+v with %d effects, want one effect and its id recorded", d, effects)
	}
	if dead.Load() || meters.get(outbox.MetricDead, "charge") != 0 {
		t.Fatal("a delivered message was dead-lettered")
	}
}

// The outbox's own database failing before the provider is called (here
// its table gone for a moment; a database slower than DeliveryTimeout does
// the same) costs the message no attempt: on its last allowed attempt it
// used to be dead-lettered without its provider ever having been asked.
func TestLookupFailureCostsNoAttempt(t *testing.T) {
	t.Parallel()
	db := newSQLiteDB(t)
	down := newDownstream(t)
	logs, meters := newLogs(t), newMeterRecorder()
	cfg := testConfig(httpDeliverer{down.srv.URL}, logs, meters)
	cfg.MaxAttempts = 1
	var dead atomic.Bool
	cfg.OnDead = func(context.Context, outbox.Message, error) error { dead.Store(true); return nil }
	o := db.newOutbox(t, cfg)
	enqueue(t, db, o, outbox.Message{Kind: "charge", Key: "k1", Fence: 1, Payload: json.RawMessage(`{}`)})
	ctx := context.Background()
	rename := func(from, to string) {
		t.Helper()
		if err := db.store.InTx(ctx, func(tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, "ALTER TABLE "+from+" RENAME TO "+to)
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	rename("idem_outbox", "idem_outbox_away")
	start(t, o)
	eventually(t, 20*time.Second, "the first attempt", func() (bool, error) {
		return logs.count("outbox: looking up the delivery failed; the message runs again")+
			logs.count("outbox: last attempt failed") > 0, nil
	})
	rename("idem_outbox_away", "idem_outbox")
	var d outbox.Delivery
	eventually(t, 20*time.Second, "a final state", func() (bool, error) {
		var err error
		d, err = o.Delivery(ctx, "k1", "charge")
		return d.State == outbox.Delivered || d.State == outbox.Dead, err
	})
	if _, effects, _ := down.stats("k1"); d.State != outbox.Delivered || effects != 1 || dead.Load() {
		t.Fatalf("after the lookup failed: %+v, %d effects, OnDead called %v; want delivered once", d, effects, dead.Load())
	}
}

// OnDead gets a context of its own: the last attempt's may have expired
// (a provider that hung), and OnDead writes what settles the message.
func TestOnDeadGetsALiveContext(t *testing.T) {
	t.Parallel()
	db := newSQLiteDB(t)
	logs, meters := newLogs(t), newMeterRecorder()
	ctxErr := make(chan error, 1)
	cfg := testConfig(outbox.DelivererFunc(func(ctx context.Context, msg outbox.Message) (string, error) {
		<-ctx.Done() // the provider hangs
		return "", ctx.Err()
	}), logs, meters)
	cfg.MaxAttempts = 1
	cfg.DeliveryTimeout = 200 * time.Millisecond
	cfg.OnDead = func(ctx context.Context, msg outbox.Message, lastErr error) error {
		ctxErr <- ctx.Err()
		return nil
	}
	o := db.newOutbox(t, cfg)
	enqueue(t, db, o, outbox.Message{Kind: "charge", Key: "k2", Fence: 1})
	start(t, o)
	waitState(t, o, "k2", "charge", outbox.Dead, 20*time.Second)
	select {
	case err := <-ctxErr:
		if err != nil {
			t.Fatalf("OnDead ran with an ended context: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("OnDead was not called")
	}
}
