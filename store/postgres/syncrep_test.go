package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/testkit/pgcluster"
	"github.com/idem-go/idem/internal/testkit/testenv"
	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/postgres"
)

// With a synchronous standby, a commit waits for the standby before the
// server answers. A wait that is cancelled (pg_cancel_backend, a driver's
// cancel request when a call's context ends) ends with a WARNING, and
// the server then answers the COMMIT as a success although the standby
// does not have it: a failover would lose it. The store must not report
// such a write as done, on either path of a statement (alone or batched),
// and Sync must not return while the standby has not confirmed.
//
// The test runs a private primary and synchronous standby, stops the
// standby so that every commit waits, and cancels the waits itself.
func TestCancelledStandbyWaitIsNotAcknowledged(t *testing.T) {
	pair := pgcluster.StartPair(t, true)
	for _, batched := range []bool{false, true} {
		t.Run(fmt.Sprintf("batched=%v", batched), func(t *testing.T) {
			ctx := t.Context()
			schema := fmt.Sprintf("syncrep_%v", batched)
			if out, err := pair.Primary.Psql("CREATE SCHEMA " + schema); err != nil {
				t.Fatalf("%v: %s", err, out)
			}
			// No standby watch: its checks would wait for the standby too,
			// and cancelStandbyWait must find the operation's wait alone.
			s, err := postgres.Open(ctx, pair.Primary.DSN(), postgres.Config{Schema: schema, ForceBatches: batched, MaxConns: 4,
				StandbyCheck: -1})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			first, err := s.Reserve(ctx, reserveParams("first"))
			if err != nil {
				t.Fatalf("reserve with the standby up: %v", err)
			}
			third, err := s.Reserve(ctx, reserveParams("third"))
			if err != nil {
				t.Fatalf("reserve with the standby up: %v", err)
			}
			if err := s.Sync(ctx); err != nil {
				t.Fatalf("sync with the standby up: %v", err)
			}

			pair.StopStandby(t)

			checks := []struct {
				name string
				op   func(ctx context.Context) error
			}{
				{"complete", func(ctx context.Context) error {
					return s.Complete(ctx, store.CompleteParams{FenceParams: fence(first), Response: okResponse()})
				}},
				{"reserve", func(ctx context.Context) error {
					_, err := s.Reserve(ctx, reserveParams("second"))
					return err
				}},
				{"delete", func(ctx context.Context) error {
					return s.Delete(ctx, store.DeleteParams{Scope: first.Record.Scope, Key: first.Record.Key})
				}},
				{"sync", s.Sync},
				{"complete in the caller's transaction", func(ctx context.Context) error {
					tx, err := s.Pool().Begin(ctx)
					if err != nil {
						return err
					}
					defer tx.Rollback(ctx)
					if err := s.CompleteTx(ctx, tx, store.CompleteParams{FenceParams: fence(third), Response: okResponse()}); err != nil {
						return err
					}
					return s.Commit(ctx, tx)
				}},
			}
			for _, c := range checks {
				err := cancelStandbyWait(t, pair.Primary, c.op)
				if err == nil {
					t.Errorf("%s: nil error for a commit whose wait for the standby was cancelled", c.name)
					continue
				}
				if !store.IsRetryable(err) || !strings.Contains(err.Error(), "standby") {
					t.Errorf("%s: %v, want a retryable error that names the standby", c.name, err)
				}
			}
			// A Sync whose own context ends while the standby is away
			// fails too.
			sctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			defer cancel()
			if err := s.Sync(sctx); err == nil {
				t.Errorf("sync returned nil with the standby stopped")
			}
		})
	}
}

