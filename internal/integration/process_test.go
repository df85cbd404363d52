package integration_test

// Tests with real operating-system processes: the test binary re-executes
// itself as a child (IDEM_TEST_CHILD names what the child does), so crashes
// are real SIGKILLs and concurrency crosses process boundaries.

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/testkit/enginetest"
	"github.com/idem-go/idem/internal/testkit/pgdb"
	"github.com/idem-go/idem/internal/testkit/testenv"
	"github.com/idem-go/idem/phase"
	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/postgres"
	"github.com/idem-go/idem/store/sqlite"
	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if mode := os.Getenv("IDEM_TEST_CHILD"); mode != "" {
		if err := runChild(mode); err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

// child is a running child process whose stdout lines can be awaited.
type child struct {
	cmd   *exec.Cmd
	lines chan string
}

func startChild(t *testing.T, mode string, env ...string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), append([]string{"IDEM_TEST_CHILD=" + mode}, env...)...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: cmd, lines: make(chan string, 16)}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		close(c.lines)
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	return c
}

// await returns the next line starting with prefix (without it).
func (c *child) await(t *testing.T, prefix string) string {
	t.Helper()
	timeout := time.After(60 * time.Second)
	for {
		select {
		case l, ok := <-c.lines:
			if !ok {
				t.Fatalf("child exited before printing %q", prefix)
			}
			if strings.HasPrefix(l, prefix) {
				return strings.TrimPrefix(l, prefix)
			}
		case <-timeout:
			t.Fatalf("child did not print %q in time", prefix)
		}
	}
}

// kill SIGKILLs the child and waits for it: nothing of it runs afterwards.
func (c *child) kill(t *testing.T) {
	t.Helper()
	if err := c.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	c.cmd.Wait()
}

// A database both sides of a crash test open: SQLite (a file) or
// PostgreSQL (a schema), with a business table "payments".
type crashDB struct {
	name string
	env  []string // tells the child how to open it
	open func(t *testing.T, clock store.Clock) (store.Store, writeFirst)
	// count returns how many payments the key has.
	count func(t *testing.T, key string) int
}

// writeFirst inserts a payment for key and completes the key with resp in
// one transaction; beforeCommit runs between the two.
type writeFirst func(ctx context.Context, x *idem.Execution, key string, resp store.Response, beforeCommit func()) error

func crashDBs(t *testing.T) []crashDB {
	dbs := []crashDB{sqliteCrashDB(t)}
	if url := os.Getenv("IDEM_TEST_POSTGRES_URL"); url != "" {
		dbs = append(dbs, postgresCrashDB(t, url))
	} else {
		testenv.Without(t, "IDEM_TEST_POSTGRES_URL is not set: crash tests run on SQLite only")
	}
	return dbs
}

func sqliteCrashDB(t *testing.T) crashDB {
	path := filepath.Join(t.TempDir(), "crash.db")
	return crashDB{
		name: "sqlite",
		env:  []string{"IDEM_TEST_SQLITE=" + path},
		open: func(t *testing.T, clock store.Clock) (store.Store, writeFirst) {
			return openSQLiteWriteFirst(path, clock)
		},
		count: func(t *testing.T, key string) int {
			s, _ := openSQLiteWriteFirst(path, nil)
			defer s.Close()
			var n int
			if err := s.(*sqlite.Store).DB().QueryRow(`SELECT count(*) FROM payments WHERE key = ?`, key).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		},
	}
}

func openSQLiteWriteFirst(path string, clock store.Clock) (store.Store, writeFirst) {
	s, err := sqlite.Open(context.Background(), path, sqlite.Config{Clock: clock})
	if err != nil {
		panic(err)
	}
	if _, err := s.DB().Exec(`CREATE TABLE IF NOT EXISTS payments (key TEXT NOT NULL, amount INTEGER NOT NULL)`); err != nil {
		panic(err)
	}
	return s, func(ctx context.Context, x *idem.Execution, key string, resp store.Response, beforeCommit func()) error {
		return s.InTx(ctx, func(tx *sql.Tx) error {
			if _, err := tx.ExecContext(ctx, `INSERT INTO payments (key, amount) VALUES (?, 100)`, key); err != nil {
				return err
			}
			if err := s.CompleteTx(ctx, tx, x.CompleteParams(resp)); err != nil {
				return err
			}
			beforeCommit()
			return nil
		})
	}
}

