package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem/cmd/idem/internal/tools/benchloop"
	"github.com/idem-go/idem/maintenance"
	"github.com/idem-go/idem/store"
)

// op is one measured call; i is a random record of the fill (replay, get),
// drawn by pick from the table's rows (later when nil).
type op struct {
	name string
	call func(ctx context.Context, s store.Store, i int) error
	pick func(rows int) int
}

// later draws from the later half of the fill, which expires in 12h or
// more: a record anywhere in the last half day of traffic.
func later(rows int) int { return rows/2 + rand.IntN(rows-rows/2) }

// recent draws from the last 1% of the fill (at least one record), the
// last quarter hour of a day of traffic: where a client's retry of a
// request lands, seconds to minutes after it.
func recent(rows int) int {
	n := max(rows/100, 1)
	return rows - n + rand.IntN(n)
}

var response = store.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}},
	Body: []byte(`{"id":"00000000-0000-0000-0000-000000000000","status":"created"}`)}

var ops = []op{
	{name: "new", call: func(ctx context.Context, s store.Store, _ int) error {
		k := newKey()
		res, err := s.Reserve(ctx, store.ReserveParams{Scope: scopeOf(rand.IntN(1000)), Key: k,
			Fingerprint: k, Lease: 30 * time.Second, TTL: 24 * time.Hour, LeasePolicy: store.LeaseUnknown})
		if err != nil {
			return err
		}
		if res.Outcome != store.Created {
			return fmt.Errorf("new key: outcome %v", res.Outcome)
		}
		return s.Complete(ctx, store.CompleteParams{Response: response, TTL: 24 * time.Hour,
			FenceParams: store.FenceParams{Scope: res.Record.Scope, Key: k, Fence: res.Record.Fence}})
	}},
	{name: "replay", call: replay},
	{name: "replay-recent", call: replay, pick: recent},
	{name: "get", call: func(ctx context.Context, s store.Store, i int) error {
		_, err := s.Get(ctx, scopeOf(i), keyOf(i))
		return err
	}},
}

// newKeys counts the new keys of -keys ordered, numbered from 1<<40: after
// every record's, those of the fill and of the next day's inserts included.
var newKeys atomic.Int64

// newKey returns a key no record has.
func newKey() string {
	if orderedKeys {
		return keyOf(1<<40 + int(newKeys.Add(1)))
	}
	return randHex(16)
}

// replay reserves record i of the fill again, as a retry of its request.
func replay(ctx context.Context, s store.Store, i int) error {
	res, err := s.Reserve(ctx, store.ReserveParams{Scope: scopeOf(i), Key: keyOf(i),
		Fingerprint: fingerprintOf(i), Lease: 30 * time.Second, TTL: 24 * time.Hour, LeasePolicy: store.LeaseUnknown})
	if err == nil && (res.Outcome != store.Existing || res.Record.State != store.StateCompleted) {
		err = fmt.Errorf("replay of %d: outcome %v, state %v", i, res.Outcome, res.Record.State)
	}
	return err
}

// emptyKeys is how many records the empty schema holds for its replays
// and gets: a few, all in memory, as on a store just put in service.
const emptyKeys = 1000

// latencies runs each op with workers clients and with one, in slices
// alternating between the schemas, and prints p50/p99 and the ratios of
// the second's to the first's.
func (b *bench) latencies(ctx context.Context, first, second *schema) error {
	b.checkpoint(ctx)
	for _, o := range ops {
		for _, workers := range []int{b.o.workers, 1} {
			var lat [2][]time.Duration
			for range b.o.rounds {
				for j, s := range []*schema{first, second} {
					got, err := b.slice(ctx, s.store, o, workers, s.rows)
					if err != nil {
						return fmt.Errorf("%s on %s: %w", o.name, s.name, err)
					}
					lat[j] = append(lat[j], got...)
				}
			}
			e50, e99 := percentiles(lat[0])
			l50, l99 := percentiles(lat[1])
			a, z := first.label, second.label
			fmt.Fprintf(b.w, "latency op=%s workers=%d %s_ops=%d %s_ops=%d %s_p50_us=%d %s_p99_us=%d %s_p50_us=%d %s_p99_us=%d p50_ratio=%.2f p99_ratio=%.2f\n",
				o.name, workers, a, len(lat[0]), z, len(lat[1]), a, e50.Microseconds(), a, e99.Microseconds(), z,
				l50.Microseconds(), z, l99.Microseconds(), float64(l50)/float64(e50), float64(l99)/float64(e99))
		}
	}
	return nil
}

// checkpoint writes out what the fill left dirty in shared_buffers before
// the slices start, so that they do not share the disk with a checkpoint
// of the fill (with a large shared_buffers that is gigabytes). It needs
// the pg_checkpoint role or a superuser; without, the run goes on and says
// so on stderr.
func (b *bench) checkpoint(ctx context.Context) {
	t := time.Now()
	if _, err := b.admin.Exec(ctx, "CHECKPOINT"); err != nil {
		fmt.Fprintf(os.Stderr, "checkpoint skipped: %v\n", err)
		return
	}
	fmt.Fprintf(b.w, "checkpoint seconds=%.1f\n", time.Since(t).Seconds())
}

