package sqlite_test

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/sqlite"
	"github.com/idem-go/idem/store/storetest"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(reserveChild())
	}
	goleak.VerifyTestMain(m)
}

func TestConformance(t *testing.T) {
	storetest.Run(t, storetest.Harness{
		NewDatabase: func(t *testing.T) storetest.Opener {
			path := filepath.Join(t.TempDir(), "idem.db")
			return func(t *testing.T, clock store.Clock) store.Store {
				return open(t, path, sqlite.Config{Clock: clock})
			}
		},
		Durable: true,
		Shared:  true,
	})
}

func open(t *testing.T, path string, cfg sqlite.Config) *sqlite.Store {
	t.Helper()
	s, err := sqlite.Open(context.Background(), path, cfg)
	if err != nil {
		t.Fatalf("Open(%s): %v", path, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func reserveP(key, fp string, policy store.LeasePolicy) store.ReserveParams {
	return store.ReserveParams{Scope: "s", Key: key, Fingerprint: fp, Lease: 30 * time.Second,
		TTL: 24 * time.Hour, LeasePolicy: policy}
}

func fenceOf(r store.Record) store.FenceParams {
	return store.FenceParams{Scope: r.Scope, Key: r.Key, Fence: r.Fence}
}

func mustReserve(t *testing.T, s *sqlite.Store, p store.ReserveParams, want store.ReserveOutcome) store.Record {
	t.Helper()
	res, err := s.Reserve(context.Background(), p)
	if err != nil {
		t.Fatalf("Reserve(%s): %v", p.Key, err)
	}
	if res.Outcome != want {
		t.Fatalf("Reserve(%s): outcome %v, want %v", p.Key, res.Outcome, want)
	}
	return res.Record
}

func TestMigrateIsIdempotent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "idem.db")

	// Concurrent first Opens of one file: the immediate transaction lets
	// exactly one of them apply each migration.
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := sqlite.Open(ctx, path, sqlite.Config{})
			if err == nil {
				err = s.Close()
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("concurrent Open %d: %v", i, err)
		}
	}

	s := open(t, path, sqlite.Config{})
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("Migrate on a migrated database: %v", err)
	}
	rows, err := s.DB().QueryContext(ctx, `SELECT version, name FROM idem_migrations ORDER BY version`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var got []string
	for rows.Next() {
		var v int
		var name string
		if err := rows.Scan(&v, &name); err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprint(v, " ", name))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if want := []string{"1 001_records", "2 002_dead_letter", "4 004_list", "6 006_pending", "7 007_tenant", "11 011_owner"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("idem_migrations = %q, want %q", got, want)
	}
}

func TestSkipMigrate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "idem.db")
	s := open(t, path, sqlite.Config{SkipMigrate: true})
	// An unmigrated database is an error, never a silent success.
	if _, err := s.Reserve(ctx, reserveP("k", "fp", store.LeaseUnknown)); err == nil {
		t.Fatal("Reserve on an unmigrated database succeeded")
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	mustReserve(t, s, reserveP("k", "fp", store.LeaseUnknown), store.Created)
}

// The pragmas come from the DSN, so the writer's connection (and any that
// replaces it) runs durable WAL with the configured busy timeout.
func TestWriterPragmas(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "idem.db"), sqlite.Config{BusyTimeout: 1234 * time.Millisecond})
	db := s.DB()
	var mode string
	var sync, fk, busy int
	if err := db.QueryRowContext(ctx, `SELECT * FROM pragma_journal_mode, pragma_synchronous,
		pragma_foreign_keys, pragma_busy_timeout`).Scan(&mode, &sync, &fk, &busy); err != nil {
		t.Fatal(err)
	}
	if mode != "wal" || sync != 2 || fk != 1 || busy != 1234 {
		t.Fatalf("writer: journal_mode %s synchronous %d foreign_keys %d busy_timeout %d, want wal 2 1 1234",
			mode, sync, fk, busy)
	}
	if db.Stats().MaxOpenConnections != 1 {
		t.Fatalf("writer pool allows %d connections, want 1", db.Stats().MaxOpenConnections)
	}
}

// A write transaction held by one handle makes another handle's Reserve
// wait for BusyTimeout and then fail with an error: the store fails closed.
func TestBusyTimeoutFailsClosed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "idem.db")
	a := open(t, path, sqlite.Config{})
	b := open(t, path, sqlite.Config{BusyTimeout: 20 * time.Millisecond})
	tx, err := a.DB().BeginTx(ctx, nil) // immediate: takes the write lock now
	if err != nil {
		t.Fatal(err)
	}
	res, err := b.Reserve(ctx, reserveP("k", "fp", store.LeaseUnknown))
	if err == nil {
		t.Fatalf("Reserve while another handle holds the write lock: %v, want an error", res.Outcome)
	}
	for _, sentinel := range []error{store.ErrNotFound, store.ErrLeaseLost, store.ErrStateConflict, store.ErrInvalidParams} {
		if errors.Is(err, sentinel) {
			t.Fatalf("busy error maps to %v: %v", sentinel, err)
		}
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	mustReserve(t, b, reserveP("k", "fp", store.LeaseUnknown), store.Created)
}

