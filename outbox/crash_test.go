package outbox_test

// The crash test of the verification checklist: the worker process is
// killed (SIGKILL) after the provider performed the side effect and before
// the outbox recorded it. The child is this test binary re-executed with
// -test.run=TestHelperWorker and the environment below.

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/store/sqlite"
)

const (
	helperDBEnv         = "IDEM_OUTBOX_HELPER"            // "postgres" or "sqlite"
	helperDSNEnv        = "IDEM_OUTBOX_HELPER_DSN"        // the schema, or the SQLite file
	helperDownstreamEnv = "IDEM_OUTBOX_HELPER_DOWNSTREAM" // the provider's URL
	deliveredLine       = "DELIVERED "                    // the child's stdout: the effect happened
)

func TestCrashAfterTheSideEffectBeforeTheRecord(t *testing.T) {
	forEachDB(t, testCrash[pgx.Tx], testCrash[*sql.Tx])
}

func testCrash[TTx any](t *testing.T, db database[TTx]) {
	ctx := context.Background()
	down := newDownstream(t)
	logs, meters := newLogs(t), newMeterRecorder()

	// The web process: enqueues and commits, delivers nothing itself.
	web := db.newOutbox(t, testConfig(httpDeliverer{down.srv.URL}, logs, meters))
	msg := outbox.Message{Kind: "charge", Key: outbox.KeyFor("tenant-1 POST /charges", "order-crash", "charge"), Fence: 4,
		Payload: json.RawMessage(`{"amount":100}`)}
	enqueue(t, db, web, msg)

	// The worker process takes the message, calls the provider, says so on
	// stdout and hangs before returning to the outbox: killed there.
	id, kill := workerProcess(t, db, down.srv.URL)
	kill()

	if calls, effects, _ := down.stats(msg.Key); calls != 1 || effects != 1 {
		t.Fatalf("before the restart: %d calls, %d effects; want 1, 1", calls, effects)
	}
	if d, err := web.Delivery(ctx, msg.Key, "charge"); err != nil || d.State != outbox.Pending || d.DownstreamID != "" {
		t.Fatalf("before the restart: %+v, %v; want pending with nothing recorded", d, err)
	}

	// A fresh worker. The dead one held River's leadership, which the
	// fresh one takes when it expires; its rescuer then finds the delivery
	// running for longer than RescueAfter and retries it.
	cfg := testConfig(httpDeliverer{down.srv.URL}, logs, meters)
	cfg.RescueAfter = time.Second
	fresh := db.newOutbox(t, cfg)
	began := time.Now()
	start(t, fresh)
	d := waitState(t, fresh, msg.Key, "charge", outbox.Delivered, 45*time.Second)
	t.Logf("%s: redelivered %s after the crash", db.name, time.Since(began).Round(100*time.Millisecond))
	stop(t, fresh)

	calls, effects, fence := down.stats(msg.Key)
	if effects != 1 {
		t.Errorf("%d side effects for the key, want 1", effects)
	}
	if calls != 2 {
		t.Errorf("%d calls to the provider, want 2 (the crashed one and the redelivery)", calls)
	}
	if d.DownstreamID != id {
		t.Errorf("recorded downstream id %q, want the first one %q", d.DownstreamID, id)
	}
	if fence != msg.Fence || d.Attempts != 2 {
		t.Errorf("fence %d, attempts %d; want %d, 2", fence, d.Attempts, msg.Fence)
	}
	if got := meters.get(outbox.MetricDelivered, "charge"); got != 1 {
		t.Errorf("%s = %d, want 1", outbox.MetricDelivered, got)
	}
}

// workerProcess starts the worker process of the crash tests, this test
// binary re-executed as TestHelperWorker: it takes the message waiting in
// db, calls the provider at downURL, says so on stdout and hangs before
// returning to the outbox. workerProcess returns once the provider
// answered, with the downstream id it answered and a function that kills
// the process (SIGKILL) and waits for it to exit.
func workerProcess[TTx any](t *testing.T, db database[TTx], downURL string) (id string, kill func()) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperWorker$")
	cmd.Env = append(os.Environ(), db.env...)
	cmd.Env = append(cmd.Env, urlEnv+"="+os.Getenv(urlEnv), helperDownstreamEnv+"="+downURL)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var waitOnce sync.Once
	wait := func() { waitOnce.Do(func() { cmd.Wait() }) } //nolint:errcheck // killed on purpose
	t.Cleanup(func() {
		cmd.Process.Kill() //nolint:errcheck // already dead when the test went well
		wait()
	})
	firstID := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if id, ok := strings.CutPrefix(sc.Text(), deliveredLine); ok {
				firstID <- id
			}
		}
		close(firstID)
	}()
	select {
	case id = <-firstID:
	case <-time.After(30 * time.Second):
		t.Fatalf("the worker process did not deliver within 30s; its stderr:\n%s", stderr.String())
	}
	if id == "" {
		wait()
		t.Fatalf("the worker process exited before delivering; its stderr:\n%s", stderr.String())
	}
	return id, func() {
		if err := cmd.Process.Kill(); err != nil { // SIGKILL
			t.Fatal(err)
		}
		wait()
	}
}

// TestHelperWorker is the worker process of the crash test; it runs only
// when the crash test starts it.
func TestHelperWorker(t *testing.T) {
	kind := os.Getenv(helperDBEnv)
	if kind == "" {
		t.Skip("the worker process of the crash test, started by it")
	}
	// Never outlive a parent that died without killing this process.
	time.AfterFunc(time.Minute, func() { os.Exit(3) })

	ctx := context.Background()
	hang := make(chan struct{})
	cfg := outbox.Config{
		Deliverers: map[string]outbox.Deliverer{"charge": outbox.DelivererFunc(func(ctx context.Context, msg outbox.Message) (string, error) {
			id, err := httpDeliverer{os.Getenv(helperDownstreamEnv)}.Deliver(ctx, msg)
			if err != nil {
				return "", err
			}
			fmt.Println(deliveredLine + id)
			<-hang // ignores ctx: the process is killed here
			return id, nil
		})},
		// Long enough that this process never rescues its own delivery.
		RescueAfter:  time.Hour,
		PollInterval: 50 * time.Millisecond,
	}
	var err error
	switch kind {
	case "postgres":
		pool, perr := openPool(ctx, os.Getenv(urlEnv), os.Getenv(helperDSNEnv))
		if perr != nil {
			t.Fatal(perr)
		}
		var o *outbox.Outbox[pgx.Tx]
		if o, err = outbox.NewPostgres(pool, cfg); err == nil {
			err = o.Start(ctx)
		}
	case "sqlite":
		s, serr := sqlite.Open(ctx, os.Getenv(helperDSNEnv), sqlite.Config{})
		if serr != nil {
			t.Fatal(serr)
		}
		var o *outbox.Outbox[*sql.Tx]
		if o, err = outbox.NewSQLite(s.DB(), cfg); err == nil {
			err = o.Start(ctx)
		}
	default:
		err = fmt.Errorf("unknown database %q", kind)
	}
	if err != nil {
		t.Fatal(err)
	}
	<-hang
}
