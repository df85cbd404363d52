package postgres_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/postgres"
	"github.com/idem-go/idem/store/storetest"
)

// TestSweepPassesLockedRecord leaves a CompleteTx uncommitted past the
// record's lease and grace: the sweep must neither wait for that row's
// lock (it would hold the sweep mark until its caller's deadline, and
// sweep nothing) nor lose it. The other expired lease is swept at once,
// by a sweep of one record (the locked row does not use up its limit);
// once the transaction ends, the record is completed (commit) or swept by
// the next sweep (rollback: its lease ended and nobody completed it).
func TestSweepPassesLockedRecord(t *testing.T) {
	for name, cfg := range map[string]postgres.Config{
		"plain":       {},
		"partitioned": {Partitions: time.Hour, PartitionsAhead: 30},
	} {
		for _, commit := range []bool{true, false} {
			end := map[bool]string{true: "commit", false: "rollback"}[commit]
			t.Run(name+"/"+end, func(t *testing.T) {
				t.Parallel()
				sweepPastLockedRecord(t, cfg, commit)
			})
		}
	}
}

func sweepPastLockedRecord(t *testing.T, cfg postgres.Config, commit bool) {
	const (
		lease = time.Second
		grace = 2 * time.Second
	)
	ctx := context.Background()
	clock := storetest.NewClock()
	cfg.Clock = clock.Now
	s, _ := openSchema(t, cfg)
	reserve := func(key string) store.ReserveResult {
		t.Helper()
		p := reserveParams(key)
		p.Lease = lease
		r, err := s.Reserve(ctx, p)
		if err != nil || r.Outcome != store.Created {
			t.Fatalf("reserve %s: %v %v", key, r.Outcome, err)
		}
		return r
	}
	a := reserve("a")
	clock.Advance(time.Millisecond) // a's lease ends first
	b := reserve("b")

	tx, err := s.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := s.CompleteTx(ctx, tx, store.CompleteParams{FenceParams: fence(a), Response: okResponse()}); err != nil {
		t.Fatalf("CompleteTx a: %v", err)
	}
	clock.Advance(lease + grace + time.Second)

	sweep := func(what string) []store.Record {
		t.Helper()
		sctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		start := time.Now()
		got, err := s.SweepExpiredLeases(sctx, store.SweepParams{Limit: 1, Grace: grace})
		if err != nil {
			t.Fatalf("%s: %v after %v", what, err, time.Since(start).Round(time.Millisecond))
		}
		return got
	}
	got := sweep("sweep while a's CompleteTx is open")
	if len(got) != 1 || got[0].Key != b.Record.Key || got[0].State != store.StateUnknown {
		t.Fatalf("sweep while a's CompleteTx is open: %v, want b unknown", keys(got))
	}

	want, again := store.StateCompleted, 0
	if commit {
		err = tx.Commit(ctx)
	} else {
		err = tx.Rollback(ctx)
		want, again = store.StateUnknown, 1
	}
	if err != nil {
		t.Fatal(err)
	}
	if got := sweep("sweep after the transaction"); len(got) != again || (again == 1 && got[0].Key != a.Record.Key) {
		t.Fatalf("sweep after the transaction: %v, want %d record(s) (a)", keys(got), again)
	}
	for _, k := range []struct {
		key   string
		state store.State
	}{{a.Record.Key, want}, {b.Record.Key, store.StateUnknown}} {
		r, err := s.Get(ctx, a.Record.Scope, k.key)
		if err != nil {
			t.Fatal(err)
		}
		if r.State != k.state {
			t.Errorf("%s: %s, want %s", k.key, r.State, k.state)
		}
	}
	if got := sweep("last sweep"); len(got) != 0 {
		t.Errorf("last sweep: %v, want none", keys(got))
	}
}

func keys(recs []store.Record) []string {
	out := make([]string, len(recs))
	for i, r := range recs {
		out[i] = r.Key + ":" + string(r.State)
	}
	return out
}