const businessTable = `CREATE TABLE IF NOT EXISTS payments (key TEXT PRIMARY KEY, amount INTEGER NOT NULL)`

// Every field of records in every state survives a close and reopen, and a
// nil body stays apart from an empty one.
func TestReopenKeepsEveryField(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "idem.db")
	clock := storetest.NewClock()
	s, err := sqlite.Open(ctx, path, sqlite.Config{Clock: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	inflight := mustReserve(t, s, reserveP("inflight", "fp1", store.LeaseResume), store.Created)
	if err := s.Checkpoint(ctx, store.CheckpointParams{FenceParams: fenceOf(inflight), RecoveryPoint: "p1"}); err != nil {
		t.Fatal(err)
	}
	clock.Advance(1500 * time.Nanosecond) // sub-microsecond parts are dropped consistently
	empty := mustReserve(t, s, reserveP("empty", "fp2", store.LeaseUnknown), store.Created)
	if err := s.Complete(ctx, store.CompleteParams{FenceParams: fenceOf(empty), Response: store.Response{Status: 200, Body: []byte{}}}); err != nil {
		t.Fatal(err)
	}
	nilBody := mustReserve(t, s, reserveP("nil", "fp3", store.LeaseUnknown), store.Created)
	if err := s.Complete(ctx, store.CompleteParams{FenceParams: fenceOf(nilBody), Response: store.Response{Status: 204, Header: http.Header{}}}); err != nil {
		t.Fatal(err)
	}
	unknown := mustReserve(t, s, reserveP("unknown", "fp4", store.LeaseUnknown), store.Created)
	if err := s.MarkUnknown(ctx, store.ReleaseParams{FenceParams: fenceOf(unknown), Error: "timeout"}); err != nil {
		t.Fatal(err)
	}
	if err := s.Defer(ctx, store.DeferParams{FenceParams: fenceOf(unknown), Delay: time.Minute, Error: "again"}); err != nil {
		t.Fatal(err)
	}

	keys := []string{"inflight", "empty", "nil", "unknown"}
	before := map[string]store.Record{}
	for _, k := range keys {
		if before[k], err = s.Get(ctx, "s", k); err != nil {
			t.Fatal(err)
		}
	}
	if b := before["empty"].Response.Body; b == nil || len(b) != 0 {
		t.Fatalf("empty body came back as %#v", b)
	}
	if b := before["nil"].Response.Body; b != nil {
		t.Fatalf("nil body came back as %#v", b)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s2 := open(t, path, sqlite.Config{Clock: clock.Now, SkipMigrate: true})
	for _, k := range keys {
		after, err := s2.Get(ctx, "s", k)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(before[k], after) {
			t.Fatalf("%s changed across reopen:\nbefore %+v\nafter  %+v", k, before[k], after)
		}
	}
}

// The background queries use their partial indexes, so sweeping, reaping
// and reconciling stay cheap when completed records dominate the table.
func TestQueryPlansUseIndexes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "idem.db"), sqlite.Config{})
	cases := []struct{ query, index string }{
		{`SELECT rowid FROM idem_records WHERE state IN ('completed', 'failed_retryable') AND expires_at <= ?1 ORDER BY expires_at LIMIT ?2`, "idem_records_reap"},
		{`SELECT rowid FROM idem_records WHERE state IN ('in_progress', 'unknown') AND expires_at <= ?1 ORDER BY expires_at LIMIT ?2`, "idem_records_abandon"},
		{`SELECT rowid FROM idem_records WHERE state = 'in_progress' AND lease_policy = 'unknown' AND locked_until <= ?1 ORDER BY locked_until LIMIT ?2`, "idem_records_sweep"},
		{`SELECT * FROM idem_records WHERE state = 'unknown' AND reconcile_after <= ?1 ORDER BY reconcile_after LIMIT ?2`, "idem_records_reconcile"},
	}
	for _, c := range cases {
		rows, err := s.DB().QueryContext(ctx, "EXPLAIN QUERY PLAN "+c.query, 0, 10)
		if err != nil {
			t.Fatal(err)
		}
		var plan []string
		for rows.Next() {
			var id, parent, unused int
			var detail string
			if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
				t.Fatal(err)
			}
			plan = append(plan, detail)
		}
		rows.Close()
		if p := strings.Join(plan, "; "); !strings.Contains(p, "INDEX "+c.index+" ") || strings.Contains(p, "TEMP B-TREE") {
			t.Errorf("plan of %q: %s; want %s without a sort", c.query, p, c.index)
		}
	}
}

const childEnv = "IDEM_SQLITE_TEST_CHILD"

