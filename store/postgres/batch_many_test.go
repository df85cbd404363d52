package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/postgres"
)

// The first Reserve of each key in a batch rides in one multi-row
// statement; every call gets what the single statement would have given it
// had the calls run one after the other: repeats of a key see the winner's
// new row (in progress), a completed record is replayed from the batch, and
// a record that needs a rewrite (a released one, reclaimed) runs alone.
func TestBatchMultiRowReserve(t *testing.T) {
	s, schema := openSchema(t, postgres.Config{MaxBatches: 1})
	ctx := context.Background()

	reserve := func(key string) store.ReserveResult {
		t.Helper()
		res, err := s.Reserve(ctx, reserveParams(key))
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	done := reserve("done")
	if err := s.Complete(ctx, completeParams("done", done.Record.Fence)); err != nil {
		t.Fatal(err)
	}
	failed := reserve("failed")
	if err := s.Release(ctx, store.ReleaseParams{FenceParams: fence(failed), Error: "boom"}); err != nil {
		t.Fatal(err)
	}
	busy := reserve("busy")

	other := func(key string) store.ReserveParams {
		p := reserveParams(key)
		p.Fingerprint = "another request"
		return p
	}
	calls := []store.ReserveParams{
		reserveParams("n1"), reserveParams("n2"), reserveParams("n3"), reserveParams("n3"),
		other("n3"), reserveParams("n2"), reserveParams("done"), other("done"),
		reserveParams("failed"), reserveParams("busy"), other("busy"), reserveParams("n4"),
	}
	manyBefore := s.BatchMany()
	release := holdSlot(t, s, schema, "blocker")
	var wg sync.WaitGroup
	results := make([]store.ReserveResult, len(calls))
	errs := make([]error, len(calls))
	for i, p := range calls {
		wg.Go(func() { results[i], errs[i] = s.Reserve(ctx, p) })
		waitQueue(t, s, 0, i+1)
	}
	release()
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("reserve %d (%s): %v", i, calls[i].Key, err)
		}
	}
	if got := s.BatchMany() - manyBefore; got < 1 {
		t.Fatalf("%d multi-row statements; the queued reserves should have shared one", got)
	}

	// New keys: exactly one call per key acquires it (the first queued),
	// the others find its record in progress.
	winner := map[string]store.ReserveResult{}
	for i, p := range calls {
		if p.Key[0] != 'n' {
			continue
		}
		r := results[i]
		if _, seen := winner[p.Key]; !seen {
			if r.Outcome != store.Created || r.Record.State != store.StateInProgress || r.Record.Fingerprint != p.Fingerprint {
				t.Errorf("first reserve of %s: %+v", p.Key, r)
			}
			winner[p.Key] = r
			continue
		}
		w := winner[p.Key]
		if r.Outcome != store.Existing || r.Record.State != store.StateInProgress ||
			r.Record.Fence != w.Record.Fence || r.Record.Fingerprint != w.Record.Fingerprint {
			t.Errorf("repeated reserve %d of %s: %+v, want the winner's record %+v", i, p.Key, r, w.Record)
		}
	}
	for i, p := range calls {
		r := results[i]
		switch p.Key {
		case "done":
			if r.Outcome != store.Existing || r.Record.State != store.StateCompleted || r.Record.Response == nil ||
				string(r.Record.Response.Body) != "done" || r.Record.Fingerprint != "fp-done" {
				t.Errorf("reserve %d of a completed key: %+v", i, r)
			}
		case "failed":
			if r.Outcome != store.Reclaimed || r.Record.Fence <= failed.Record.Fence || r.Record.Attempts != 2 {
				t.Errorf("reserve of a released key: %+v", r)
			}
		case "busy":
			if r.Outcome != store.Existing || r.Record.State != store.StateInProgress || r.Record.Fence != busy.Record.Fence {
				t.Errorf("reserve %d of a key in progress: %+v", i, r)
			}
		}
	}
	// What the batch wrote is what Get reads.
	for k, w := range winner {
		rec, err := s.Get(ctx, w.Record.Scope, k)
		if err != nil || rec.Fence != w.Record.Fence || rec.State != store.StateInProgress || !rec.CreatedAt.Equal(w.Record.CreatedAt) {
			t.Errorf("get %s: %+v, %v; reserve returned %+v", k, rec, err, w.Record)
		}
	}
}

