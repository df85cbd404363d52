// Command scalebench measures what the PostgreSQL store costs as its table
// grows: the same operations on an empty table and on one of -n completed
// records, and the reaper removing a day of them.
//
//	go run ./cmd/idem/internal/tools/scalebench -n 10000000 [-days 3] [-rounds 3] [-slice 2s] [-partitioned | -versus]
//
// It opens two stores on fresh schemas (their own migrations make the
// tables), fills one with -n completed records by server-side INSERT ...
// SELECT FROM generate_series (expiries spread over the next 24 h in
// insertion order, as a day of traffic leaves them), then VACUUM ANALYZE
// and a CHECKPOINT.
// Reserve+Complete of new keys, replays (Reserve of a completed key: a
// random one of the later half of the table, and, as replay-recent, of its
// last 1%, where retries land) and Get run in slices that alternate between
// the two schemas, with -workers clients and with one. Then a store whose clock
// is 24h/-days ahead reaps, through maintenance.Maintainer.ReapOnce with
// the product's batch size, the records of the first "day"; the report gives
// its time, WAL and the table's sizes and dead tuples, then VACUUM's time
// (held_by: the sessions whose snapshots may keep it from removing the
// reaper's dead tuples) and the dead tuples it left, and the sizes after
// another day of inserts. Each report line is a name followed by
// name=value pairs. The schemas are dropped unless -keep.
//
// With -partitioned both stores keep their records in a table partitioned by
// retention (postgres.Config.Partitions), one partition per simulated day
// (24h/-days), and the reaper retires the first day by dropping its
// partition. In both modes the fill's expiries start at a boundary of those
// days, so that the day the reaper retires holds the same records.
//
// With -keys ordered the keys are time-ordered, as UUIDv7 lays them out
// (a 48-bit time, then random bits): record i's time is i, and new keys
// take times after every record's. The default, random, is UUIDv4-like.
//
// With -versus the run compares the two tables at one size instead: it
// fills a plain and a partitioned table with -n records each, alternates
// the latency slices between them (labels plain and partitioned), then
// reaps the first day of each, the partitioned one first (stages and reap
// lines named after the table).
package main

import (
	"context"
	"crypto/md5"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	neturl "net/url"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-go/idem/cmd/idem/internal/tools/benchdb"
	"github.com/idem-go/idem/maintenance"
	"github.com/idem-go/idem/store/postgres"
)

type options struct {
	url            string
	n, chunk, days int
	rounds         int
	slice          time.Duration
	workers, batch int
	keep           bool
	partitioned    bool
	versus         bool
	keys           string    // random or ordered
	base           time.Time // the first expiry of the fill, at a day's boundary
}

// day is one simulated day: 24h/-days.
func (o *options) day() time.Duration { return 24 * time.Hour / time.Duration(o.days) }

