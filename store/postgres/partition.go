package postgres

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idem-go/idem/internal/migrate"
	"github.com/idem-go/idem/store"
)

// Time-partitioned retention (Config.Partitions).
//
// The table is partitioned by RANGE on reap_after (partitioned/records.sql),
// one partition per Config.Partitions of time, made ahead of time by the
// reaper; a DEFAULT partition takes what no partition covers, and a
// partition from 'infinity' on the soft-expired records.
//
// Uniqueness of (scope, key). The primary key of each partition is
// (key, scope, reap_after), so nothing in the schema keeps one key out of
// two partitions. Every statement that may create a record (Reserve in
// every form, ReservePending) first takes a transaction-scoped advisory
// lock on a 64-bit hash of the scope and key (sqlKeyLock), in the same
// pipeline, and then reads the key across the partitions in a statement of
// its own: under READ COMMITTED that statement's snapshot is taken once the
// lock is held, so it sees the record the lock's previous holder committed
// (a transaction's commit is visible before its locks are released). One
// statement holding both the lock and the read would not do: its snapshot
// would be older than the lock. Under REPEATABLE READ the snapshot is the
// transaction's first, so ReserveTx refuses that level on this table
// (SERIALIZABLE is safe: it catches the two readers of the absent key).
// Transitions of a record that exists need no lock: they address the
// record by (scope, key), which PostgreSQL answers with one probe of each
// partition's primary key (the partitions live at once number the TTL over
// the width, plus the ones made ahead, plus two).
//
// Rows that move. reap_after changes only where a record starts over
// (Reserve's replace and reclaim, a pending record made anew), where it is
// abandoned or settled with a TTL, and where it is soft-expired
// ('infinity'): there
// PostgreSQL moves the row to its new partition (a delete and an insert,
// not a heap-only update). A completion keeps reap_after, and stays
// heap-only. A statement that waited for a row that a concurrent one moved
// fails with a serialization failure (40001); a Reserve or a lease
// holder's update on the pool then runs again (movedRow).
//
// Retirement. A partition whose whole range has passed
// holds records past their retention: the reaper abandons the in-flight
// ones as it does on the plain table, moves out every record the plain
// reaper would keep (a completion later than the reservation moved its
// expiry past reap_after; pending, unknown and live records), and drops
// the partition (DETACH, then DROP). A terminal record past its expiry is
// therefore removed only once its partition's range has passed, up to
// Config.Partitions after its expiry, or after the move that took it out
// of a retiring partition (to greatest(expires_at, now)) when it had one
// (Reserve treats it as absent meanwhile, as on the plain table), and
// Reap's Limit does not bound the records of a dropped partition. A soft
// Reap soft-expires records one by one first (to 'infinity'), and retires
// only a partition left with none to soft-expire, so it drops nothing but
// an emptied partition.

//go:embed partitioned/records.sql
var partitionedTable string

// partitionedBase is the last migration whose shape the partitioned table
// is made from: createPartitioned applies it and those before to a plain
// table, which records.sql then turns into the partitioned one; the later
// migrations apply to the partitioned table as they are.
const partitionedBase = 8

// DefaultPartitionsAhead is how many partitions the reaper keeps made
// after the one holding the present when Config.PartitionsAhead is 0.
const DefaultPartitionsAhead = 3

// maxPartitionsAhead bounds Config.PartitionsAhead: every key probe reads
// each partition.
const maxPartitionsAhead = 1000

// keyHash is the advisory lock key of a record: a 64-bit hash of its
// scope and key, in a name space of its own (the tenant cap's lock hashes
// 'idem/tenant:' and the tenant). Two records sharing a hash only wait for
// each other.
func keyHash(scope, key string) string {
	return `hashtextextended('idem/key:' || length(` + scope + `) || ':' || ` + scope + ` || ` + key + `, 0)`
}

// sqlKeyLock takes the lock of one key until the end of the transaction
// and reports the transaction's isolation level. $1 scope, $2 key.
var sqlKeyLock = `SELECT current_setting('transaction_isolation'), pg_advisory_xact_lock(` + keyHash("$1::text", "$2::text") + `)`

