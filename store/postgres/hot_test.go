package postgres_test

import (
	"context"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/postgres"
)

// TestHOTCompletion completes new keys as the engine does (an answer of
// the size the proxy stores for a small JSON API) and reads what
// PostgreSQL counted: at least 90% of the completions must be heap-only
// updates, and the index entries written per new key (read from the
// index pages, so that nothing is taken on trust) at most one per index
// a new row enters. Batched and alone, with the tenant cap off (the
// default) and on (where completions rewrite the cap's entry).
func TestHOTCompletion(t *testing.T) {
	for _, c := range []struct {
		name       string
		cfg        postgres.Config
		minHOT     float64
		maxEntries float64
	}{
		{"alone", postgres.Config{MaxBatches: -1}, 0.9, 4},
		{"batched", postgres.Config{ForceBatches: true}, 0.9, 4},
		// Partitioned by retention: no index on reap_after.
		{"partitioned", postgres.Config{MaxBatches: -1, Partitions: 24 * time.Hour}, 0.9, 3},
		{"partitioned, batched", postgres.Config{ForceBatches: true, Partitions: 24 * time.Hour}, 0.9, 3},
		// The cap keeps each active record's tenant in an index: its
		// completions are ordinary updates, as the documentation says.
		{"tenant cap", postgres.Config{MaxBatches: -1, TenantCap: true}, 0, 9},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			hot, entries := completeNewKeys(t, c.cfg, 300)
			t.Logf("%s: %.0f%% of completions HOT, %.2f index entries per new key", c.name, hot*100, entries)
			if hot < c.minHOT {
				t.Errorf("%.0f%% of completions HOT, want at least %.0f%%", hot*100, c.minHOT*100)
			}
			if entries > c.maxEntries {
				t.Errorf("%.2f index entries per new key, want at most %.0f", entries, c.maxEntries)
			}
			if c.cfg.TenantCap && hot > 0.5 {
				t.Errorf("%.0f%% of completions HOT with the cap's index maintained: the test does not see the index", hot*100)
			}
		})
	}
}

// completeNewKeys reserves and completes n new keys on a fresh schema and
// returns the share of completions PostgreSQL made heap-only and the index
// entries per key.
func completeNewKeys(t *testing.T, cfg postgres.Config, n int) (hot, entriesPerKey float64) {
	ctx := context.Background()
	s, schema := openSchema(t, cfg)
	conn := adminConn(t)
	// Autovacuum would remove index entries of dead row versions and
	// hide them from the count (on each partition of a partitioned table).
	rows, err := conn.Query(ctx, `SELECT oid::regclass::text FROM pg_class WHERE oid IN (`+leaves+`)`, schema)
	if err != nil {
		t.Fatal(err)
	}
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	for _, table := range tables {
		if _, err := conn.Exec(ctx, "ALTER TABLE "+table+" SET (autovacuum_enabled = false)"); err != nil {
			t.Fatal(err)
		}
	}
	resp := store.Response{Status: 201, Header: http.Header{
		"Content-Type": {"application/json"}, "Location": {"/payments/pay_0000000000000001"},
		"X-Request-Id": {"5f0c2a8e-4b1d-4c59-9a53-2d7f0b1e6c41"},
	}, Body: []byte(`{"id":"pay_0000000000000001","amount":1250,"currency":"EUR","status":"succeeded"}`)}
	for i := range n {
		p := reserveParams(fmt.Sprintf("key-%06d", i))
		p.Tenant = "tenant-a"
		r, err := s.Reserve(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		err = s.Complete(ctx, store.CompleteParams{FenceParams: fence(r), Response: resp, TTL: 24 * time.Hour})
		if err != nil {
			t.Fatal(err)
		}
	}
	// Every backend of the pool reports its counts when it is next idle:
	// wait for all of them.
	var ins, upd, hotUpd int64
	for deadline := time.Now().Add(30 * time.Second); ; {
		err := conn.QueryRow(ctx, `SELECT coalesce(sum(n_tup_ins), 0), coalesce(sum(n_tup_upd), 0), coalesce(sum(n_tup_hot_upd), 0)
			FROM pg_stat_user_tables
			WHERE relid IN (`+leaves+`)`,
			schema).Scan(&ins, &upd, &hotUpd)
		if err != nil {
			t.Fatal(err)
		}
		if ins >= int64(n) && upd >= int64(n) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("statistics: %d inserts and %d updates reported, want %d of each", ins, upd, n)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if ins != int64(n) || upd != int64(n) {
		t.Fatalf("%d inserts and %d updates for %d new keys, want one of each per key", ins, upd, n)
	}
	return float64(hotUpd) / float64(upd), float64(indexEntries(t, conn, schema)) / float64(n)
}

// leaves selects the tables that hold the rows of the schema $1's
// idem_records: itself, or its partitions.
const leaves = `SELECT c.oid FROM pg_class c WHERE c.relkind = 'r' AND (c.oid = (quote_ident($1) || '.idem_records')::regclass
	OR c.oid IN (SELECT relid FROM pg_partition_tree((quote_ident($1) || '.idem_records')::regclass)))`

// indexEntries counts the heap pointers on the leaf pages of every index
// of the schema's idem_records, or of its partitions (a deduplicated
// posting list holds several), with pageinspect.
func indexEntries(t *testing.T, conn *pgx.Conn, schema string) int64 {
	t.Helper()
	ctx := context.Background()
	// Parallel tests may create it at once: one of them fails on the
	// catalog's unique index, and finds it there.
	if _, err := conn.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pageinspect"); err != nil {
		var ok bool
		if qerr := conn.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_extension WHERE extname = 'pageinspect')").Scan(&ok); qerr != nil || !ok {
			t.Fatal(err)
		}
	}
	var total int64
	err := conn.QueryRow(ctx, `
		SELECT coalesce(sum(CASE WHEN i.tids IS NOT NULL THEN cardinality(i.tids) ELSE 1 END), 0)
		FROM pg_index x
		JOIN pg_class c ON c.oid = x.indexrelid
		CROSS JOIN LATERAL generate_series(1, pg_relation_size(c.oid) / current_setting('block_size')::int - 1) AS b(blkno)
		CROSS JOIN LATERAL bt_page_stats(c.oid::regclass::text, b.blkno::int) AS st
		CROSS JOIN LATERAL bt_page_items(c.oid::regclass::text, b.blkno::int) AS i
		WHERE x.indrelid IN (`+leaves+`)
			AND st.type = 'l'
			AND i.htid IS NOT NULL
			AND NOT (st.btpo_next <> 0 AND i.itemoffset = 1)`, schema).Scan(&total)
	if err != nil {
		t.Fatal(err)
	}
	return total
}