// cancelStandbyWait runs op, waits until its commit waits for the
// synchronous standby (wait_event SyncRep), cancels that wait with
// pg_cancel_backend and returns op's error.
func cancelStandbyWait(t *testing.T, primary *pgcluster.Cluster, op func(context.Context) error) error {
	t.Helper()
	done := make(chan error, 1)
	// Bounded, so that a wait this function failed to cancel ends all the
	// same (pgx cancels it) and the store can close after a failure.
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	go func() { done <- op(ctx) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case err := <-done:
			t.Fatalf("the operation returned (%v) before its commit waited for the standby", err)
		default:
		}
		pid, err := primary.Psql("SELECT pid FROM pg_stat_activity WHERE wait_event = 'SyncRep'")
		if err != nil {
			t.Fatalf("pg_stat_activity: %v %s", err, pid)
		}
		if pid != "" && !strings.Contains(pid, "\n") {
			if out, err := primary.Psql("SELECT pg_cancel_backend(" + pid + ")"); err != nil || out != "t" {
				t.Fatalf("pg_cancel_backend(%s): %q %v", pid, out, err)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no commit waited for the standby within 30s (pids %q)", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
	select {
	case err := <-done:
		return err
	case <-time.After(30 * time.Second):
		t.Fatal("the operation did not return within 30s of the cancellation")
		return errors.New("unreachable")
	}
}

// TestLostCompletionIsConfirmedByTheStandby: the engine's Complete waits
// for the stopped standby, and the wait ends without the standby: the
// backend is terminated, or the call's store timeout passes and pgx
// cancels the statement. Either way the server keeps the commit, visible,
// and the engine's retry finds the record completed by its own lost
// attempt; with the standby still away, that read must not count as the
// answer stored.
func TestLostCompletionIsConfirmedByTheStandby(t *testing.T) {
	pair := pgcluster.StartPair(t, true)
	for _, c := range []struct {
		name    string
		timeout time.Duration
		end     func(primary *pgcluster.Cluster) error
	}{
		{"terminated", 2 * time.Second, terminateStandbyWait},
		{"timed out", 500 * time.Millisecond, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := t.Context()
			schema := "syncrep_" + strings.ReplaceAll(c.name, " ", "_")
			if out, err := pair.Primary.Psql("CREATE SCHEMA " + schema); err != nil {
				t.Fatalf("%v: %s", err, out)
			}
			s, err := postgres.Open(ctx, pair.Primary.DSN(), postgres.Config{Schema: schema, MaxConns: 4})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			var logs testenv.Buffer
			e, err := idem.New(s, idem.Config{Logger: slog.New(slog.NewTextHandler(&logs, nil)),
				Lease: 3 * time.Second, StoreTimeout: c.timeout})
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := pair.Standby.Start(); err != nil {
					t.Fatalf("restarting the standby: %v\n%s", err, pair.Standby.Log())
				}
				pair.WaitStreaming(t, 60*time.Second)
			}()

			ended := make(chan error, 1)
			call := idem.Call{Method: "POST", Route: "/v1/charges", Keys: []string{`"lost-completion"`}, Body: []byte(`{"amount":1}`)}
			a := e.Run(ctx, call, func(context.Context) idem.Result {
				// The operation ran; the standby goes away before its
				// answer is stored.
				if err := pair.Standby.Stop(); err != nil {
					t.Error(err)
				}
				if c.end == nil {
					ended <- nil
				} else {
					go func() { ended <- c.end(pair.Primary) }()
				}
				return idem.Result{Response: store.Response{Status: 201, Body: []byte(`{"id":"ch_1"}`)}}
			})
			if err := <-ended; err != nil {
				t.Fatal(err)
			}
			if a.Verdict != idem.Executed {
				t.Fatalf("verdict %v, want executed", a.Verdict)
			}
			log := logs.String()
			if strings.Contains(log, "outcome recorded after retries") || !a.Expires.IsZero() {
				t.Errorf("the answer was taken as stored (expires %v) while the standby had not confirmed it:\n%s", a.Expires, log)
			}
			if !strings.Contains(log, "could not confirm that the outcome is stored durably") {
				t.Errorf("no error says the outcome could not be confirmed durable:\n%s", log)
			}
		})
	}
}