func postgresCrashDB(t *testing.T, url string) crashDB {
	schema := pgdb.Schema(t, url)
	return crashDB{
		name: "postgres",
		env:  []string{"IDEM_TEST_PG_SCHEMA=" + schema},
		open: func(t *testing.T, clock store.Clock) (store.Store, writeFirst) {
			return openPostgresWriteFirst(url, schema, clock)
		},
		count: func(t *testing.T, key string) int {
			conn, err := pgx.Connect(context.Background(), url)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(context.Background())
			var n int
			q := `SELECT count(*) FROM ` + pgx.Identifier{schema, "payments"}.Sanitize() + ` WHERE key = $1`
			if err := conn.QueryRow(context.Background(), q, key).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		},
	}
}

func openPostgresWriteFirst(url, schema string, clock store.Clock) (store.Store, writeFirst) {
	ctx := context.Background()
	s, err := postgres.Open(ctx, url, postgres.Config{Clock: clock, Schema: schema})
	if err != nil {
		panic(err)
	}
	table := pgx.Identifier{schema, "payments"}.Sanitize()
	if _, err := s.Pool().Exec(ctx, `CREATE TABLE IF NOT EXISTS `+table+` (key text NOT NULL, amount int NOT NULL)`); err != nil {
		panic(err)
	}
	return s, func(ctx context.Context, x *idem.Execution, key string, resp store.Response, beforeCommit func()) error {
		return s.InTx(ctx, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO `+table+` (key, amount) VALUES ($1, 100)`, key); err != nil {
				return err
			}
			if err := s.CompleteTx(ctx, tx, x.CompleteParams(resp)); err != nil {
				return err
			}
			beforeCommit()
			return nil
		})
	}
}

// chargeHandler is the write-first handler both sides run: the payment row
// and the key's completion commit together.
func chargeHandler(wf writeFirst, beforeCommit func()) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		x := idem.FromContext(r.Context())
		body := []byte(`{"id":"pay_` + x.Key() + `"}`)
		resp := store.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: body}
		if err := wf(r.Context(), x, x.Key(), resp, beforeCommit); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		x.Committed()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(201)
		w.Write(body)
	}
}

func openChildDB() (store.Store, writeFirst) {
	if path := os.Getenv("IDEM_TEST_SQLITE"); path != "" {
		return openSQLiteWriteFirst(path, nil)
	}
	return openPostgresWriteFirst(os.Getenv("IDEM_TEST_POSTGRES_URL"), os.Getenv("IDEM_TEST_PG_SCHEMA"), nil)
}

func runChild(mode string) error {
	switch mode {
	case "write-first":
		// Reserve, write the payment and complete the key in one
		// transaction, then hang before COMMIT until killed.
		s, wf := openChildDB()
		e, err := idem.New(s, idem.Config{LeasePolicy: store.LeaseRetry, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			return err
		}
		enginetest.SendCharge(e.Middleware(chargeHandler(wf, func() {
			fmt.Println("READY")
			select {}
		})), os.Getenv("IDEM_TEST_KEY"))
		return fmt.Errorf("the handler returned")
	case "phases":
		return childPhases()
	case "server":
		return childServer()
	}
	return fmt.Errorf("unknown child mode %q", mode)
}

func TestKilledBetweenWriteAndCommit(t *testing.T) {
	for _, db := range crashDBs(t) {
		t.Run(db.name, func(t *testing.T) {
			key := "crash-" + db.name
			c := startChild(t, "write-first", append(db.env, "IDEM_TEST_KEY="+key)...)
			c.await(t, "READY")
			c.kill(t)
			if n := db.count(t, key); n != 0 {
				t.Fatalf("a killed transaction left %d payments", n)
			}
			// The child's lease ran on the real clock; the retry comes after
			// it expired. Under policy retry the write-first handler runs again
			// (safe: nothing of the first attempt committed).
			later := func() time.Time { return time.Now().Add(time.Minute) }
			s, wf := db.open(t, later)
			defer s.Close()
			e, err := idem.New(s, idem.Config{LeasePolicy: store.LeaseRetry, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			h := e.Middleware(chargeHandler(wf, func() {}))
			if w := enginetest.SendCharge(h, key); w.Code != 201 || w.Header().Get("Idempotent-Replayed") != "" {
				t.Fatalf("retry after the crash: %d %s", w.Code, w.Body)
			}
			if w := enginetest.SendCharge(h, key); w.Code != 201 || w.Header().Get("Idempotent-Replayed") != "true" {
				t.Fatalf("second retry: %d %v", w.Code, w.Header())
			}
			if n := db.count(t, key); n != 1 {
				t.Fatalf("%d payments after the retries, want exactly 1", n)
			}
		})
	}
}

// foreign is a fake payment provider counting the calls it receives.
type foreign struct {
	srv   *httptest.Server
	mu    sync.Mutex
	calls map[string]int
}

func newForeign(t *testing.T) *foreign {
	f := &foreign{calls: map[string]int{}}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.calls[r.URL.Path+"?"+r.URL.RawQuery]++
		f.mu.Unlock()
		io.WriteString(w, "ok")
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *foreign) count(call string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[call]
}

// ridePhases is the atomic-phase handler of both sides: create the ride,
// charge the card (one foreign call), send the receipt (one foreign call).
// hook runs at the start of each phase.
func ridePhases(s *postgres.Store, schema, provider string, hook func(phase string)) http.HandlerFunc {
	rides := pgx.Identifier{schema, "rides"}.Sanitize()
	call := func(ctx context.Context, what, key string) error {
		req, _ := http.NewRequestWithContext(ctx, "POST", provider+"/"+what+"?key="+key, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		return nil
	}
	return func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		x := idem.FromContext(ctx)
		err := phase.Run(ctx, x, s,
			phase.Phase[pgx.Tx]{Name: "ride_created", Run: func(ctx context.Context, tx pgx.Tx) error {
				hook("ride_created")
				_, err := tx.Exec(ctx, `INSERT INTO `+rides+` (key) VALUES ($1)`, x.Key())
				return err
			}},
			phase.Phase[pgx.Tx]{Name: "charge_created", Run: func(ctx context.Context, tx pgx.Tx) error {
				hook("charge_created")
				if err := call(ctx, "charge", x.Key()); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, `UPDATE `+rides+` SET charged = true WHERE key = $1`, x.Key())
				return err
			}},
			phase.Phase[pgx.Tx]{Name: "receipt_sent", Run: func(ctx context.Context, tx pgx.Tx) error {
				hook("receipt_sent")
				return call(ctx, "receipt", x.Key())
			}},
		)
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		w.WriteHeader(201)
		io.WriteString(w, `{"ride":"`+x.Key()+`","resumed":`+fmt.Sprint(x.Resumed())+`}`)
	}
}

func childPhases() error {
	ctx := context.Background()
	url, schema := os.Getenv("IDEM_TEST_POSTGRES_URL"), os.Getenv("IDEM_TEST_PG_SCHEMA")
	s, err := postgres.Open(ctx, url, postgres.Config{Schema: schema, SkipMigrate: true})
	if err != nil {
		return err
	}
	e, err := idem.New(s, idem.Config{LeasePolicy: store.LeaseResume, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return err
	}
	h := e.Middleware(ridePhases(s, schema, os.Getenv("IDEM_TEST_PROVIDER"), func(phase string) {
		if phase == "receipt_sent" {
			// Two phases committed; die before the third.
			fmt.Println("READY")
			select {}
		}
	}))
	enginetest.SendCharge(h, os.Getenv("IDEM_TEST_KEY"))
	return fmt.Errorf("the handler returned")
}

func TestPhasesResumeAfterKill(t *testing.T) {
	url := os.Getenv("IDEM_TEST_POSTGRES_URL")
	if url == "" {
		testenv.Skip(t, "IDEM_TEST_POSTGRES_URL is not set: the phase-resume crash test needs PostgreSQL")
	}
	ctx := context.Background()
	schema := pgdb.Schema(t, url)
	provider := newForeign(t)
	later := func() time.Time { return time.Now().Add(time.Minute) }
	s, err := postgres.Open(ctx, url, postgres.Config{Schema: schema, Clock: later})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	rides := pgx.Identifier{schema, "rides"}.Sanitize()
	if _, err := s.Pool().Exec(ctx, `CREATE TABLE `+rides+` (key text PRIMARY KEY, charged bool NOT NULL DEFAULT false)`); err != nil {
		t.Fatal(err)
	}
	key := "ride-1"
	c := startChild(t, "phases", "IDEM_TEST_PG_SCHEMA="+schema, "IDEM_TEST_PROVIDER="+provider.srv.URL, "IDEM_TEST_KEY="+key)
	c.await(t, "READY")
	c.kill(t)
	if provider.count("/charge?key="+key) != 1 || provider.count("/receipt?key="+key) != 0 {
		t.Fatalf("before the retry: %v", provider.calls)
	}

	e, err := idem.New(s, idem.Config{LeasePolicy: store.LeaseResume, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	var ran []string
	h := e.Middleware(ridePhases(s, schema, provider.srv.URL, func(p string) { ran = append(ran, p) }))
	w := enginetest.SendCharge(h, key)
	if w.Code != 201 || !strings.Contains(w.Body.String(), `"resumed":true`) {
		t.Fatalf("resumed request: %d %s", w.Code, w.Body)
	}
	if len(ran) != 1 || ran[0] != "receipt_sent" {
		t.Fatalf("phases run on resume: %v, want only receipt_sent", ran)
	}
	if provider.count("/charge?key="+key) != 1 || provider.count("/receipt?key="+key) != 1 {
		t.Fatalf("provider calls after resume: %v", provider.calls)
	}
	var n int
	var charged bool
	if err := s.Pool().QueryRow(ctx, `SELECT count(*), bool_and(charged) FROM `+rides).Scan(&n, &charged); err != nil || n != 1 || !charged {
		t.Fatalf("rides: %d charged=%v %v", n, charged, err)
	}
	rec, err := s.Get(ctx, (&idem.Request{Method: "POST", Route: "/v1/payments"}).Scope(), key)
	if err != nil || rec.State != store.StateCompleted || rec.RecoveryPoint != "receipt_sent" || rec.Fence <= 0 {
		t.Fatalf("record after resume: %+v %v", rec, err)
	}
}

func childServer() error {
	ctx := context.Background()
	url, schema := os.Getenv("IDEM_TEST_POSTGRES_URL"), os.Getenv("IDEM_TEST_PG_SCHEMA")
	s, err := postgres.Open(ctx, url, postgres.Config{Schema: schema, SkipMigrate: true})
	if err != nil {
		return err
	}
	e, err := idem.New(s, idem.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return err
	}
	upstream := os.Getenv("IDEM_TEST_PROVIDER")
	h := e.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := idem.FromContext(r.Context()).Key()
		resp, err := http.Post(upstream+"/exec?key="+key, "text/plain", nil)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		resp.Body.Close()
		w.WriteHeader(201)
		io.WriteString(w, `{"key":"`+key+`","pid":`+fmt.Sprint(os.Getpid())+`}`)
	}))
	srv := httptest.NewServer(h)
	fmt.Println("ADDR " + srv.URL)
	select {}
}

func TestMultiProcessExactlyOnce(t *testing.T) {
	url := os.Getenv("IDEM_TEST_POSTGRES_URL")
	if url == "" {
		testenv.Skip(t, "IDEM_TEST_POSTGRES_URL is not set: the multi-process test needs PostgreSQL")
	}
	const procs, keys, dups = 4, 500, 8
	schema := pgdb.Schema(t, url)
	s, err := postgres.Open(context.Background(), url, postgres.Config{Schema: schema}) // migrates
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	upstream := newForeign(t)
	var addrs []string
	for i := 0; i < procs; i++ {
		c := startChild(t, "server", "IDEM_TEST_PG_SCHEMA="+schema, "IDEM_TEST_PROVIDER="+upstream.srv.URL)
		addrs = append(addrs, c.await(t, "ADDR "))
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}, Timeout: 30 * time.Second}
	defer client.CloseIdleConnections()
	type job struct{ key string }
	jobs := make(chan job)
	var status sync.Map // code -> *atomic.Int64
	var failures atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < 64; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				req, _ := http.NewRequest("POST", addrs[rand.IntN(procs)]+"/v1/orders", strings.NewReader(`{"sku":"x"}`))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Idempotency-Key", j.key)
				resp, err := client.Do(req)
				if err != nil {
					failures.Add(1)
					t.Errorf("request %s: %v", j.key, err)
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				n, _ := status.LoadOrStore(resp.StatusCode, new(atomic.Int64))
				n.(*atomic.Int64).Add(1)
			}
		}()
	}
	var all []job
	for k := 0; k < keys; k++ {
		for d := 0; d < dups; d++ {
			all = append(all, job{fmt.Sprintf("order-%d", k)})
		}
	}
	rand.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
	for _, j := range all {
		jobs <- j
	}
	close(jobs)
	wg.Wait()
	counts := map[int]int64{}
	status.Range(func(k, v any) bool { counts[k.(int)] = v.(*atomic.Int64).Load(); return true })
	t.Logf("answers by status: %v", counts)
	for code, n := range counts {
		if code != 201 && code != 409 {
			t.Errorf("%d answers with status %d", n, code)
		}
	}
	if counts[201]+counts[409] != keys*dups || failures.Load() != 0 {
		t.Fatalf("answers %v, failures %d", counts, failures.Load())
	}
	for k := 0; k < keys; k++ {
		if n := upstream.count(fmt.Sprintf("/exec?key=order-%d", k)); n != 1 {
			t.Fatalf("order-%d executed %d times", k, n)
		}
	}
}