// TestStatementsProbeOrRangeScan plans every statement of the store, as
// the generic plan a connection keeps (planned on a fresh, empty table: a
// service's first requests), and requires each to reach idem_records
// through an index: a key probe or a range scan, never a sequential scan.
func TestStatementsProbeOrRangeScan(t *testing.T) {
	for name, cfg := range map[string]postgres.Config{
		"TenantCap=false":            {},
		"TenantCap=true":             {TenantCap: true},
		"Partitions":                 {Partitions: time.Hour, PartitionsAhead: 24},
		"Partitions, TenantCap=true": {Partitions: time.Hour, PartitionsAhead: 24, TenantCap: true},
	} {
		t.Run(name, func(t *testing.T) {
			cfg.MaxBatches = -1
			s, schema := openSchema(t, cfg)
			ctx := context.Background()
			conn := adminConn(t)
			if _, err := conn.Exec(ctx, "SET plan_cache_mode = force_generic_plan; SET search_path = "+pgx.Identifier{schema}.Sanitize()); err != nil {
				t.Fatal(err)
			}
			for name, sql := range s.Statements() {
				if cfg.Partitions > 0 && partitionScans[name] {
					continue
				}
				checkPlan(t, conn, name, sql, seqScanOff[name])
			}
			for name, p := range map[string]store.ListParams{
				"list":            {Limit: 10},
				"list by key":     {Key: "k", Limit: 10},
				"list by state":   {State: store.StateUnknown, Limit: 10},
				"list by prefix":  {ScopePrefix: "t/", Limit: 10},
				"list after":      {After: &store.Cursor{CreatedAt: time.Now(), Scope: "s", Key: "k"}, Limit: 10},
				"list key, after": {Key: "k", After: &store.Cursor{CreatedAt: time.Now(), Scope: "s", Key: "k"}, Limit: 10},
			} {
				checkPlan(t, conn, name, postgres.ListSQL(p), true)
			}
		})
	}
}

// seqScanOff names the statements the store runs with sequential scans
// off: in a batch (sqlBatchLockTimeout) or after sqlNoSeqScan. The others,
// a request's own, must find their index whatever the planner's settings.
var seqScanOff = map[string]bool{
	"reserveMany": true, "completeMany": true, "sweep": true, "reapDelete": true, "reapSoft": true,
	"reapAbandon": true, "listUnknown": true, "claim": true, "expirePending": true,
	"reapDefault": true, "abandonDefault": true,
}

// partitionScans names the statements that read a partitioned table
// whole, by design: the retirement's abandon reads the partition it
// retires (which it then drops), and soft reaping, the only user there of
// the plain table's reaper statements, walks reap_after, which no index of
// a partitioned table holds (docs/postgres-production.md).
var partitionScans = map[string]bool{
	"reapAbandonIn": true, "reapDelete": true, "reapSoft": true, "reapAbandon": true,
}

var paramRe = regexp.MustCompile(`\$(\d+)`)

// nullArgs is the argument list that executes the prepared sql with every
// parameter NULL: "" when it has none.
func nullArgs(sql string) string {
	n := 0
	for _, m := range paramRe.FindAllStringSubmatch(sql, -1) {
		var v int
		fmt.Sscan(m[1], &v)
		n = max(n, v)
	}
	if n == 0 {
		return ""
	}
	return "(" + strings.TrimSuffix(strings.Repeat("NULL, ", n), ", ") + ")"
}

// checkPlan prepares sql and explains its generic plan with every
// parameter NULL, with sequential scans off when the store runs it so.
func checkPlan(t *testing.T, conn *pgx.Conn, name, sql string, noSeqScan bool) {
	t.Helper()
	ctx := context.Background()
	stmt := "plan_" + strings.NewReplacer(" ", "_", ",", "").Replace(name)
	if _, err := conn.Exec(ctx, "DEALLOCATE ALL"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "PREPARE "+stmt+" AS "+sql); err != nil {
		t.Fatalf("prepare %s: %v", name, err)
	}
	explain := "EXPLAIN EXECUTE " + stmt + nullArgs(sql)
	seq := "on"
	if noSeqScan {
		seq = "off"
	}
	if _, err := conn.Exec(ctx, "SET enable_seqscan = "+seq); err != nil {
		t.Fatal(err)
	}
	rows, err := conn.Query(ctx, explain, pgx.QueryExecModeSimpleProtocol)
	if err != nil {
		t.Fatalf("explain %s: %v", name, err)
	}
	var plan strings.Builder
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			t.Fatal(err)
		}
		plan.WriteString(line + "\n")
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("explain %s: %v", name, err)
	}
	if strings.Contains(plan.String(), "Seq Scan on idem_records") {
		t.Errorf("%s scans idem_records:\n%s", name, plan.String())
	}
}