// terminateStandbyWait waits until one backend of primary waits for the
// synchronous standby and terminates it.
func terminateStandbyWait(primary *pgcluster.Cluster) error {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		// Not the standby watch's checks, which wait for the standby too.
		pid, err := primary.Psql("SELECT pid FROM pg_stat_activity WHERE wait_event = 'SyncRep' AND query NOT LIKE '%pg_logical_emit_message%'")
		if err != nil {
			return fmt.Errorf("pg_stat_activity: %v %s", err, pid)
		}
		if pid != "" && !strings.Contains(pid, "\n") {
			if out, err := primary.Psql("SELECT pg_terminate_backend(" + pid + ")"); err != nil || out != "t" {
				return fmt.Errorf("pg_terminate_backend(%s): %q %v", pid, out, err)
			}
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return errors.New("no commit waited for the standby within 30s")
}

// TestReplayWaitsForTheStandby: the standby stops, and a Complete whose
// store timeout passes while it waits for it is cancelled by pgx: the
// server keeps the commit and shows it, the standby does not have it.
// Another process must not replay that record until the standby confirmed
// it; once the standby is back, the replay is answered.
func TestReplayWaitsForTheStandby(t *testing.T) {
	pair := pgcluster.StartPair(t, true)
	ctx := t.Context()
	if out, err := pair.Primary.Psql("CREATE SCHEMA syncrep_replay"); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	open := func() *postgres.Store {
		s, err := postgres.Open(ctx, pair.Primary.DSN(), postgres.Config{Schema: "syncrep_replay", MaxConns: 4,
			StandbyCheck: 200 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	a, b := open(), open() // two processes
	res, err := a.Reserve(ctx, reserveParams("visible-early"))
	if err != nil {
		t.Fatal(err)
	}
	if err := pair.Standby.Stop(); err != nil {
		t.Fatal(err)
	}
	restarted := false
	defer func() {
		if !restarted {
			pair.Standby.Start()
		}
	}()
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	err = a.Complete(cctx, store.CompleteParams{FenceParams: fence(res), Response: okResponse()})
	cancel()
	if err == nil {
		t.Fatal("a Complete whose commit waited for the stopped standby returned nil")
	}
	// The server kept the commit and shows it (a reader outside the store).
	if out, err := pair.Primary.Psql("SELECT state FROM syncrep_replay.idem_records WHERE key = 'visible-early'"); err != nil || out != "completed" {
		t.Fatalf("the cancelled commit is not visible on the primary: %q %v", out, err)
	}
	if d, err := b.CheckDurability(ctx); err != nil || !strings.Contains(strings.Join(d.Warnings, " "), "stopped confirming") {
		t.Errorf("durability with the standby stopped: %+v %v, want a warning that it stopped confirming", d, err)
	}
	for _, s := range []*postgres.Store{b, a} {
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		got, err := s.Reserve(rctx, reserveParams("visible-early"))
		cancel()
		if err == nil {
			t.Fatalf("replayed a record the standby does not have: %+v", got.Record.State)
		}
		if !strings.Contains(err.Error(), "standby") {
			t.Errorf("reserve: %v, want an error that names the standby", err)
		}
		rctx, cancel = context.WithTimeout(ctx, time.Second)
		_, err = s.Get(rctx, res.Record.Scope, res.Record.Key)
		cancel()
		if err == nil {
			t.Errorf("get answered a completed record the standby does not have")
		}
	}

	if err := pair.Standby.Start(); err != nil {
		t.Fatalf("restarting the standby: %v\n%s", err, pair.Standby.Log())
	}
	restarted = true
	pair.WaitStreaming(t, 60*time.Second)
	got, err := b.Reserve(ctx, reserveParams("visible-early"))
	if err != nil || got.Outcome != store.Existing || got.Record.State != store.StateCompleted {
		t.Fatalf("replay once the standby is back: %+v %v", got, err)
	}
}