// slice runs o with workers closed-loop clients for one slice. Calls are
// never cut: a client starts none after the end of the slice.
func (b *bench) slice(ctx context.Context, s store.Store, o op, workers, rows int) ([]time.Duration, error) {
	pick := o.pick
	if pick == nil {
		pick = later
	}
	lat, _, err := benchloop.Run(workers, b.o.slice, func(int) error {
		return o.call(ctx, s, pick(rows))
	})
	return lat, err
}

func percentiles(d []time.Duration) (p50, p99 time.Duration) {
	if len(d) == 0 {
		return 0, 0
	}
	slices.Sort(d)
	return d[len(d)/2], d[len(d)*99/100]
}

// sqlHeld counts what may keep VACUUM from removing tuples deleted by
// transactions older than $1 (a xid8): the other sessions of this database
// (and those of none, such as WAL senders) whose snapshot or transaction is
// older, replication slots and prepared transactions as old.
const sqlHeld = `
WITH e AS (SELECT age(xid($1::xid8)) AS a)
SELECT (SELECT count(*) FROM pg_stat_activity, e WHERE pid <> pg_backend_pid()
		AND (datname = current_database() OR datid IS NULL)
		AND (age(backend_xmin) > e.a OR age(backend_xid) > e.a))
	+ (SELECT count(*) FROM pg_replication_slots, e WHERE age(xmin) > e.a)
	+ (SELECT count(*) FROM pg_prepared_xacts, e WHERE database = current_database() AND age(transaction) > e.a)`

// reap removes the first of -days days of records with the product's
// reaper, then inserts as many new records again, and reports the costs,
// its stages named with prefix (and its reap line with the label).
func (b *bench) reap(ctx context.Context, large *schema, prefix string) error {
	// The first day's records expire by base + day; so does its partition.
	shift := time.Until(b.o.base.Add(b.o.day()))
	s, err := b.open(ctx, large.name, large.label, large.rows, large.partitioned, func() time.Time { return time.Now().Add(shift) })
	if err != nil {
		return err
	}
	// Closed once the reaper is done, for settle.
	closed := false
	defer func() {
		if !closed {
			s.store.Close()
		}
	}()
	// No pause between batches: the time is the work; the product's pause
	// (maintenance.DefaultBatchPause) adds its own, reported apart.
	m, err := maintenance.New(s.store, maintenance.Config{BatchSize: b.o.batch, BatchPause: time.Microsecond})
	if err != nil {
		return err
	}
	var lsn0, lsn1 string
	b.admin.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&lsn0)
	start := time.Now()
	res, err := m.ReapOnce(ctx)
	took := time.Since(start)
	if err != nil {
		return fmt.Errorf("reap: %w", err)
	}
	var wal int64
	b.admin.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text, pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::bigint", lsn0).Scan(&lsn1, &wal)
	batches := (res.Deleted + b.o.batch - 1) / b.o.batch
	stage := ""
	if prefix != "" {
		stage = " stage=" + large.label
	}
	fmt.Fprintf(b.w, "reap%s deleted=%d batches=%d seconds=%.1f rows_per_s=%.0f ms_per_batch=%.2f wal_bytes=%d wal_bytes_per_row=%.0f paced_seconds=%.0f\n",
		stage, res.Deleted, batches, took.Seconds(), float64(res.Deleted)/took.Seconds(),
		float64(took.Milliseconds())/float64(max(batches, 1)), wal, float64(wal)/float64(max(res.Deleted, 1)),
		took.Seconds()+float64(batches)*0.75*maintenance.DefaultBatchPause.Seconds())
	// The next transaction number: every deletion of the reaper's is older.
	var after string
	if err := b.admin.QueryRow(ctx, "SELECT pg_snapshot_xmax(pg_current_snapshot())::text").Scan(&after); err != nil {
		return fmt.Errorf("reap: %w", err)
	}
	s.store.Close()
	closed = true
	if err := b.settle(ctx); err != nil {
		return err
	}
	if err := b.sizes(ctx, large, prefix+"reaped"); err != nil {
		return err
	}
	// VACUUM removes only the dead tuples no snapshot may still see: a
	// session of the server's (in this database, or a replication slot or
	// a prepared transaction) with a snapshot or transaction older than the
	// reaper's deletions holds them back, and VACUUM counts them dead.
	var held int
	if err := b.admin.QueryRow(ctx, sqlHeld, after).Scan(&held); err != nil {
		return fmt.Errorf("vacuum horizon: %w", err)
	}
	t := time.Now()
	if _, err := b.admin.Exec(ctx, "VACUUM "+large.table); err != nil {
		return err
	}
	fmt.Fprintf(b.w, "vacuum seconds=%.1f held_by=%d\n", time.Since(t).Seconds(), held)
	// VACUUM has set the table's counts itself.
	if err := b.sizes(ctx, large, prefix+"vacuumed"); err != nil {
		return err
	}
	return b.fill(ctx, large, prefix+"next_day", b.o.n, res.Deleted, b.o.n)
}