// sqlKeyLocks takes the locks of a batch's keys in the order of their
// hashes, so that two batches cannot deadlock. $1 scopes, $2 keys.
var sqlKeyLocks = `SELECT pg_advisory_xact_lock(h) FROM (SELECT DISTINCT ` + keyHash("u.scope", "u.key") + ` AS h
	FROM unnest($1::text[], $2::text[]) AS u(scope, key)) d ORDER BY h`

// errRepeatableRead refuses a reservation on a partitioned table in a
// REPEATABLE READ transaction, whose snapshot predates the key lock.
var errRepeatableRead = errors.Join(store.ErrInvalidParams,
	errors.New("a partitioned table (postgres.Config.Partitions) reserves keys under READ COMMITTED or SERIALIZABLE only, not REPEATABLE READ"))

// partitioned reports whether the store runs on a partitioned table.
func (s *Store) partitioned() bool { return s.cfg.Partitions > 0 }

// lockKey takes the key lock in the caller's transaction.
func (s *Store) lockKey(ctx context.Context, tx querier, scope, key string) error {
	var iso string
	if err := tx.QueryRow(ctx, s.q.keyLock, scope, key).Scan(&iso, nil); err != nil {
		return err
	}
	if iso == "repeatable read" {
		return errRepeatableRead
	}
	return nil
}