// TestSweepPlanProbesKeys plans the sweep as the generic plan a connection
// keeps (planned on a fresh, empty table) and requires its lock and its
// update to reach idem_records by primary key probes only: a join to the
// lease index's range up to the cutoff, or a whole primary key scan, would
// read every record whose lease ever ended, at every pass.
func TestSweepPlanProbesKeys(t *testing.T) {
	for name, cfg := range map[string]postgres.Config{
		"plain":       {},
		"partitioned": {Partitions: time.Hour, PartitionsAhead: 24},
	} {
		t.Run(name, func(t *testing.T) {
			cfg.MaxBatches = -1
			s, schema := openSchema(t, cfg)
			ctx := context.Background()
			conn := adminConn(t)
			if _, err := conn.Exec(ctx, "SET plan_cache_mode = force_generic_plan; SET enable_seqscan = off; SET search_path = "+pgx.Identifier{schema}.Sanitize()); err != nil {
				t.Fatal(err)
			}
			sql := s.Statements()["sweep"]
			if _, err := conn.Exec(ctx, "PREPARE sweep_plan AS "+sql); err != nil {
				t.Fatal(err)
			}
			rows, err := conn.Query(ctx, "EXPLAIN EXECUTE sweep_plan"+nullArgs(sql), pgx.QueryExecModeSimpleProtocol)
			if err != nil {
				t.Fatal(err)
			}
			plan, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil {
				t.Fatal(err)
			}
			for _, cte := range []string{"locked", "swept"} {
				section := planSection(plan, cte)
				if len(section) == 0 {
					t.Fatalf("no CTE %s in the plan:\n%s", cte, strings.Join(plan, "\n"))
				}
				scans, probes := 0, 0
				for _, line := range section {
					switch {
					case strings.Contains(line, "Seq Scan"):
						scans += 1000 // reported below with the plan
					case strings.Contains(line, "Index Scan using "), strings.Contains(line, "Bitmap Index Scan on "),
						strings.Contains(line, "Index Only Scan using "):
						scans++
						if !strings.Contains(line, "_pkey ") && !strings.HasSuffix(line, "_pkey") {
							scans += 1000
						}
					case strings.Contains(line, "Index Cond:") && strings.Contains(line, "key = "):
						probes++
					}
				}
				if scans == 0 || scans != probes {
					t.Errorf("CTE %s does not probe idem_records by key only:\n%s", cte, strings.Join(section, "\n"))
				}
				// A sort above the probes would lock every due row before
				// the limit took the first ones.
				if cte == "locked" && !sortUnderLoop(section) {
					t.Errorf("CTE locked sorts after it locks:\n%s", strings.Join(section, "\n"))
				}
			}
			// The walk reads the lease index from the mark, not from its
			// first entry: with the mark and the cutoff joined in, the
			// generic plan applied them as filters, and every pass read
			// the lease of every record kept, completed ones included.
			walk := planSection(plan, "walked")
			scans, ranges := 0, 0
			for _, line := range walk {
				switch {
				case strings.Contains(line, "Seq Scan"), strings.Contains(line, "Index Scan using "),
					strings.Contains(line, "Index Only Scan using "), strings.Contains(line, "Bitmap Index Scan on "):
					scans++
				case strings.Contains(line, "Index Cond:") && strings.Contains(line, "locked_until >= "):
					ranges++
				}
			}
			if scans == 0 || scans != ranges {
				t.Errorf("CTE walked does not start its scans at the mark:\n%s", strings.Join(walk, "\n"))
			}
		})
	}
}

// planSection returns the lines of the plan's CTE name, up to the next
// CTE or the plan's end.
func planSection(plan []string, name string) []string {
	for i, line := range plan {
		if strings.TrimSpace(line) != "CTE "+name {
			continue
		}
		indent := indentOf(line)
		end := i + 1
		for end < len(plan) && indentOf(plan[end]) > indent {
			end++
		}
		return plan[i:end]
	}
	return nil
}

// sortUnderLoop reports whether every sort of the section is under its
// first nested loop.
func sortUnderLoop(section []string) bool {
	loop := -1
	for i, line := range section {
		if loop < 0 && strings.Contains(line, "Nested Loop") {
			loop = i
		}
		if strings.Contains(line, "Sort  (") && (loop < 0 || indentOf(line) <= indentOf(section[loop])) {
			return false
		}
	}
	return loop >= 0
}

func indentOf(line string) int { return len(line) - len(strings.TrimLeft(line, " ")) }