func main() {
	var o options
	flag.StringVar(&o.url, "url", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "PostgreSQL URL")
	flag.IntVar(&o.n, "n", 10_000_000, "records in the large table")
	flag.IntVar(&o.chunk, "chunk", 1_000_000, "records per INSERT while filling")
	flag.IntVar(&o.days, "days", 3, "the reaper removes 1/days of the table")
	flag.IntVar(&o.rounds, "rounds", 3, "rounds of alternating slices")
	flag.DurationVar(&o.slice, "slice", 2*time.Second, "length of one slice")
	flag.IntVar(&o.workers, "workers", 4, "concurrent clients of the concurrent slices")
	flag.IntVar(&o.batch, "batch", maintenance.DefaultBatchSize, "records per reaper batch")
	flag.BoolVar(&o.keep, "keep", false, "keep the schemas")
	flag.BoolVar(&o.partitioned, "partitioned", false, "tables partitioned by retention, one partition per simulated day")
	flag.BoolVar(&o.versus, "versus", false, "compare a plain and a partitioned table of -n records each")
	flag.StringVar(&o.keys, "keys", "random", "`layout` of the keys: random (as UUIDv4) or ordered (time-ordered, as UUIDv7)")
	flag.Parse()
	if err := run(context.Background(), o, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "scalebench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o options, w io.Writer) error {
	if o.n < o.days || o.days < 1 || o.chunk < 1 || o.rounds < 1 || o.workers < 1 || o.batch < 1 || o.slice <= 0 {
		return fmt.Errorf("need n >= days >= 1 and positive chunk, rounds, workers, batch, slice")
	}
	switch o.keys {
	case "random", "":
		orderedKeys = false
	case "ordered":
		orderedKeys = true
	default:
		return fmt.Errorf("-keys %q: want random or ordered", o.keys)
	}
	admin, err := pgxpool.New(ctx, o.url)
	if err != nil {
		return err
	}
	defer admin.Close()
	o.base = time.Now().Truncate(o.day()).Add(o.day())
	tag := randHex(6)
	b := &bench{o: o, w: w, admin: admin, app: "scalebench_" + tag}
	if o.versus {
		return b.versus(ctx, tag)
	}
	large, err := b.create(ctx, "scalebench_large_"+tag, "large", o.n, o.partitioned)
	if err != nil {
		return err
	}
	defer b.drop(large)
	empty, err := b.create(ctx, "scalebench_empty_"+tag, "empty", min(emptyKeys, o.n), o.partitioned)
	if err != nil {
		return err
	}
	defer b.drop(empty)
	for _, s := range []*schema{large, empty} {
		if err := b.fill(ctx, s, s.label, 0, s.rows, s.rows); err != nil {
			return err
		}
	}
	if err := b.latencies(ctx, empty, large); err != nil {
		return err
	}
	b.closeStores(empty, large)
	return b.reap(ctx, large, "")
}

// versus is the run of -versus.
func (b *bench) versus(ctx context.Context, tag string) error {
	var both [2]*schema
	for i, label := range []string{"plain", "partitioned"} {
		s, err := b.create(ctx, "scalebench_"+label+"_"+tag, label, b.o.n, i == 1)
		if err != nil {
			return err
		}
		defer b.drop(s)
		if err := b.fill(ctx, s, label, 0, s.rows, s.rows); err != nil {
			return err
		}
		both[i] = s
	}
	if err := b.latencies(ctx, both[0], both[1]); err != nil {
		return err
	}
	b.closeStores(both[:]...)
	for _, s := range []*schema{both[1], both[0]} {
		if err := b.reap(ctx, s, s.label+"_"); err != nil {
			return err
		}
	}
	return nil
}

type bench struct {
	o     options
	w     io.Writer
	admin *pgxpool.Pool
	app   string // the application_name of the stores' connections
}

type schema struct {
	name        string
	label       string // in the report
	rows        int    // filled
	partitioned bool
	store       *postgres.Store
	table       string // quoted schema.idem_records
}

// create makes the schema name and opens a store on it, whose migrations
// make its table there.
func (b *bench) create(ctx context.Context, name, label string, rows int, partitioned bool) (*schema, error) {
	if err := benchdb.CreateSchema(ctx, b.admin, name); err != nil {
		return nil, err
	}
	return b.open(ctx, name, label, rows, partitioned, nil)
}

// open opens a store on the schema name, made by create, reading clock.
func (b *bench) open(ctx context.Context, name, label string, rows int, partitioned bool, clock func() time.Time) (*schema, error) {
	cfg := postgres.Config{Schema: name, MaxConns: int32(b.o.workers + 1), Clock: clock}
	if partitioned {
		// Partitions for the fill's days, and the next day's inserts.
		cfg.Partitions, cfg.PartitionsAhead = b.o.day(), b.o.days+2
	}
	s, err := postgres.Open(ctx, withAppName(b.o.url, b.app), cfg)
	if err != nil {
		return nil, err
	}
	return &schema{name: name, label: label, rows: rows, partitioned: partitioned, store: s,
		table: pgx.Identifier{name, "idem_records"}.Sanitize()}, nil
}

// withAppName returns the connection string url (a URL or keyword/value
// string) with application_name set to name, a word.
func withAppName(url, name string) string {
	if u, err := neturl.Parse(url); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		q := u.Query()
		q.Set("application_name", name)
		u.RawQuery = q.Encode()
		return u.String()
	}
	return url + " application_name=" + name
}

// closeStores closes the stores of the latency slices once they are done:
// their connections' exits report the statistics of what they wrote (an
// idle backend may hold them for 10 s), for settle to wait on. drop
// closes them again, harmlessly.
func (b *bench) closeStores(schemas ...*schema) {
	for _, s := range schemas {
		s.store.Close()
	}
}