// lockedRow runs sql after the key lock of (scope, key), and scans its
// row: one pipeline on the pool; in a caller's transaction, the lock
// first, so that a REPEATABLE READ transaction is refused before it
// writes. first, if not empty, is queued before the key lock (the tenant
// cap's lock).
func (s *Store) lockedRow(ctx context.Context, q querier, first *pgx.QueuedQuery, scope, key, sql string,
	args []any, scan func(pgx.Row) error) error {
	if _, ok := q.(pgx.Tx); ok {
		if first != nil {
			if _, err := q.Exec(ctx, first.SQL, first.Arguments...); err != nil {
				return err
			}
		}
		if err := s.lockKey(ctx, q, scope, key); err != nil {
			return err
		}
		return scan(q.QueryRow(ctx, sql, args...))
	}
	var b pgx.Batch
	if first != nil {
		b.Queue(first.SQL, first.Arguments...)
	}
	b.Queue(s.q.keyLock, scope, key)
	b.Queue(sql, args...)
	br := q.SendBatch(ctx, &b)
	var err error
	if first != nil {
		_, err = br.Exec()
	}
	var iso string
	if err == nil {
		err = br.QueryRow().Scan(&iso, nil)
	}
	if err == nil {
		// The statement ran in the pool's own implicit transaction: at
		// that level a server default would have let it in.
		err = scan(br.QueryRow())
		if err == nil && iso == "repeatable read" {
			err = errRepeatableRead
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return err
}

// lockTimedOut reports a lock wait that ran past lock_timeout.
func lockTimedOut(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55P03"
}

// relationGone reports a statement on a relation that no longer exists:
// a partition that another process's reaper retired since this one
// listed it.
func relationGone(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42P01"
}

// movedRow reports the serialization failure of a statement that waited
// for a row a concurrent statement moved to another partition: the
// statement, run again, finds the row where it is now.
func movedRow(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "40001" && strings.Contains(pgErr.Message, "another partition")
}

// createPartitioned creates the partitioned table in a fresh schema,
// inside the migration's transaction and under its lock: it applies the
// migrations up to partitionedBase, which make the plain table (and record
// themselves as applied), then records.sql makes the partitioned table
// from that table's columns and drops it. A schema that holds idem_records
// already is left as it is (New then checks that its kind matches
// Config.Partitions).
func createPartitioned(ctx context.Context, tx pgx.Tx, all []migrate.Migration) error {
	var absent bool
	if err := tx.QueryRow(ctx, `SELECT to_regclass('idem_records') IS NULL`).Scan(&absent); err != nil || !absent {
		return err
	}
	base := all // sorted by version
	if i := slices.IndexFunc(all, func(m migrate.Migration) bool { return m.Version > partitionedBase }); i >= 0 {
		base = all[:i]
	}
	if err := migrate.ApplyIn(ctx, tx, base, migrationTables); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, partitionedTable); err != nil {
		return fmt.Errorf("create the partitioned table: %w", err)
	}
	return nil
}

// checkTableKind matches the store to its table. A plain table refuses
// Config.Partitions (a table cannot be partitioned in place). A
// partitioned table makes a store opened without Config.Partitions (an
// operator's tool, `idem inspect`) run the partitioned statements, with
// the width of the newest partition for the ones it makes. A schema
// without the table (SkipMigrate before `idem migrate`) passes, and so does
// a store with SkipMigrate that cannot reach the server.
func (s *Store) checkTableKind(ctx context.Context) error {
	var kind *string
	err := s.pool.QueryRow(ctx, `SELECT relkind::text FROM pg_class WHERE oid = to_regclass($1)`, s.parent()).Scan(&kind)
	switch {
	case errors.Is(err, pgx.ErrNoRows), err != nil && s.cfg.SkipMigrate:
		// A store that leaves the schema alone opens without the server
		// (its first call fails instead); without Config.Partitions it then
		// runs the plain statements, whose reservations fail on a
		// partitioned table (no unique index on (scope, key)).
		return nil
	case err != nil:
		return wrap(ctx, "open", err)
	case kind == nil:
		return nil
	case *kind != "p" && s.partitioned():
		return errors.Join(store.ErrInvalidParams, fmt.Errorf(
			"idem/postgres: open: %s is not partitioned, and a table cannot be partitioned in place: "+
				"create the partitioned store in a new schema and copy the records (docs/postgres-production.md)", s.parent()))
	case *kind == "p" && !s.partitioned():
		parts, err := s.partitions(ctx, s.pool)
		if err != nil {
			return wrap(ctx, "open", err)
		}
		s.cfg.Partitions = DefaultPartitions
		if len(parts) > 0 {
			last := parts[len(parts)-1]
			s.cfg.Partitions = last.hi.Sub(last.lo)
		}
		s.q = newQueries(s.cfg.Schema, s.cfg.TenantCap, true)
	}
	return nil
}

// DefaultPartitions is the width of the partitions a store opened without
// Config.Partitions makes on a partitioned table that has none.
const DefaultPartitions = 24 * time.Hour

// checkPartitions validates Config.Partitions and PartitionsAhead.
func checkPartitions(cfg *Config) error {
	switch {
	case cfg.Partitions < 0, cfg.Partitions > 0 && (cfg.Partitions < time.Second || cfg.Partitions%time.Second != 0):
		return errors.Join(store.ErrInvalidParams, fmt.Errorf("idem/postgres: Partitions is %v: want 0 or a whole number of seconds", cfg.Partitions))
	case cfg.PartitionsAhead < 0 || cfg.PartitionsAhead > maxPartitionsAhead:
		return errors.Join(store.ErrInvalidParams, fmt.Errorf("idem/postgres: PartitionsAhead is %d: want 0 to %d", cfg.PartitionsAhead, maxPartitionsAhead))
	}
	return nil
}

// parent is the partitioned table's name, qualified by Config.Schema.
func (s *Store) parent() string { return s.qualified("idem_records") }

func (s *Store) qualified(name string) string {
	if s.cfg.Schema == "" {
		return pgx.Identifier{name}.Sanitize()
	}
	return pgx.Identifier{s.cfg.Schema, name}.Sanitize()
}

// span is one range partition: [lo, hi).
type span struct {
	name   string
	lo, hi time.Time
}

// spanName names a partition after its range: its start in UTC and its
// width in seconds, which partitions() reads back.
func spanName(lo time.Time, width time.Duration) string {
	return "idem_records_" + lo.UTC().Format("20060102t150405") + "_" + strconv.FormatInt(int64(width/time.Second), 10)
}

var spanRe = regexp.MustCompile(`^idem_records_(\d{8}t\d{6})_(\d+)$`)

// partitions lists the range partitions the store made, oldest first.
func (s *Store) partitions(ctx context.Context, q querier) ([]span, error) {
	rows, err := q.Query(ctx, `SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
		WHERE i.inhparent = to_regclass($1)`, s.parent())
	if err != nil {
		return nil, err
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	var out []span
	for _, n := range names {
		m := spanRe.FindStringSubmatch(n)
		if m == nil {
			continue // the default and infinity partitions, or an operator's own
		}
		lo, err := time.Parse("20060102t150405", m[1])
		secs, serr := strconv.ParseInt(m[2], 10, 64)
		if err != nil || serr != nil || secs <= 0 {
			continue
		}
		out = append(out, span{n, lo, lo.Add(time.Duration(secs) * time.Second)})
	}
	slices.SortFunc(out, func(a, b span) int { return a.lo.Compare(b.lo) })
	return out, nil
}

// instant is the store's present: Config.Clock, or the database's.
func (s *Store) instant(ctx context.Context) (time.Time, error) {
	if s.cfg.Clock != nil {
		return s.cfg.Clock().UTC(), nil
	}
	var now time.Time
	err := s.pool.QueryRow(ctx, `SELECT statement_timestamp()`).Scan(&now)
	return now.UTC(), err
}

// timeLiteral is t as a timestamptz literal for DDL, which takes no
// parameters.
func timeLiteral(t time.Time) string {
	return "'" + t.UTC().Format("2006-01-02 15:04:05.999999") + "+00'"
}

// sqlMaintenanceLock serialises the partition maintenance of one table
// across processes.
const sqlMaintenanceLock = `SELECT pg_advisory_xact_lock(hashtextextended('idem/partitions:' || $1::text, 0))`

// partitionLockTimeout bounds the wait for the table's exclusive lock
// (creating, detaching a partition): a long transaction on the table makes
// the maintenance fail and try again at its next run rather than queue
// every request behind it.
const partitionLockTimeout = "2s"

// EnsurePartitions makes the partitions of a partitioned store from the
// one holding the present to Config.PartitionsAhead after it, each
// Config.Partitions wide. A record the DEFAULT partition holds for the
// range of a new partition moves into it, under the table's exclusive
// lock. Reap calls it; it is exported for deployments that run it on a
// schedule of their own. It does nothing on an unpartitioned store.
func (s *Store) EnsurePartitions(ctx context.Context) error {
	if !s.partitioned() {
		return nil
	}
	now, err := s.instant(ctx)
	if err != nil {
		return wrap(ctx, "ensure partitions", err)
	}
	if err := s.ensurePartitions(ctx, now); err != nil {
		return wrap(ctx, "ensure partitions", err)
	}
	return nil
}

func (s *Store) ensurePartitions(ctx context.Context, now time.Time) error {
	width := s.cfg.Partitions
	ahead := s.cfg.PartitionsAhead
	if ahead == 0 {
		ahead = DefaultPartitionsAhead
	}
	have, err := s.partitions(ctx, s.pool)
	if err != nil {
		return err
	}
	var missing []span
	start := now.UTC().Truncate(width)
	for i := 0; i <= ahead; i++ {
		lo := start.Add(time.Duration(i) * width)
		c := span{spanName(lo, width), lo, lo.Add(width)}
		if !slices.ContainsFunc(have, func(h span) bool { return h.lo.Before(c.hi) && c.lo.Before(h.hi) }) {
			missing = append(missing, c)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if err := s.lockTable(ctx, tx); err != nil {
			return err
		}
		// Another process may have made some meanwhile.
		if have, err = s.partitions(ctx, tx); err != nil {
			return err
		}
		for _, c := range missing {
			if slices.ContainsFunc(have, func(h span) bool { return h.lo.Before(c.hi) && c.lo.Before(h.hi) }) {
				continue
			}
			if err := s.createPartition(ctx, tx, c); err != nil {
				return err
			}
		}
		return nil
	})
}

// lockTable takes the maintenance lock and the table's exclusive lock,
// which creating or detaching a partition takes anyway: taken first, it
// lets no statement on the table start before the change commits.
func (s *Store) lockTable(ctx context.Context, tx pgx.Tx) error {
	if _, err := tx.Exec(ctx, `SELECT set_config('lock_timeout', $1, true)`, partitionLockTimeout); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, sqlMaintenanceLock, s.parent()); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, `LOCK TABLE `+s.parent()+` IN ACCESS EXCLUSIVE MODE`)
	return err
}

