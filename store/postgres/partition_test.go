package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/postgres"
	"github.com/idem-go/idem/store/storetest"
)

// TestPartitionBoundaryRace reserves one key from many goroutines at once
// through two stores on one table whose clocks stand a microsecond apart,
// on either side of the boundary between two partitions a second wide:
// with a TTL of a second, the reservations of one store compute reap_after
// in one partition and the other's in the next, whose primary keys cannot
// see each other. Exactly one reservation per key may create the record,
// and the table must hold one row per key. Alone, batched (the multi-row
// statement behind the batch's key locks), forced through the batch, and
// with the tenant cap; half the calls are the pending queue's.
func TestPartitionBoundaryRace(t *testing.T) {
	for name, cfg := range map[string]postgres.Config{
		"alone":      {MaxBatches: -1},
		"batched":    {MaxBatches: 1},
		"force":      {ForceBatches: true},
		"tenant cap": {MaxBatches: -1, TenantCap: true},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var base atomic.Int64 // µs: a whole second, the boundary
			base.Store(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC).UnixMicro())
			cfg.Partitions, cfg.PartitionsAhead, cfg.MaxConns = time.Second, 5, 12
			cfg.Clock = func() time.Time { return time.UnixMicro(base.Load() - 1) }
			before, schema := openSchema(t, cfg)
			cfg.Schema, cfg.Clock = schema, func() time.Time { return time.UnixMicro(base.Load()) }
			after, err := postgres.Open(context.Background(), testURL(t), cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer after.Close()
			boundaryRace(t, [2]*postgres.Store{before, after}, schema, cfg.TenantCap, &base)
		})
	}
}

func boundaryRace(t *testing.T, stores [2]*postgres.Store, schema string, capped bool, base *atomic.Int64) {
	ctx := context.Background()
	const rounds, callers = 20, 16
	for round := range rounds {
		base.Add(time.Second.Microseconds())
		if err := stores[0].EnsurePartitions(ctx); err != nil {
			t.Fatal(err)
		}
		key := fmt.Sprintf("race-%02d", round)
		var (
			wg      sync.WaitGroup
			mu      sync.Mutex
			created int
			errs    []error
		)
		start := make(chan struct{})
		for i := range callers {
			wg.Go(func() {
				<-start
				reserveOnce(ctx, stores[i%2], key, i/2, capped, &mu, &created, &errs)
			})
		}
		close(start)
		wg.Wait()
		if len(errs) > 0 {
			t.Fatalf("round %d: %v", round, errors.Join(errs...))
		}
		if created != 1 {
			t.Errorf("round %d: %d reservations created %s, want 1", round, created, key)
		}
	}
	var rows, keys, parts int
	err := adminConn(t).QueryRow(ctx, `SELECT count(*), count(DISTINCT key), count(DISTINCT tableoid) FROM `+
		pgx.Identifier{schema, "idem_records"}.Sanitize()).Scan(&rows, &keys, &parts)
	if err != nil {
		t.Fatal(err)
	}
	if rows != rounds || keys != rounds {
		t.Errorf("%d rows for %d keys, want one row for each of %d", rows, keys, rounds)
	}
	if parts < 2 {
		t.Errorf("the records are in %d partition: the stores did not reserve on both sides of a boundary", parts)
	}
}

// reserveOnce is one call of caller i: a Reserve, or for odd callers the
// pending queue's reservation.
func reserveOnce(ctx context.Context, s *postgres.Store, key string, i int, capped bool,
	mu *sync.Mutex, created *int, errs *[]error) {
	p := reserveParams(key)
	p.TTL = time.Second
	p.Tenant = "t"
	if capped {
		p.MaxActive = 1000
	}
	if i%2 == 1 {
		res, err := s.ReservePending(ctx, store.PendingParams{ReserveParams: p,
			Request: store.PendingRequest{Queue: "q", Method: http.MethodPost, Target: "/"}})
		record(mu, created, errs, res, err)
		return
	}
	res, err := s.Reserve(ctx, p)
	record(mu, created, errs, res, err)
}

func record(mu *sync.Mutex, created *int, errs *[]error, res store.ReserveResult, err error) {
	mu.Lock()
	defer mu.Unlock()
	switch {
	case err != nil:
		*errs = append(*errs, err)
	case res.Outcome == store.Created:
		*created++
	}
}

