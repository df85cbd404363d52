package main

import (
	"bytes"
	"context"
	"fmt"
	neturl "net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem/internal/testkit/testenv"
)

// parse reads the report: lines of a name and name=value pairs, every
// value a number but stage and op.
func parse(t *testing.T, out string) map[string]map[string]float64 {
	t.Helper()
	got := map[string]map[string]float64{}
	for line := range strings.Lines(out) {
		f := strings.Fields(line)
		if len(f) < 2 {
			t.Fatalf("report line %q: no values", line)
		}
		name, vals := f[0], map[string]float64{}
		for _, kv := range f[1:] {
			k, v, ok := strings.Cut(kv, "=")
			if !ok {
				t.Fatalf("report line %q: %q is not name=value", line, kv)
			}
			if k == "stage" || k == "op" {
				name += "/" + v
				continue
			}
			x, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("report line %q: %s: %v", line, k, err)
			}
			vals[k] = x
		}
		if w, ok := vals["workers"]; ok {
			name += "/" + strconv.Itoa(int(w))
		}
		got[name] = vals
	}
	return got
}

// privateDB creates a database for the test, dropped when it ends, and
// returns url naming it. VACUUM of a table is held back only by the
// snapshots of its own database's sessions: there, no other test's.
func privateDB(t *testing.T, url string) string {
	t.Helper()
	ctx := context.Background()
	u, err := neturl.Parse(url)
	if err != nil || u.Scheme != "postgres" && u.Scheme != "postgresql" {
		t.Fatalf("%s: want a postgres:// URL (%v)", testenv.PostgresEnv, err)
	}
	admin, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	name := testenv.Name("scalebench_")
	ident := pgx.Identifier{name}.Sanitize()
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+ident+" TEMPLATE template0"); err != nil {
		admin.Close(ctx)
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := admin.Exec(ctx, "DROP DATABASE "+ident+" WITH (FORCE)"); err != nil {
			t.Errorf("drop database %s: %v", name, err)
		}
		admin.Close(ctx)
	})
	u.Path = "/" + name
	return u.String()
}

// TestSmoke runs a small bench on the plain table and on a partitioned
// one: the reaper removes the first of three days in both, leaving dead
// tuples behind on the plain table and none on the partitioned one (it
// drops the day's partition). It runs in a database of its own, where
// VACUUM can remove those dead tuples.
func TestSmoke(t *testing.T) {
	url := privateDB(t, testenv.PostgresURL(t))
	for _, partitioned := range []bool{false, true} {
		t.Run(fmt.Sprint("partitioned=", partitioned), func(t *testing.T) {
			var out bytes.Buffer
			o := options{url: url, n: 2000, chunk: 1000, days: 3, rounds: 1, slice: 100 * time.Millisecond, workers: 2, batch: 100,
				partitioned: partitioned}
			if err := run(context.Background(), o, &out); err != nil {
				t.Fatal(err)
			}
			checkSmoke(t, parse(t, out.String()), out.String(), partitioned)
		})
	}
}

// TestSmokeVersus runs -versus small: both tables reaped, the partitioned
// one with no dead tuples left.
func TestSmokeVersus(t *testing.T) {
	url := testenv.PostgresURL(t)
	var out bytes.Buffer
	o := options{url: url, n: 1500, chunk: 1000, days: 3, rounds: 1, slice: 50 * time.Millisecond, workers: 2, batch: 100, versus: true}
	if err := run(context.Background(), o, &out); err != nil {
		t.Fatal(err)
	}
	r := parse(t, out.String())
	for _, name := range []string{"fill/plain", "fill/partitioned", "latency/replay/2", "reap/plain", "reap/partitioned",
		"size/plain_reaped", "size/partitioned_reaped", "size/plain_next_day", "size/partitioned_next_day"} {
		if r[name] == nil {
			t.Errorf("report has no %s:\n%s", name, out.String())
		}
	}
	if l := r["latency/replay/2"]; l["plain_ops"] == 0 || l["partitioned_ops"] == 0 {
		t.Errorf("replay latencies %v", l)
	}
	for _, table := range []string{"plain", "partitioned"} {
		if d := r["reap/"+table]["deleted"]; d < 450 || d > 550 {
			t.Errorf("reaper deleted %v records of the %s table, want about 500", d, table)
		}
	}
	// As in checkSmoke: the latency slices' own dead versions count too.
	if d, deleted := r["size/partitioned_reaped"]["dead_tup"], r["reap/partitioned"]["deleted"]; d >= deleted/2 {
		t.Errorf("%v dead tuples in the partitioned table after the reaper deleted %v records", d, deleted)
	}
}