// Many goroutines reserve and complete a handful of keys at once, so that
// batches form with the same key several times in them: each key is
// acquired exactly once, and every other call finds that execution's
// record, in progress or completed with its answer.
func TestBatchMultiRowConcurrent(t *testing.T) {
	s, _ := openSchema(t, postgres.Config{MaxBatches: 1})
	ctx := context.Background()
	const (
		goroutines = 48
		keys       = 6
		rounds     = 5
	)
	for round := range rounds {
		var mu sync.Mutex
		created := map[string]int64{} // key -> fence of the execution that acquired it
		var seen []store.ReserveResult
		var wg sync.WaitGroup
		for g := range goroutines {
			wg.Go(func() {
				k := fmt.Sprintf("r%d-k%d", round, g%keys)
				res, err := s.Reserve(ctx, reserveParams(k))
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				if res.Outcome.Acquired() {
					if _, dup := created[k]; dup {
						t.Errorf("key %s acquired twice", k)
					}
					created[k] = res.Record.Fence
				} else {
					seen = append(seen, res)
				}
				mu.Unlock()
				if res.Outcome.Acquired() {
					if err := s.Complete(ctx, completeParams(k, res.Record.Fence)); err != nil {
						t.Errorf("complete %s: %v", k, err)
					}
				}
			})
		}
		wg.Wait()
		if len(created) != keys {
			t.Fatalf("round %d: %d keys acquired, want %d", round, len(created), keys)
		}
		for _, r := range seen {
			f, ok := created[r.Record.Key]
			if r.Outcome != store.Existing || !ok || r.Record.Fence != f {
				t.Errorf("round %d: %+v; the key was acquired with fence %d", round, r, f)
				continue
			}
			switch r.Record.State {
			case store.StateInProgress:
			case store.StateCompleted:
				if r.Record.Response == nil || string(r.Record.Response.Body) != r.Record.Key {
					t.Errorf("round %d: completed record without its answer: %+v", round, r)
				}
			default:
				t.Errorf("round %d: state %s", round, r.Record.State)
			}
		}
	}
	if batched, _ := s.BatchStats(); batched == 0 {
		t.Log("no batch formed (the machine ran the calls one at a time)")
	}
}

// The multi-row reserve stores each call's tenant, as the single
// statement does: records reserved in a batch count against a later cap.
func TestBatchMultiRowReserveKeepsTenant(t *testing.T) {
	s, schema := openSchema(t, postgres.Config{MaxBatches: 1, TenantCap: true})
	ctx := context.Background()
	tenant := func(key string, max int) store.ReserveParams {
		p := reserveParams(key)
		p.Tenant, p.MaxActive = "acme", max
		return p
	}
	manyBefore := s.BatchMany()
	release := holdSlot(t, s, schema, "blocker")
	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i := range errs {
		wg.Go(func() { _, errs[i] = s.Reserve(ctx, tenant(fmt.Sprint("k", i), 0)) })
		waitQueue(t, s, 0, i+1)
	}
	release()
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("reserve k%d: %v", i, err)
		}
	}
	if got := s.BatchMany() - manyBefore; got < 1 {
		t.Fatalf("%d multi-row statements; the queued reserves should have shared one", got)
	}
	if _, err := s.Reserve(ctx, tenant("k3", 3)); !errors.Is(err, store.ErrOverCap) {
		t.Fatalf("a fourth record under a cap of 3, after three batched ones: %v, want ErrOverCap", err)
	}
}

// The multi-row statements find each record by a primary key probe even
// in a generic plan made while the table is new and empty (as a service's
// first requests find it), which a connection keeps for its life: a join
// planned for a table of a few pages would scan the whole table at every
// batch once it has grown.
func TestMultiRowPlansProbeTheKey(t *testing.T) {
	_, schema := openSchema(t, postgres.Config{}) // migrates the new schema
	ctx := context.Background()
	conn := adminConn(t)
	// As in a batch: the statement that opens it turns sequential scans
	// off (sqlBatchLockTimeout).
	if _, err := conn.Exec(ctx, "SET plan_cache_mode = force_generic_plan; SET enable_seqscan = off"); err != nil {
		t.Fatal(err)
	}
	for _, st := range []struct{ name, types, sql, args string }{
		{"reserve", "text[], text[], text[], bigint[], bigint[], text[], timestamptz[], text[], bigint[]", postgres.SQLReserveMany,
			`'{s,s}', '{a,b}', '{f,f}', '{1,1}', '{1,1}', '{unknown,unknown}', '{NULL,NULL}', '{"",""}', '{1,2}'`},
		{"complete", "text[], text[], bigint[], timestamptz[], integer[], text[], bytea[], boolean[], bigint[]", postgres.SQLCompleteMany,
			`'{s}', '{a}', '{1}', '{NULL}', '{200}', '{NULL}', '{x}', '{f}', '{1}'`},
	} {
		if _, err := conn.Exec(ctx, fmt.Sprintf("PREPARE many_%s(%s) AS %s", st.name, st.types, postgres.Filled(st.sql, schema))); err != nil {
			t.Fatalf("prepare %s: %v", st.name, err)
		}
		var plan strings.Builder
		rows, err := conn.Query(ctx, fmt.Sprintf("EXPLAIN EXECUTE many_%s(%s)", st.name, st.args), pgx.QueryExecModeSimpleProtocol)
		if err != nil {
			t.Fatalf("explain %s: %v", st.name, err)
		}
		for rows.Next() {
			var line string
			if err := rows.Scan(&line); err != nil {
				t.Fatal(err)
			}
			plan.WriteString(line + "\n")
		}
		if err := rows.Err(); err != nil {
			t.Fatalf("explain %s: %v", st.name, err)
		}
		if strings.Contains(plan.String(), "Seq Scan on idem_records") {
			t.Errorf("the generic plan of the multi-row %s scans the table:\n%s", st.name, plan.String())
		}
	}
}