// partitionOf reads which partition holds a record.
func partitionOf(t *testing.T, conn *pgx.Conn, schema, key string) string {
	t.Helper()
	var rel string
	err := conn.QueryRow(context.Background(), `SELECT tableoid::regclass::text FROM `+
		pgx.Identifier{schema, "idem_records"}.Sanitize()+` WHERE key = $1`, key).Scan(&rel)
	if err != nil {
		t.Fatalf("partition of %s: %v", key, err)
	}
	return rel
}

// partitionCount counts the range partitions (the DEFAULT and infinity
// ones aside).
func partitionCount(t *testing.T, conn *pgx.Conn, schema string) int {
	t.Helper()
	var n int
	err := conn.QueryRow(context.Background(), `SELECT count(*) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
		WHERE i.inhparent = $1::regclass AND c.relname ~ '_[0-9]+$'`, pgx.Identifier{schema, "idem_records"}.Sanitize()).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestPartitionRetire fills the partition of an hour, lets its range pass
// and reaps: the terminal records past expiry go with the partition, which
// is dropped, and every record the plain reaper keeps is kept, moved to a
// live partition: a completion whose expiry the retention's start moved
// past the partition, unknown records (beyond the abandon's Limit),
// pending records, and a record whose holder still renews its lease.
func TestPartitionRetire(t *testing.T) {
	clock := storetest.NewClock()
	s, schema := openSchema(t, postgres.Config{Partitions: time.Hour, PartitionsAhead: 30, MaxBatches: -1, Clock: clock.Now})
	conn := adminConn(t)
	ctx := context.Background()
	reserve := func(key string) store.ReserveResult {
		t.Helper()
		p := reserveParams(key)
		p.TTL = 24 * time.Hour
		r, err := s.Reserve(ctx, p)
		if err != nil || r.Outcome != store.Created {
			t.Fatalf("reserve %s: %v %v", key, r.Outcome, err)
		}
		return r
	}
	complete := func(r store.ReserveResult, ttl time.Duration) {
		t.Helper()
		if err := s.Complete(ctx, store.CompleteParams{FenceParams: fence(r), Response: okResponse(), TTL: ttl}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 5 {
		complete(reserve(fmt.Sprint("done-", i)), 0)
	}
	late := reserve("late")
	for _, k := range []string{"unknown-1", "unknown-2"} {
		if err := s.MarkUnknown(ctx, store.ReleaseParams{FenceParams: fence(reserve(k)), Error: "x"}); err != nil {
			t.Fatal(err)
		}
	}
	live := reserve("live")
	p := reserveParams("pending")
	p.TTL = 24 * time.Hour
	if _, err := s.ReservePending(ctx, store.PendingParams{ReserveParams: p, Request: store.PendingRequest{Queue: "q", Method: "POST", Target: "/"}}); err != nil {
		t.Fatal(err)
	}
	old := partitionOf(t, conn, schema, "done-0")
	for _, k := range []string{"late", "unknown-1", "live", "pending"} {
		if got := partitionOf(t, conn, schema, k); got != old {
			t.Fatalf("%s is in %s, not with the others in %s", k, got, old)
		}
	}
	// late completes an hour later: its retention ends an hour after the
	// others', past the partition's range and past the reap.
	clock.Advance(time.Hour)
	complete(late, 24*time.Hour)
	clock.Advance(24*time.Hour - time.Hour + 58*time.Minute)
	if err := s.Extend(ctx, store.ExtendParams{FenceParams: fence(live), Lease: time.Hour}); err != nil {
		t.Fatal(err)
	}
	before := partitionCount(t, conn, schema)
	res, err := s.Reap(ctx, store.ReapParams{Limit: 1, Abandoned: store.Response{Status: 504}, AbandonedTTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if res.Deleted != 5 || res.Abandoned != 1 {
		t.Errorf("Reap: %+v, want the 5 expired records deleted and one unknown abandoned (Limit 1)", res)
	}
	var gone bool
	if err := conn.QueryRow(ctx, `SELECT to_regclass($1) IS NULL`, old).Scan(&gone); err != nil || !gone {
		t.Errorf("partition %s still there after its range passed (%v)", old, err)
	}
	if after := partitionCount(t, conn, schema); after < before {
		t.Logf("range partitions: %d before, %d after", before, after)
	}
	for i := range 5 {
		if _, err := s.Get(ctx, "tenant-1 POST /payments", fmt.Sprint("done-", i)); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("done-%d after the reap: %v, want ErrNotFound", i, err)
		}
	}
	want := map[string]store.State{"late": store.StateCompleted, "live": store.StateInProgress, "pending": store.StatePending}
	abandoned := 0
	for _, k := range []string{"unknown-1", "unknown-2"} {
		got, err := s.Get(ctx, "tenant-1 POST /payments", k)
		switch {
		case err != nil:
			t.Errorf("%s lost: %v", k, err)
		case got.State == store.StateCompleted && got.LastError == "abandoned":
			abandoned++
		case got.State != store.StateUnknown:
			t.Errorf("%s is %s", k, got.State)
		}
	}
	if abandoned != 1 {
		t.Errorf("%d unknown records abandoned, want 1", abandoned)
	}
	for k, st := range want {
		got, err := s.Get(ctx, "tenant-1 POST /payments", k)
		if err != nil || got.State != st {
			t.Errorf("%s after the reap: %v %v, want %s", k, got.State, err, st)
			continue
		}
		if where := partitionOf(t, conn, schema, k); where == old {
			t.Errorf("%s still in %s", k, where)
		}
	}
	// The live holder completes where its record moved.
	if err := s.Complete(ctx, store.CompleteParams{FenceParams: fence(live), Response: okResponse()}); err != nil {
		t.Fatalf("Complete of the moved live record: %v", err)
	}
}

// TestPartitionDefault reserves past the partitions made ahead (a reaper
// that has not run): the DEFAULT partition takes the record, and making
// its partition moves it there, where it completes and replays.
func TestPartitionDefault(t *testing.T) {
	clock := storetest.NewClock()
	s, schema := openSchema(t, postgres.Config{Partitions: time.Hour, PartitionsAhead: 2, Clock: clock.Now})
	conn := adminConn(t)
	ctx := context.Background()
	p := reserveParams("far")
	p.TTL, p.Lease = 10*time.Hour, 10*time.Hour
	r, err := s.Reserve(ctx, p)
	if err != nil || r.Outcome != store.Created {
		t.Fatalf("reserve: %v %v", r.Outcome, err)
	}
	def := schema + ".idem_records_default"
	if got := partitionOf(t, conn, schema, "far"); got != def {
		t.Fatalf("a record past the partitions made is in %s, want %s", got, def)
	}
	clock.Advance(9 * time.Hour)
	if err := s.EnsurePartitions(ctx); err != nil {
		t.Fatal(err)
	}
	if got := partitionOf(t, conn, schema, "far"); got == def {
		t.Fatalf("the record stayed in %s once its partition was made", got)
	}
	if again, err := s.Reserve(ctx, p); err != nil || again.Outcome != store.Existing {
		t.Fatalf("reserve again: %v %v, want Existing", again.Outcome, err)
	}
	if err := s.Complete(ctx, store.CompleteParams{FenceParams: fence(r), Response: okResponse()}); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Get(ctx, p.Scope, p.Key); err != nil || got.State != store.StateCompleted {
		t.Fatalf("after completion: %v %v", got.State, err)
	}
}

// TestPartitionOpenBusy opens a second store while a transaction holds
// the table, with partitions to make: it starts anyway, once its lock wait
// has timed out, and its reservations go to the DEFAULT partition.
func TestPartitionOpenBusy(t *testing.T) {
	ctx := context.Background()
	_, schema := openSchema(t, postgres.Config{Partitions: time.Hour})
	conn := adminConn(t)
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "LOCK TABLE "+pgx.Identifier{schema, "idem_records"}.Sanitize()+" IN ACCESS SHARE MODE"); err != nil {
		t.Fatal(err)
	}
	later := func() time.Time { return time.Now().Add(30 * 24 * time.Hour) }
	s, err := postgres.Open(ctx, testURL(t), postgres.Config{Schema: schema, Partitions: time.Hour, Clock: later, MaxBatches: -1})
	if err != nil {
		t.Fatalf("open while the table is held: %v", err)
	}
	defer s.Close()
	p := reserveParams("busy")
	p.TTL = 2 * time.Hour // within the partitions made ahead
	if r, err := s.Reserve(ctx, p); err != nil || r.Outcome != store.Created {
		t.Fatalf("reserve: %v %v", r.Outcome, err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if got := partitionOf(t, conn, schema, "busy"); got != schema+".idem_records_default" {
		t.Errorf("the record is in %s, want the DEFAULT partition", got)
	}
	if err := s.EnsurePartitions(ctx); err != nil {
		t.Fatal(err)
	}
	if got := partitionOf(t, conn, schema, "busy"); got == schema+".idem_records_default" {
		t.Errorf("the record stayed in the DEFAULT partition once its partition was made")
	}
}

// TestPartitionedTableKind: a partitioned store refuses a plain table, a
// store opened without Partitions on a partitioned one runs as partitioned,
// and ReserveTx refuses REPEATABLE READ.
func TestPartitionedTableKind(t *testing.T) {
	ctx := context.Background()
	plain := newSchema(t)
	made, err := postgres.Open(ctx, testURL(t), postgres.Config{Schema: plain})
	if err != nil {
		t.Fatal(err)
	}
	made.Close()
	if _, err := postgres.Open(ctx, testURL(t), postgres.Config{Schema: plain, Partitions: time.Hour}); !errors.Is(err, store.ErrInvalidParams) {
		t.Errorf("partitioned store on a plain table: %v, want ErrInvalidParams", err)
	}
	s, parted := openSchema(t, postgres.Config{Partitions: time.Hour})
	// A store opened without Partitions (an operator's tool) runs the
	// partitioned statements on a partitioned table.
	tool, err := postgres.Open(ctx, testURL(t), postgres.Config{Schema: parted, MaxBatches: -1})
	if err != nil {
		t.Fatalf("plain store on a partitioned table: %v", err)
	}
	defer tool.Close()
	for i, want := range []store.ReserveOutcome{store.Created, store.Existing} {
		if r, err := tool.Reserve(ctx, reserveParams("tool")); err != nil || r.Outcome != want {
			t.Errorf("reservation %d through a store opened without Partitions: %v %v, want %v", i, r.Outcome, err, want)
		}
	}
	for _, bad := range []time.Duration{-time.Hour, time.Millisecond, 1500 * time.Millisecond} {
		if _, err := postgres.Open(ctx, testURL(t), postgres.Config{Schema: parted, Partitions: bad}); !errors.Is(err, store.ErrInvalidParams) {
			t.Errorf("Partitions %v: %v, want ErrInvalidParams", bad, err)
		}
	}
	tx, err := s.Pool().BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := s.ReserveTx(ctx, tx, reserveParams("rr")); !errors.Is(err, store.ErrInvalidParams) {
		t.Errorf("ReserveTx under REPEATABLE READ: %v, want ErrInvalidParams", err)
	}
}

// TestPartitionedShape compares the partitioned table with the plain one,
// both made by a store on a fresh schema and migrated to the last
// migration: the same columns in the same order, with the same types,
// collations, defaults and NOT NULL (but reap_after, the partition key,
// which the primary key makes NOT NULL), the same CHECK constraints, and
// the same indexes but the two the partitioned shape does differently: the
// primary key holds reap_after, and no index on reap_after (the reaper
// drops partitions). A migration whose change reaches one table and not
// the other fails here.
func TestPartitionedShape(t *testing.T) {
	t.Parallel()
	_, plain := openSchema(t, postgres.Config{MaxBatches: -1})
	_, parted := openSchema(t, postgres.Config{Partitions: time.Hour, MaxBatches: -1})
	conn := adminConn(t)
	ctx := context.Background()
	// catalog reads one line per row of sql, whose $1 is the schema.
	catalog := func(sql, schema string) []string {
		t.Helper()
		rows, err := conn.Query(ctx, sql, schema)
		if err != nil {
			t.Fatal(err)
		}
		out, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		if len(out) == 0 {
			t.Fatalf("nothing in the catalog of %s for %s", schema, sql)
		}
		return out
	}
	const columns = `SELECT format('%s %s collate %s default %s not null %s', a.attname, format_type(a.atttypid, a.atttypmod),
			coalesce(co.collname, '-'), coalesce(pg_get_expr(d.adbin, d.adrelid), '-'), a.attnotnull)
		FROM pg_attribute a
		LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
		LEFT JOIN pg_collation co ON co.oid = a.attcollation
		WHERE a.attrelid = format('%I.idem_records', $1::text)::regclass AND a.attnum > 0 AND NOT a.attisdropped
		ORDER BY a.attnum`
	// The definition without the schema that qualifies a function it calls.
	const checks = `SELECT conname || ' ' || replace(pg_get_constraintdef(oid), $1::text || '.', '') FROM pg_constraint
		WHERE conrelid = format('%I.idem_records', $1::text)::regclass AND contype = 'c' ORDER BY conname`
	// The definition without the schema, and without the ONLY of an index
	// on a partitioned table (its partitions each get theirs).
	const indexes = `SELECT replace(replace(indexdef, ' ON ONLY ', ' ON '), $1::text || '.', '') FROM pg_indexes
		WHERE schemaname = $1 AND tablename = 'idem_records' ORDER BY indexname`

	wantCols := catalog(columns, plain)
	for i, c := range wantCols {
		if strings.HasPrefix(c, "reap_after ") {
			wantCols[i] = strings.Replace(c, "not null f", "not null t", 1)
		}
	}
	compare(t, "columns", catalog(columns, parted), wantCols)
	compare(t, "CHECK constraints", catalog(checks, parted), catalog(checks, plain))
	var wantIdx []string
	for _, ix := range catalog(indexes, plain) {
		switch {
		case strings.Contains(ix, " idem_records_reap_after_idx "):
			continue
		case strings.Contains(ix, " idem_records_pkey "):
			ix = strings.Replace(ix, "(key, scope)", "(key, scope, reap_after)", 1)
		}
		wantIdx = append(wantIdx, ix)
	}
	compare(t, "indexes", catalog(indexes, parted), wantIdx)
}

// compare reports got and want unless they are the same lines.
func compare(t *testing.T, what string, got, want []string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Errorf("%s differ: the partitioned table has\n\t%s\nthe plain table (as the partitioned shape differs)\n\t%s",
			what, strings.Join(got, "\n\t"), strings.Join(want, "\n\t"))
	}
}

// TestResolveReapAfter pins what a settlement (Resolve) leaves in
// reap_after and expires_at, on the plain table and on a partitioned one,
// and that the reaper removes each settled record when it is due and not
// a second before: on the plain table at its expiry; on the partitioned
// one once the range of the partition that reap_after puts it in has also
// passed.
//
// A Resolve with a TTL sets both to now + TTL (the row moves to that
// partition). Without one it keeps both: expires_at is the reservation's,
// and reap_after, a lower bound of it on the plain table, stays one, so the
// reaper still finds the record; on the partitioned table the row stays in
// its partition. "moved" is a record whose partition the reaper retired
// while its holder was alive: the reaper moved it to the present's
// partition (reap_after now past its expiry), and a settlement without TTL
// must not send it back to its old range (the DEFAULT partition).
func TestResolveReapAfter(t *testing.T) {
	const width = time.Hour
	for name, cfg := range map[string]postgres.Config{
		"plain":       {MaxBatches: -1},
		"partitioned": {MaxBatches: -1, Partitions: width, PartitionsAhead: 30},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			clock := storetest.NewClock()
			cfg.Clock = clock.Now
			s, schema := openSchema(t, cfg)
			resolveReapAfter(t, s, schema, clock, cfg.Partitions)
		})
	}
}

func resolveReapAfter(t *testing.T, s *postgres.Store, schema string, clock *storetest.Clock, width time.Duration) {
	ctx := context.Background()
	conn := adminConn(t)
	t0 := clock.Now()
	reserve := func(key string, ttl time.Duration) store.ReserveResult {
		t.Helper()
		p := reserveParams(key)
		p.TTL = ttl
		r, err := s.Reserve(ctx, p)
		if err != nil || r.Outcome != store.Created {
			t.Fatalf("reserve %s: %v %v", key, r.Outcome, err)
		}
		return r
	}
	unknown := func(r store.ReserveResult) {
		t.Helper()
		if err := s.MarkUnknown(ctx, store.ReleaseParams{FenceParams: fence(r), Error: "timeout"}); err != nil {
			t.Fatalf("mark %s unknown: %v", r.Record.Key, err)
		}
	}
	reap := func() {
		t.Helper()
		if _, err := s.Reap(ctx, store.ReapParams{Limit: 100, Abandoned: store.Response{Status: 504}, AbandonedTTL: time.Hour}); err != nil {
			t.Fatalf("reap at %v: %v", clock.Now(), err)
		}
	}
	type row struct {
		reapAfter, expiresAt time.Time
		partition            string
	}
	read := func(key string) (row, bool) {
		t.Helper()
		var r row
		err := conn.QueryRow(ctx, `SELECT reap_after, expires_at, tableoid::regclass::text FROM `+
			pgx.Identifier{schema, "idem_records"}.Sanitize()+` WHERE key = $1`, key).Scan(&r.reapAfter, &r.expiresAt, &r.partition)
		if errors.Is(err, pgx.ErrNoRows) {
			return r, false
		}
		if err != nil {
			t.Fatalf("read %s: %v", key, err)
		}
		return r, true
	}

	keep := reserve("keep", 2*time.Hour)
	renew := reserve("renew", 2*time.Hour)
	moved := reserve("moved", 30*time.Minute)
	if err := s.Extend(ctx, store.ExtendParams{FenceParams: fence(moved), Lease: 3 * time.Hour}); err != nil {
		t.Fatal(err)
	}
	unknown(keep)
	unknown(renew)
	// An hour on, the partition holding moved's reservation has passed: the
	// reaper keeps the record (its holder's lease runs) and, partitioned,
	// moves it to the present's partition.
	clock.Advance(time.Hour)
	retired := clock.Now()
	reap()
	unknown(moved)
	clock.Advance(time.Minute)
	settled := clock.Now()
	before := map[string]row{}
	for _, k := range []string{"keep", "renew", "moved"} {
		before[k], _ = read(k)
	}
	for _, r := range []struct {
		rec store.ReserveResult
		ttl time.Duration
	}{{keep, 0}, {renew, 3 * time.Hour}, {moved, 0}} {
		err := s.Resolve(ctx, store.ResolveParams{FenceParams: fence(r.rec), To: store.StateCompleted, Response: &store.Response{Status: 200}, TTL: r.ttl})
		if err != nil {
			t.Fatalf("resolve %s: %v", r.rec.Record.Key, err)
		}
	}

	movedReapAfter := t0.Add(30 * time.Minute) // the plain reaper leaves it
	if width > 0 {
		movedReapAfter = retired // the partitioned one moved it
	}
	want := map[string]row{
		"keep":  {reapAfter: t0.Add(2 * time.Hour), expiresAt: t0.Add(2 * time.Hour)},
		"renew": {reapAfter: settled.Add(3 * time.Hour), expiresAt: settled.Add(3 * time.Hour)},
		"moved": {reapAfter: movedReapAfter, expiresAt: t0.Add(30 * time.Minute)},
	}
	due := map[string]time.Time{}
	for k, w := range want {
		got, ok := read(k)
		switch {
		case !ok:
			t.Fatalf("%s gone after its settlement", k)
		case !got.reapAfter.Equal(w.reapAfter) || !got.expiresAt.Equal(w.expiresAt):
			t.Errorf("%s after Resolve: reap_after %v, expires_at %v; want %v, %v", k, got.reapAfter, got.expiresAt, w.reapAfter, w.expiresAt)
		}
		// Only a settlement with a TTL moves the row.
		if moved, want := got.partition != before[k].partition, k == "renew"; width > 0 && moved != want {
			t.Errorf("%s was in %s before Resolve and is in %s after it; want it moved: %v", k, before[k].partition, got.partition, want)
		}
		due[k] = w.expiresAt
		if end := w.reapAfter.Truncate(width).Add(width); width > 0 && end.After(due[k]) {
			due[k] = end
		}
	}

	// Reap a second before each record is due, and when it is due: every
	// record is there until its instant and gone from it.
	check := func() {
		t.Helper()
		now := clock.Now()
		for k, d := range due {
			if _, ok := read(k); ok != now.Before(d) {
				t.Errorf("at %v (due %v): %s there: %v", now, d, k, ok)
			}
		}
	}
	reap()
	check()
	instants := make([]time.Time, 0, len(due))
	for _, d := range due {
		instants = append(instants, d)
	}
	slices.SortFunc(instants, time.Time.Compare)
	for _, d := range instants {
		for _, at := range []time.Time{d.Add(-time.Second), d} {
			if at.After(clock.Now()) {
				clock.Advance(at.Sub(clock.Now()))
				reap()
				check()
			}
		}
	}
}

// TestPartitionConcurrentReapers runs the reaper of several processes at
// once, as every instance of a service does, when a partition's range has
// passed: one of them retires it, and the others must find it gone
// without failing (their Reap counts nothing of it).
func TestPartitionConcurrentReapers(t *testing.T) {
	clock := storetest.NewClock()
	cfg := postgres.Config{Partitions: time.Second, PartitionsAhead: 3, MaxBatches: -1, Clock: clock.Now}
	first, schema := openSchema(t, cfg)
	cfg.Schema = schema
	stores := []*postgres.Store{first}
	for range 3 {
		s, err := postgres.Open(context.Background(), testURL(t), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		stores = append(stores, s)
	}
	ctx := context.Background()
	const rounds = 10
	for round := range rounds {
		for i := range 50 {
			p := reserveParams(fmt.Sprintf("r%d-%d", round, i))
			p.TTL = time.Second
			r, err := first.Reserve(ctx, p)
			if err != nil {
				t.Fatal(err)
			}
			if err := first.Complete(ctx, store.CompleteParams{FenceParams: fence(r), Response: okResponse()}); err != nil {
				t.Fatal(err)
			}
		}
		clock.Advance(3 * time.Second)
		var wg sync.WaitGroup
		var deleted atomic.Int64
		errs := make([]error, len(stores))
		start := make(chan struct{})
		for i, s := range stores {
			wg.Go(func() {
				<-start
				res, err := s.Reap(ctx, store.ReapParams{Limit: 1000, Abandoned: store.Response{Status: 504}, AbandonedTTL: time.Hour})
				errs[i] = err
				deleted.Add(int64(res.Deleted))
			})
		}
		close(start)
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatalf("round %d: concurrent reapers: %v", round, err)
		}
		if n := deleted.Load(); n != 50 {
			t.Errorf("round %d: the reapers counted %d deletions, want 50", round, n)
		}
	}
}

// TestPartitionSoftReap runs the soft reaper (--soft-expire) on a
// partitioned table for longer than the partitions made at start reach:
// it must keep making partitions ahead, or every new record would land in
// the DEFAULT partition (for the next start to move under the table's
// exclusive lock), and drop the partitions whose range has passed once
// their records are soft-expired (kept in the 'infinity' partition), or
// every key probe would read more partitions each day.
func TestPartitionSoftReap(t *testing.T) {
	clock := storetest.NewClock()
	s, schema := openSchema(t, postgres.Config{Partitions: time.Hour, PartitionsAhead: 2, MaxBatches: -1, Clock: clock.Now})
	conn := adminConn(t)
	ctx := context.Background()
	start := partitionCount(t, conn, schema)
	for hour := range 6 {
		key := fmt.Sprint("soft-", hour)
		p := reserveParams(key)
		p.TTL = 30 * time.Minute
		r, err := s.Reserve(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Complete(ctx, store.CompleteParams{FenceParams: fence(r), Response: okResponse()}); err != nil {
			t.Fatal(err)
		}
		if where := partitionOf(t, conn, schema, key); where == schema+".idem_records_default" {
			t.Errorf("hour %d: %s landed in the DEFAULT partition: the soft reaper made no partition ahead", hour, key)
		}
		clock.Advance(time.Hour)
		if _, err := s.Reap(ctx, store.ReapParams{Soft: true, Limit: 100, Abandoned: store.Response{Status: 504}, AbandonedTTL: time.Hour}); err != nil {
			t.Fatal(err)
		}
	}
	if n := partitionCount(t, conn, schema); n > start+1 {
		t.Errorf("%d range partitions after six hours of soft reaps, %d at start: the passed ones were not dropped", n, start)
	}
	for hour := range 6 {
		got, err := s.Get(ctx, "tenant-1 POST /payments", fmt.Sprint("soft-", hour))
		if err != nil || got.State != store.StateExpired {
			t.Errorf("soft-%d: %v %v, want it kept as expired", hour, got.State, err)
		}
	}
}
