package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem/store"
)

// The tenant cap (store.ReserveParams.MaxActive).
//
// A capped Reserve sends two statements in one pipeline, one round trip
// and one implicit transaction: a transaction-scoped advisory lock on the
// tenant, then sqlReserveCapped. Under READ COMMITTED the second statement
// takes its snapshot once the lock is held, so it sees every record the
// tenant's previous holder of the lock committed: counting and writing are
// one step per tenant, across every process sharing the database.
//
// sqlReserveCapped is sqlReserve with the count as one more CTE, and the
// insert and the moves that make a record active (replace, reclaim)
// guarded by it. A refused write looks like a lost race to the statement
// ('stale', or no row); Reserve then counts again, outside the lock, and
// answers ErrOverCap when the tenant is still at its cap, or runs the
// statement again when a place was freed meanwhile.

// sqlActive counts a tenant's active records (store.State.Active), through
// the partial index idem_records_cap_idx: active_tenant is the tenant while
// the record is active, on a store with Config.TenantCap. $8 tenant, $10 cap.
const sqlActive = `SELECT count(*) FROM {schema}idem_records
	WHERE active_tenant = $8`

var sqlReserveCapped = capped(sqlReserve)

// sqlCountActive counts the active records of every tenant through the
// same partial index, stopping at $1 (store.ActiveCounter): only a store
// with Config.TenantCap keeps active_tenant.
const sqlCountActive = `SELECT count(*) FROM (SELECT FROM {schema}idem_records
	WHERE active_tenant IS NOT NULL LIMIT $1) a`

// sqlActiveAlone is sqlActive as a statement of its own: $1 tenant.
var sqlActiveAlone = strings.Replace(sqlActive, "$8", "$1", 1)

// sqlTenantLock serialises the capped reservations of one tenant until the
// end of the transaction, and reports the transaction's isolation level.
// The key is a hash of the tenant, in a name space of its own; two tenants
// sharing a hash only wait for each other.
const sqlTenantLock = `SELECT current_setting('transaction_isolation'), pg_advisory_xact_lock(hashtextextended('idem/tenant:' || $1::text, 0))`

// errCapRepeatableRead refuses a capped reservation in a REPEATABLE READ
// transaction: its snapshot predates the tenant's lock, so its count would
// miss the records that the lock's previous holders committed, and two
// such transactions would both find room under the cap. SERIALIZABLE
// catches the two readers instead.
var errCapRepeatableRead = errors.Join(store.ErrInvalidParams,
	errors.New("a reservation under a tenant cap (MaxActive) counts the tenant's records under READ COMMITTED or SERIALIZABLE only, not REPEATABLE READ"))

// capped adds the cap to the reservation statement.
func capped(q string) string {
	for _, r := range [][2]string{
		{"\ncur AS (", "\ncap AS (SELECT (" + sqlActive + ") < $10::bigint AS ok),\ncur AS ("},
		{"WHERE NOT EXISTS (SELECT FROM cur)\n", "WHERE NOT EXISTS (SELECT FROM cur) AND (SELECT ok FROM cap)\n"},
		{"\t\tAND r.state = cur.state AND r.fence = cur.fence\n",
			"\t\tAND r.state = cur.state AND r.fence = cur.fence\n" +
				"\t\tAND (cur.action NOT IN ('replace', 'reclaim') OR (SELECT ok FROM cap))\n"},
	} {
		if !strings.Contains(q, r[0]) {
			panic("idem/postgres: the reservation statement lost the place of the tenant cap: " + r[0])
		}
		q = strings.Replace(q, r[0], r[1], 1)
	}
	return q
}

// reserveCapped runs one capped reservation. refused reports that the
// statement wrote nothing where it wanted to write (over the cap, or a
// race: the caller tells them apart).
func (s *Store) reserveCapped(ctx context.Context, q querier, p *store.ReserveParams, args []any) (op *batchOp, refused bool) {
	args = append(args, p.MaxActive)
	op = &batchOp{}
	if s.partitioned() {
		// The key's lock too, after the tenant's (partition.go).
		op.err = s.lockedRow(ctx, q, &pgx.QueuedQuery{SQL: sqlTenantLock, Arguments: []any{p.Tenant}}, p.Scope, p.Key,
			s.q.reserveCapped, args, func(row pgx.Row) error { return scanRecord(row, &op.rec, &op.action) })
	} else if tx, ok := q.(pgx.Tx); ok {
		var iso string
		if err := tx.QueryRow(ctx, sqlTenantLock, p.Tenant).Scan(&iso, nil); err != nil {
			return &batchOp{err: err}, false
		}
		if iso == "repeatable read" {
			return &batchOp{err: errCapRepeatableRead}, false
		}
		op.err = scanRecord(tx.QueryRow(ctx, s.q.reserveCapped, args...), &op.rec, &op.action)
	} else {
		var b pgx.Batch
		b.Queue(sqlTenantLock, p.Tenant)
		b.Queue(s.q.reserveCapped, args...)
		op.err = s.acknowledged(ctx, s.pool, func(q querier) error {
			br := q.SendBatch(ctx, &b)
			_, err := br.Exec()
			if err == nil {
				err = scanRecord(br.QueryRow(), &op.rec, &op.action)
			}
			if cerr := br.Close(); err == nil {
				err = cerr
			}
			return err
		})
	}
	return op, errors.Is(op.err, pgx.ErrNoRows) || (op.err == nil && op.action == "stale")
}

// TenantCapUnsupported implements store.CapRefuser: it says why the store
// refuses a cap, or returns "" on a store that counts (Config.TenantCap).
func (s *Store) TenantCapUnsupported() string {
	if s.cfg.TenantCap {
		return ""
	}
	return "the PostgreSQL store counts active records only with postgres.Config.TenantCap " +
		"(the proxy sets it with --tenant-max-active or --store-max-active), which costs completions their heap-only updates"
}

func (s *Store) capUnsupported(op string) error {
	return fmt.Errorf("idem/postgres: %s: %w: %s", op, store.ErrCapUnsupported, s.TenantCapUnsupported())
}

// atCap reports whether the tenant holds p.MaxActive active records.
func (s *Store) atCap(ctx context.Context, q querier, p *store.ReserveParams) (bool, error) {
	n, err := s.active(ctx, q, p.Tenant)
	if err != nil {
		return false, err
	}
	return n >= p.MaxActive, nil
}

// active counts the tenant's active records.
func (s *Store) active(ctx context.Context, q querier, tenant string) (int, error) {
	var n int64
	if err := q.QueryRow(ctx, s.q.active, tenant).Scan(&n); err != nil {
		return 0, fmt.Errorf("counting active records: %w", err)
	}
	return int(n), nil
}

// CountActive implements store.ActiveCounter.
func (s *Store) CountActive(ctx context.Context, limit int) (int, error) {
	if err := store.CheckActiveLimit(limit); err != nil {
		return 0, err
	}
	if !s.cfg.TenantCap {
		return 0, s.capUnsupported("count active")
	}
	var n int64
	if err := s.pool.QueryRow(ctx, s.q.countActive, limit).Scan(&n); err != nil {
		return 0, wrap(ctx, "count active", err)
	}
	return int(n), nil
}