// createPartition makes partition c, moving into it the records of its
// range that the DEFAULT partition holds (a reaper that did not run, or a
// TTL longer than the partitions made ahead). The caller holds lockTable.
func (s *Store) createPartition(ctx context.Context, tx pgx.Tx, c span) error {
	def := s.qualified("idem_records_default")
	rng := ` WHERE reap_after >= ` + timeLiteral(c.lo) + ` AND reap_after < ` + timeLiteral(c.hi)
	var n int64
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM `+def+rng).Scan(&n); err != nil {
		return err
	}
	if n > 0 {
		if _, err := tx.Exec(ctx, `CREATE TEMP TABLE idem_moving ON COMMIT DROP AS SELECT * FROM `+def+rng); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `DELETE FROM `+def+rng); err != nil {
			return err
		}
	}
	_, err := tx.Exec(ctx, `CREATE TABLE `+s.qualified(c.name)+` PARTITION OF `+s.parent()+
		` FOR VALUES FROM (`+timeLiteral(c.lo)+`) TO (`+timeLiteral(c.hi)+`) WITH (fillfactor = 50)`)
	if err != nil || n == 0 {
		return err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO `+s.parent()+` SELECT * FROM idem_moving`); err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `DROP TABLE idem_moving`)
	return err
}

// keeps is true of a record the plain reaper would not delete at $1: all
// but the terminal records past their expiry.
const keeps = `NOT (state IN ('completed', 'failed_retryable') AND expires_at <= $1::timestamptz)`