func checkSmoke(t *testing.T, r map[string]map[string]float64, out string, partitioned bool) {
	for _, name := range []string{"fill/large", "size/large", "fill/empty", "checkpoint", "latency/new/2", "latency/new/1",
		"latency/replay/2", "latency/replay/1", "latency/replay-recent/2", "latency/replay-recent/1",
		"latency/get/2", "latency/get/1", "reap",
		"size/reaped", "vacuum", "size/vacuumed", "fill/next_day", "size/next_day"} {
		if r[name] == nil {
			t.Errorf("report has no %s:\n%s", name, out)
		}
	}
	// The first day of three: records 0..666 expire within 8h.
	if d := r["reap"]["deleted"]; d < 600 || d > 700 {
		t.Errorf("reaper deleted %v records, want about 667", d)
	}
	for _, name := range []string{"latency/replay/1", "latency/replay-recent/1"} {
		if l := r[name]; l["large_ops"] == 0 || l["empty_ops"] == 0 || l["p50_ratio"] <= 0 {
			t.Errorf("%s: %v", name, l)
		}
	}
	// The plain reaper leaves one dead tuple per record it deleted, the
	// partitioned one none. The latency slices' completions leave dead
	// versions of their own, as many as the slices ran on this machine
	// (86 where 667 records were reaped, in one run beside other tests):
	// half the deleted count tells the two apart whatever the machine's
	// speed. The tool reads them once its stores' connections have exited
	// and so reported them.
	deleted, dead := r["reap"]["deleted"], r["size/reaped"]["dead_tup"]
	if (partitioned && dead >= deleted/2) || (!partitioned && dead < deleted) {
		t.Errorf("dead tuples after the reaper %v", r["size/reaped"])
	}
	// VACUUM leaves the dead tuples an older snapshot may still see, and
	// counts them: none unless a session held them back (in the test's own
	// database, at most an autovacuum worker).
	if left, held := r["size/vacuumed"]["dead_tup"], r["vacuum"]["held_by"]; left != 0 && held == 0 {
		t.Errorf("%v dead tuples after VACUUM, and no session held them back: %v", left, r["size/vacuumed"])
	} else if left != 0 {
		t.Logf("%v dead tuples after VACUUM, held back by %v sessions", left, held)
	}
	if partitioned && r["size/large"]["tables"] < 4 {
		t.Errorf("the partitioned table has %v partitions, want one per day and more", r["size/large"]["tables"])
	}
}

func TestRunRefusesBadOptions(t *testing.T) {
	for _, o := range []options{
		{n: 10, chunk: 1, days: 0, rounds: 1, slice: time.Second, workers: 1, batch: 1},
		{n: 2, chunk: 1, days: 3, rounds: 1, slice: time.Second, workers: 1, batch: 1},
		{n: 10, chunk: 1, days: 3, rounds: 1, slice: 0, workers: 1, batch: 1},
		{n: 10, chunk: 1, days: 3, rounds: 1, slice: time.Second, workers: 0, batch: 1},
	} {
		if err := run(context.Background(), o, &bytes.Buffer{}); err == nil {
			t.Errorf("run(%+v) = nil, want an error", o)
		}
	}
}

// TestPicks: replays draw from the later half of the fill, recent ones
// from its last 1%, and on a table of fewer than 100 records from its
// last record.
func TestPicks(t *testing.T) {
	for range 1000 {
		if i := later(1000); i < 500 || i >= 1000 {
			t.Fatalf("later(1000) = %d, want 500..999", i)
		}
		if i := recent(1000); i < 990 || i >= 1000 {
			t.Fatalf("recent(1000) = %d, want 990..999", i)
		}
		if i := recent(50); i != 49 {
			t.Fatalf("recent(50) = %d, want 49", i)
		}
	}
}

// TestKeys checks that the fill's SQL makes the keys keyOf names, in both
// layouts, that ordered keys sort as their records were created and new
// ones after them all, and that a small run with ordered keys completes:
// its replays find the fill's records by keyOf.
func TestKeys(t *testing.T) {
	url := testenv.PostgresURL(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	defer func() { orderedKeys = false }()
	for _, ordered := range []bool{false, true} {
		orderedKeys = ordered
		prev := ""
		for _, i := range []int{0, 1, 9, 10, 255, 256, 99_999, 10_000_000, 1 << 40} {
			var got string
			if err := conn.QueryRow(ctx, "SELECT "+sqlKey[ordered]+" FROM (SELECT $1::bigint AS i) AS s", i).Scan(&got); err != nil {
				t.Fatal(err)
			}
			if want := keyOf(i); got != want || len(got) != 36 {
				t.Errorf("ordered=%v, record %d: SQL makes %q, keyOf %q", ordered, i, got, want)
			}
			if ordered && got <= prev {
				t.Errorf("ordered key of %d (%s) sorts before the one before it (%s)", i, got, prev)
			}
			prev = got
		}
		if ordered && newKey() <= keyOf(1<<39) {
			t.Error("a new ordered key sorts before a record's")
		}
	}

	var out bytes.Buffer
	o := options{url: url, n: 1200, chunk: 1000, days: 3, rounds: 1, slice: 50 * time.Millisecond, workers: 2, batch: 100, keys: "ordered"}
	if err := run(ctx, o, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "latency op=replay-recent") {
		t.Errorf("no replays in the report:\n%s", out.String())
	}
	if err := run(ctx, options{url: url, n: 10, chunk: 10, days: 1, rounds: 1, slice: time.Millisecond, workers: 1, batch: 1, keys: "v4"}, &out); err == nil {
		t.Error("-keys v4 was accepted")
	}
}