// Reserve is atomic across real processes: several copies of this test
// binary race for the same keys on one file.
func TestCrossProcessReserve(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	t.Parallel()
	path := filepath.Join(t.TempDir(), "idem.db")
	open(t, path, sqlite.Config{}) // migrate once, so the children only race on records
	const procs = 4
	type child struct {
		cmd   *exec.Cmd
		stdin io.WriteCloser
		out   *bufio.Scanner
	}
	children := make([]child, procs)
	for i := range children {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), childEnv+"="+path)
		cmd.Stderr = os.Stderr
		stdin, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		children[i] = child{cmd: cmd, stdin: stdin, out: bufio.NewScanner(stdout)}
	}
	// Release the children together once every one has its store open.
	for _, c := range children {
		if !c.out.Scan() || c.out.Text() != "ready" {
			t.Fatalf("child did not get ready: %q %v", c.out.Text(), c.out.Err())
		}
	}
	for _, c := range children {
		c.stdin.Close()
	}
	created := map[string]int{}
	for _, c := range children {
		for c.out.Scan() {
			key, n, ok := strings.Cut(c.out.Text(), " ")
			count, err := strconv.Atoi(n)
			if !ok || err != nil {
				t.Fatalf("child said %q", c.out.Text())
			}
			created[key] += count
		}
		if err := c.cmd.Wait(); err != nil {
			t.Fatalf("child: %v", err)
		}
	}
	if len(created) != childKeys {
		t.Fatalf("children reported %d keys, want %d", len(created), childKeys)
	}
	for key, n := range created {
		if n != 1 {
			t.Errorf("key %s: %d Created across %d processes, want 1", key, n, procs)
		}
	}
}

const childKeys = 20

// reserveChild is the body of a child process of TestCrossProcessReserve:
// 16 goroutines reserve each key; it prints how many got Created per key.
func reserveChild() int {
	ctx := context.Background()
	s, err := sqlite.Open(ctx, os.Getenv(childEnv), sqlite.Config{SkipMigrate: true})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer s.Close()
	fmt.Println("ready")
	io.Copy(io.Discard, os.Stdin) // wait for the parent's go
	for k := 0; k < childKeys; k++ {
		key := fmt.Sprint("k", k)
		var wg sync.WaitGroup
		var mu sync.Mutex
		created := 0
		var firstErr error
		for g := 0; g < 16; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res, err := s.Reserve(ctx, reserveP(key, "fp", store.LeaseUnknown))
				mu.Lock()
				defer mu.Unlock()
				if err != nil && firstErr == nil {
					firstErr = err
				}
				if err == nil && res.Outcome == store.Created {
					created++
				}
			}()
		}
		wg.Wait()
		if firstErr != nil {
			fmt.Fprintln(os.Stderr, firstErr)
			return 1
		}
		fmt.Println(key, created)
	}
	return 0
}

// ":memory:" runs the whole store on its one writer connection.
func TestInMemory(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := open(t, ":memory:", sqlite.Config{})
	rec := mustReserve(t, s, reserveP("k", "fp", store.LeaseUnknown), store.Created)
	if err := s.Complete(ctx, store.CompleteParams{FenceParams: fenceOf(rec), Response: store.Response{Status: 200}}); err != nil {
		t.Fatal(err)
	}
	if got := mustReserve(t, s, reserveP("k", "fp", store.LeaseUnknown), store.Existing); got.State != store.StateCompleted {
		t.Fatalf("replay: %s", got.State)
	}
	if err := s.Ping(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestPingAfterClose(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := open(t, filepath.Join(t.TempDir(), "idem.db"), sqlite.Config{})
	if err := s.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Ping(ctx); err == nil {
		t.Fatal("Ping after Close succeeded")
	}
}

func TestOpenRejectsBadConfig(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	if _, err := sqlite.Open(ctx, "", sqlite.Config{}); err == nil {
		t.Error("Open with an empty path succeeded")
	}
	if _, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "idem.db"), sqlite.Config{BusyTimeout: -time.Second}); err == nil {
		t.Error("Open with a negative busy timeout succeeded")
	}
}

// A path with URI metacharacters names the file it says.
func TestPathWithQuestionMark(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "a?b#c%d.db")
	s := open(t, path, sqlite.Config{})
	mustReserve(t, s, reserveP("k", "fp", store.LeaseUnknown), store.Created)
	if _, err := os.Stat(path); err != nil {
		entries, _ := os.ReadDir(dir)
		t.Fatalf("database file not at %q: %v (directory holds %v)", path, err, entries)
	}
}

func TestConformanceTx(t *testing.T) {
	storetest.RunTx(t, storetest.TxHarness[*sql.Tx]{
		NewDatabase: func(t *testing.T, clock store.Clock) storetest.TxDatabase[*sql.Tx] {
			s := open(t, filepath.Join(t.TempDir(), "idem.db"), sqlite.Config{Clock: clock})
			if _, err := s.DB().ExecContext(context.Background(), businessTable); err != nil {
				t.Fatal(err)
			}
			return storetest.TxDatabase[*sql.Tx]{
				Store: s,
				Write: func(ctx context.Context, tx *sql.Tx, id string) error {
					_, err := tx.ExecContext(ctx, `INSERT INTO payments (key, amount) VALUES (?, 100)`, id)
					return err
				},
				Count: func(ctx context.Context, id string) (n int, err error) {
					err = s.DB().QueryRowContext(ctx, `SELECT count(*) FROM payments WHERE key = ?`, id).Scan(&n)
					return n, err
				},
			}
		},
	})
}