// reapPartitioned is Reap on a partitioned table: make the partitions
// ahead, retire every partition whose range has passed, then reap the
// DEFAULT partition record by record as the plain table is.
//
// Soft, the records are soft-expired record by record first, as on the
// plain table (to the 'infinity' partition), and a partition whose range
// has passed is retired once nothing in it is left to soft-expire: what
// it still holds is moved out, and the empty partition dropped.
func (s *Store) reapPartitioned(ctx context.Context, p store.ReapParams, abandon []any) (store.ReapResult, error) {
	var res store.ReapResult
	now, err := s.instant(ctx)
	if err != nil {
		return res, err
	}
	if err := s.ensurePartitions(ctx, now); err != nil {
		return res, err
	}
	if p.Soft {
		if res, err = s.reapRows(ctx, p, now, abandon); err != nil {
			return res, err
		}
	}
	parts, err := s.partitions(ctx, s.pool)
	if err != nil {
		return res, err
	}
	for _, pt := range parts {
		if pt.hi.After(now) {
			break
		}
		if err := s.retire(ctx, pt, now, p, abandon, &res); err != nil {
			return res, err
		}
	}
	if p.Soft {
		return res, nil
	}
	if left := p.Limit - res.Deleted - res.Abandoned; left > 0 {
		n, err := s.execIndexed(ctx, s.q.reapDefault, left, now)
		if err != nil {
			return res, err
		}
		res.Deleted += int(n)
	}
	if left := p.Limit - res.Deleted - res.Abandoned; left > 0 {
		n, err := s.execIndexed(ctx, s.q.abandonDefault, append([]any{left, now}, abandon...)...)
		if err != nil {
			return res, err
		}
		res.Abandoned += int(n)
	}
	return res, nil
}

// retire removes partition pt, whose range has passed: it abandons the
// partition's in-flight records past expiry as the plain reaper does (up
// to what is left of limit), moves out every other record the plain
// reaper would keep, then detaches and drops the partition.
//
// Nothing moves a record into a partition whose range has passed but to
// make it terminal and expired (reap_after is always now plus a positive
// TTL, or kept): the records counted after the move are the partition's
// for good. The drop checks that through the partition's own indexes
// (unknown, pending and leased records), under the table's lock, and
// gives up for this run if one is there. A leased record is one in
// progress: a terminal record keeps the lease end of its last holder
// (a completion writes no index entry, and a settlement leaves it too),
// which may lie past the partition's range.
func (s *Store) retire(ctx context.Context, pt span, now time.Time, p store.ReapParams, abandon []any, res *store.ReapResult) error {
	err := s.retireListed(ctx, pt, now, p, abandon, res)
	if relationGone(err) {
		// Every instance runs a reaper: another one retired it (what this
		// one abandoned first stays counted, and is in another partition).
		return nil
	}
	return err
}