// settle waits until no connection of the tool's stores, all closed, is
// left on the server. A backend reports its statistics as it exits, before
// it leaves pg_stat_activity (PostgreSQL 15 and later), so that the
// counts read afterwards include everything the stores did.
func (b *bench) settle(ctx context.Context) error {
	deadline := time.Now().Add(time.Minute)
	for {
		var n int
		if err := b.admin.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", b.app).Scan(&n); err != nil {
			return fmt.Errorf("settle: %w", err)
		}
		if n == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("settle: %d connections of the closed stores still open after a minute", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (b *bench) drop(s *schema) {
	s.store.Close()
	if !b.o.keep {
		benchdb.DropSchema(b.admin, s.name)
	}
}

// orderedKeys is -keys ordered.
var orderedKeys bool

// The records of the fill: record i has key keyOf(i) in scope scopeOf(i),
// so that the replay slices can name existing ones. A random key is the
// MD5 of "k" and i as a UUID; an ordered one puts i where UUIDv7 has its
// time, in the first 12 hex digits, then the version and variant digits
// and that MD5's first 18 digits. sqlFill makes the same keys.
func keyOf(i int) string {
	h := md5.Sum(fmt.Appendf(nil, "k%d", i))
	x := hex.EncodeToString(h[:])
	if orderedKeys {
		t := fmt.Sprintf("%012x", i)
		return t[:8] + "-" + t[8:] + "-7" + x[:3] + "-8" + x[3:6] + "-" + x[6:18]
	}
	return x[:8] + "-" + x[8:12] + "-" + x[12:16] + "-" + x[16:20] + "-" + x[20:]
}

// sqlKey is keyOf(i) in SQL, for -keys random and ordered.
var sqlKey = map[bool]string{
	false: `md5('k' || i)::uuid::text`,
	true: `(SELECT substr(t, 1, 8) || '-' || substr(t, 9, 4) || '-7' || substr(m, 1, 3) || '-8' || substr(m, 4, 3) || '-' || substr(m, 7, 12)
		FROM (SELECT lpad(to_hex(i), 12, '0') AS t, md5('k' || i) AS m) AS k)`,
}

func scopeOf(i int) string { return fmt.Sprintf("tenant-%d", i%1000) }

func fingerprintOf(i int) string {
	h := md5.Sum(fmt.Appendf(nil, "fp%d", i))
	return hex.EncodeToString(h[:])
}

// sqlFill inserts records $1..$2, completed, record i created at
// $4 - 24h + 24h*i/$3, expiring 24h later: records 0..$3 as a day of
// traffic leaves them, in the order of their expiry.
const sqlFill = `
INSERT INTO %s (scope, key, fingerprint, state, fence, lease_policy, locked_until,
	response_status, response_headers, response_body, attempts, created_at, updated_at,
	completed_at, expires_at, reap_after)
SELECT 'tenant-' || (i %% 1000), %s, md5('fp' || i), 'completed',
	(extract(epoch FROM t.c) * 1000000)::bigint, 'unknown', t.c + interval '30 seconds',
	201, '{"Content-Type": ["application/json"]}',
	convert_to('{"id":"' || md5('k' || i) || '","status":"created"}', 'UTF8'), 1,
	t.c, t.c, t.c, t.c + interval '24 hours', t.c + interval '24 hours'
FROM generate_series($1::bigint, $2::bigint) AS i,
	LATERAL (SELECT $4::timestamptz + (i - $3::bigint) * (interval '24 hours' / $3::bigint) AS c) AS t`

func (b *bench) fill(ctx context.Context, s *schema, stage string, from, n, spread int) error {
	start := time.Now()
	for lo := from; lo < from+n; lo += b.o.chunk {
		hi := min(lo+b.o.chunk, from+n) - 1
		t := time.Now()
		if _, err := b.admin.Exec(ctx, fmt.Sprintf(sqlFill, s.table, sqlKey[orderedKeys]), lo, hi, spread, b.o.base); err != nil {
			return fmt.Errorf("fill: %w", err)
		}
		fmt.Fprintf(os.Stderr, "filled %d..%d in %v\n", lo, hi, time.Since(t).Round(time.Millisecond))
	}
	fillTime := time.Since(start)
	// VACUUM ANALYZE of a partitioned table does each partition.
	if _, err := b.admin.Exec(ctx, "VACUUM ANALYZE "+s.table); err != nil {
		return err
	}
	fmt.Fprintf(b.w, "fill stage=%s rows=%d seconds=%.1f rows_per_s=%.0f vacuum_analyze_seconds=%.1f\n",
		stage, n, fillTime.Seconds(), float64(n)/fillTime.Seconds(), (time.Since(start) - fillTime).Seconds())
	return b.sizes(ctx, s, stage)
}

func (b *bench) sizes(ctx context.Context, s *schema, stage string) error {
	var table, indexes, pkey, live, dead, parts int64
	// The table, or each of its partitions.
	err := b.admin.QueryRow(ctx, `WITH leaves AS (
			SELECT c.oid FROM pg_class c WHERE c.relkind = 'r' AND (c.oid = $1::regclass
				OR c.oid IN (SELECT relid FROM pg_partition_tree($1::regclass))))
		SELECT sum(pg_total_relation_size(l.oid))::bigint, sum(pg_indexes_size(l.oid))::bigint,
			(SELECT sum(pg_relation_size(i.indexrelid)) FROM pg_index i WHERE i.indisprimary AND i.indrelid IN (SELECT oid FROM leaves))::bigint,
			sum(coalesce(st.n_live_tup, 0))::bigint, sum(coalesce(st.n_dead_tup, 0))::bigint, count(*)
		FROM leaves l LEFT JOIN pg_stat_user_tables st ON st.relid = l.oid`, s.table).
		Scan(&table, &indexes, &pkey, &live, &dead, &parts)
	if err != nil {
		return fmt.Errorf("sizes: %w", err)
	}
	fmt.Fprintf(b.w, "size stage=%s total_bytes=%d index_bytes=%d pkey_bytes=%d live_tup=%d dead_tup=%d tables=%d\n",
		stage, table, indexes, pkey, live, dead, parts)
	return nil
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