// retireListed is retire of a partition that partitions() listed, which
// may have been dropped since.
func (s *Store) retireListed(ctx context.Context, pt span, now time.Time, p store.ReapParams, abandon []any, res *store.ReapResult) error {
	part := s.qualified(pt.name)
	// One read of the partition, which counts what it holds and what must
	// stay (usually nothing: the abandon and the move then cost nothing).
	var total, kept int64
	if err := s.pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE `+keeps+`) FROM `+part, now).Scan(&total, &kept); err != nil {
		return err
	}
	if p.Soft && total > kept {
		return nil // records still to soft-expire, not to drop: a later run
	}
	left := int(kept) // still to move out
	if room := p.Limit - res.Deleted - res.Abandoned; kept > 0 && room > 0 {
		n, err := s.execIndexed(ctx, onPartition(s.q.reapAbandonIn, part), append([]any{room, now}, abandon...)...)
		if err != nil {
			return err
		}
		res.Abandoned += int(n)
		left = int(kept - n)
	}
	if left > 0 {
		_, err := s.pool.Exec(ctx, `UPDATE `+s.parent()+` SET reap_after = CASE WHEN state = 'expired' THEN 'infinity'
			ELSE greatest(expires_at, $1::timestamptz) END
			WHERE reap_after >= $2 AND reap_after < $3 AND `+keeps, now, pt.lo, pt.hi)
		if err != nil {
			return err
		}
	}
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if err := s.lockTable(ctx, tx); err != nil {
			return err
		}
		var exists bool
		if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, part).Scan(&exists); err != nil || !exists {
			return err // another reaper retired it
		}
		if _, err := tx.Exec(ctx, `ALTER TABLE `+s.parent()+` DETACH PARTITION `+part); err != nil {
			return err
		}
		var left bool
		err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT FROM `+part+` WHERE reconcile_after IS NOT NULL)
			OR EXISTS (SELECT FROM `+part+` WHERE pending_queue IS NOT NULL)
			OR EXISTS (SELECT FROM `+part+` WHERE locked_until > $1::timestamptz AND state = 'in_progress')`, now).Scan(&left)
		if err != nil {
			return err
		}
		if left {
			return fmt.Errorf("partition %s received records to keep while it was retired; the next reap retires it", pt.name)
		}
		if _, err := tx.Exec(ctx, `DROP TABLE `+part); err != nil {
			return err
		}
		res.Deleted += int(total - kept)
		return nil
	})
}

// batchFrom is the relation the reaper's batches read; onPartition points
// it at one partition (the statements still write through the table, so
// that a record whose reap_after changes moves to its partition).
const batchFrom = "FROM {schema}idem_records r, clock c"

// onPartition points a reaper statement's batch at partition part (a
// qualified name).
func onPartition(sql, part string) string {
	return strings.Replace(sql, partitionMark, part, 1)
}

// partitionMark stands for the partition in the statements onPartition
// completes.
const partitionMark = "{partition}"

// readingFrom makes sql's batch read from relation (a placeholder, or a
// partition's name); it panics if the statement lost its batch.
//
// The statement then names the table first (gate, a CTE nothing reads):
// PostgreSQL locks the relations of a statement as it parses them, the
// CTEs first, and a batch naming the partition first would lock it before
// the table it writes through. Another process's lockTable locks the
// table, then each partition: each would then wait for the other's lock,
// a deadlock, whenever two instances' reapers meet.
func readingFrom(sql, relation string) string {
	if strings.Count(sql, batchFrom) != 1 || strings.Count(sql, reapWith) != 1 {
		panic("idem/postgres: the reaper's statement lost its batch: " + batchFrom)
	}
	sql = strings.Replace(sql, reapWith, "WITH gate AS (SELECT FROM ONLY {schema}idem_records LIMIT 0),\nclock AS (", 1)
	return strings.Replace(sql, batchFrom, "FROM "+relation+" r, clock c", 1)
}

// reapWith opens the reaper's statements that readingFrom points at a
// partition.
const reapWith = "WITH clock AS ("
