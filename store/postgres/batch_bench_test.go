package postgres_test

// A prototype, for measurement only: a store that gathers concurrent
// Reserve calls (and optionally Complete calls) into one multi-row
// statement. BenchmarkEnginePostgres/new runs the engine over it.
//
// Only the fresh-key path is batched: one INSERT ... SELECT FROM unnest(...)
// ON CONFLICT DO NOTHING for the whole batch. A key the insert did not
// create (it exists, or appears twice in the batch) goes through the
// store's own one-key Reserve, which applies the whole state machine. The
// batch uses the database clock (the prototype ignores Config.Clock).

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/postgres"
)

// batchConfig says how a batcher gathers calls.
type batchConfig struct {
	// window is how long a batch waits for more calls after its first;
	// 0 sends what is queued at once (calls queue while batches are in
	// flight, so batches grow with load without a timer). A window under
	// a millisecond lasts a whole one when the process has nothing else
	// to run: the Go runtime then sleeps in epoll_wait, whose timeout is
	// in milliseconds. So a lone request pays about 1ms per batched
	// statement (TestPostgresLatency).
	window time.Duration
	// inFlight bounds the batches sent at once; max the calls per batch.
	inFlight, max int
	// complete batches Complete too.
	complete bool
}

// batchVariants are the prototypes BenchmarkEnginePostgres runs; replay
// marks those it also runs on replays.
var batchVariants = []struct {
	name   string
	cfg    batchConfig
	replay bool
}{
	{"batch-100us", batchConfig{window: 100 * time.Microsecond, inFlight: engineWorkers, max: 64}, false},
	{"batch-100us-both", batchConfig{window: 100 * time.Microsecond, inFlight: engineWorkers, max: 64, complete: true}, true},
	{"batch-queue", batchConfig{inFlight: 4, max: 64}, false},
	{"batch-queue-both", batchConfig{inFlight: 4, max: 64, complete: true}, false},
}

// sqlReserveBatch is the fresh-key branch of sqlReserve for many keys; the
// rows it returns are the keys it created.
const sqlReserveBatch = `
WITH clock AS (
	SELECT coalesce($7::timestamptz, statement_timestamp()) AS now
)
INSERT INTO {schema}idem_records AS r
	(scope, key, fingerprint, state, fence, lease_policy, locked_until,
	 attempts, created_at, updated_at, expires_at)
SELECT u.scope, u.key, u.fingerprint, 'in_progress', 1, u.policy,
	c.now + u.lease * interval '1 microsecond',
	1, c.now, c.now, c.now + u.ttl * interval '1 microsecond'
FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::bigint[], $6::text[])
	AS u(scope, key, fingerprint, lease, ttl, policy), clock c
ON CONFLICT (scope, key) DO NOTHING
RETURNING scope, key, fingerprint, fence, lease_policy, locked_until, attempts,
	created_at, updated_at, expires_at`

// sqlCompleteBatch is sqlComplete for many keys; the rows it returns are
// the keys it completed (the others lost their lease).
const sqlCompleteBatch = `
WITH clock AS (
	SELECT coalesce($9::timestamptz, statement_timestamp()) AS now
)
UPDATE {schema}idem_records AS r SET
	state = 'completed',
	response_status = u.status,
	response_headers = u.headers::jsonb,
	response_body = u.body,
	response_body_omitted = u.omitted,
	last_error = '',
	completed_at = c.now,
	updated_at = c.now,
	expires_at = CASE WHEN u.ttl > 0 THEN c.now + u.ttl * interval '1 microsecond' ELSE r.expires_at END
FROM unnest($1::text[], $2::text[], $3::bigint[], $4::integer[], $5::text[], $6::bytea[],
		$7::boolean[], $8::bigint[])
	AS u(scope, key, fence, status, headers, body, omitted, ttl), clock c
WHERE r.scope = u.scope AND r.key = u.key AND r.state = 'in_progress' AND r.fence = u.fence
RETURNING r.scope, r.key`

// call is one caller's request waiting in a batch.
type call[P, R any] struct {
	p    P
	r    R
	err  error
	done chan struct{}
}

// batcher gathers calls and sends them in batches.
type batcher[P, R any] struct {
	batches, calls atomic.Int64

	cfg  batchConfig
	send func(context.Context, []*call[P, R])
	in   chan *call[P, R]
	slot chan struct{}
	quit chan struct{}
	wg   sync.WaitGroup
}

func newBatcher[P, R any](cfg batchConfig, send func(context.Context, []*call[P, R])) *batcher[P, R] {
	bt := &batcher[P, R]{
		cfg: cfg, send: send,
		in:   make(chan *call[P, R]),
		slot: make(chan struct{}, cfg.inFlight),
		quit: make(chan struct{}),
	}
	bt.wg.Go(bt.loop)
	return bt
}

func (bt *batcher[P, R]) do(ctx context.Context, p P) (R, error) {
	c := &call[P, R]{p: p, done: make(chan struct{})}
	var zero R
	select {
	case bt.in <- c:
	case <-ctx.Done():
		return zero, ctx.Err()
	}
	select {
	case <-c.done:
		return c.r, c.err
	case <-ctx.Done():
		return zero, ctx.Err()
	}
}

func (bt *batcher[P, R]) loop() {
	for {
		var batch []*call[P, R]
		select {
		case c := <-bt.in:
			batch = append(batch, c)
		case <-bt.quit:
			return
		}
		// Wait for a free slot first: calls queue meanwhile and join.
		bt.slot <- struct{}{}
		if bt.cfg.window > 0 {
			timer := time.NewTimer(bt.cfg.window)
		gather:
			for len(batch) < bt.cfg.max {
				select {
				case c := <-bt.in:
					batch = append(batch, c)
				case <-timer.C:
					break gather
				}
			}
			timer.Stop()
		} else {
		drain:
			for len(batch) < bt.cfg.max {
				select {
				case c := <-bt.in:
					batch = append(batch, c)
				default:
					break drain
				}
			}
		}
		bt.batches.Add(1)
		bt.calls.Add(int64(len(batch)))
		bt.wg.Go(func() {
			defer func() { <-bt.slot }()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			bt.send(ctx, batch)
			for _, c := range batch {
				close(c.done)
			}
		})
	}
}

// meanBatch returns the mean number of calls per batch so far.
func (bt *batcher[P, R]) meanBatch() float64 {
	return float64(bt.calls.Load()) / float64(max(1, bt.batches.Load()))
}

func (bt *batcher[P, R]) stop() {
	close(bt.quit)
	bt.wg.Wait()
}

// batchStore is a postgres.Store whose Reserve (and optionally Complete)
// go through batchers.
type batchStore struct {
	*postgres.Store
	pool     *pgxpool.Pool
	reserves *batcher[store.ReserveParams, *store.ReserveResult]
	complets *batcher[store.CompleteParams, bool]
	insert   string
	update   string
}

var _ store.Store = (*batchStore)(nil)

func newBatchStore(s *postgres.Store, schema string, cfg batchConfig) *batchStore {
	bs := &batchStore{
		Store:  s,
		pool:   s.Pool(),
		insert: inSchema(sqlReserveBatch, schema),
		update: inSchema(sqlCompleteBatch, schema),
	}
	bs.reserves = newBatcher(cfg, bs.sendReserves)
	if cfg.complete {
		bs.complets = newBatcher(cfg, bs.sendCompletes)
	}
	return bs
}

func (bs *batchStore) stop() {
	bs.reserves.stop()
	if bs.complets != nil {
		bs.complets.stop()
	}
}

// Reserve creates fresh keys in batches; anything else takes the store's
// one-key path.
func (bs *batchStore) Reserve(ctx context.Context, p store.ReserveParams) (store.ReserveResult, error) {
	if err := p.Validate(); err != nil {
		return store.ReserveResult{}, err
	}
	r, err := bs.reserves.do(ctx, p)
	if err != nil {
		return store.ReserveResult{}, err
	}
	if r == nil {
		return bs.Store.Reserve(ctx, p)
	}
	return *r, nil
}

type scopeKey struct{ scope, key string }

// unique orders a batch by (scope, key), so that concurrent batches take
// their index entries in one order (no deadlock between two batches that
// share keys), and drops calls whose key is already in the batch: those
// are left without a result and take the one-key path.
func unique[P, R any](batch []*call[P, R], id func(P) scopeKey) []*call[P, R] {
	sorted := slices.Clone(batch)
	slices.SortFunc(sorted, func(a, b *call[P, R]) int {
		x, y := id(a.p), id(b.p)
		return cmp.Or(cmp.Compare(x.scope, y.scope), cmp.Compare(x.key, y.key))
	})
	return slices.CompactFunc(sorted, func(a, b *call[P, R]) bool { return id(a.p) == id(b.p) })
}

func (bs *batchStore) sendReserves(ctx context.Context, batch []*call[store.ReserveParams, *store.ReserveResult]) {
	batch = unique(batch, func(p store.ReserveParams) scopeKey { return scopeKey{p.Scope, p.Key} })
	n := len(batch)
	scopes, keys, fps, policies := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	leases, ttls := make([]int64, n), make([]int64, n)
	byKey := make(map[scopeKey]*call[store.ReserveParams, *store.ReserveResult], n)
	for i, c := range batch {
		p := c.p
		scopes[i], keys[i], fps[i], policies[i] = p.Scope, p.Key, p.Fingerprint, string(p.LeasePolicy)
		leases[i], ttls[i] = roundMicros(p.Lease), roundMicros(p.TTL)
		byKey[scopeKey{p.Scope, p.Key}] = c
	}
	fail := func(err error) {
		for _, c := range batch {
			c.r, c.err = nil, fmt.Errorf("idem/postgres: reserve batch: %w", err)
		}
	}
	rows, err := bs.pool.Query(ctx, bs.insert, scopes, keys, fps, leases, ttls, policies, nil)
	if err != nil {
		fail(err)
		return
	}
	defer rows.Close()
	for rows.Next() {
		rec := store.Record{State: store.StateInProgress}
		var policy string
		var attempts int32
		err := rows.Scan(&rec.Scope, &rec.Key, &rec.Fingerprint, &rec.Fence, &policy, &rec.LockedUntil,
			&attempts, &rec.CreatedAt, &rec.UpdatedAt, &rec.ExpiresAt)
		if err != nil {
			fail(err)
			return
		}
		rec.LeasePolicy, rec.Attempts = store.LeasePolicy(policy), int(attempts)
		rec.LockedUntil, rec.CreatedAt = rec.LockedUntil.UTC(), rec.CreatedAt.UTC()
		rec.UpdatedAt, rec.ExpiresAt = rec.UpdatedAt.UTC(), rec.ExpiresAt.UTC()
		byKey[scopeKey{rec.Scope, rec.Key}].r = &store.ReserveResult{Outcome: store.Created, Record: rec}
	}
	if err := rows.Err(); err != nil {
		fail(err)
	}
}

// Complete stores responses in batches when configured to.
func (bs *batchStore) Complete(ctx context.Context, p store.CompleteParams) error {
	if bs.complets == nil || p.Scope == "" || p.Key == "" {
		return bs.Store.Complete(ctx, p)
	}
	done, err := bs.complets.do(ctx, p)
	if err != nil {
		return err
	}
	if !done {
		// Lost its lease, or its key was twice in the batch: the one-key
		// path says which.
		return bs.Store.Complete(ctx, p)
	}
	return nil
}

func (bs *batchStore) sendCompletes(ctx context.Context, batch []*call[store.CompleteParams, bool]) {
	batch = unique(batch, func(p store.CompleteParams) scopeKey { return scopeKey{p.Scope, p.Key} })
	n := len(batch)
	scopes, keys := make([]string, n), make([]string, n)
	fences, ttls := make([]int64, n), make([]int64, n)
	statuses := make([]int32, n)
	headers := make([]*string, n)
	bodies := make([][]byte, n)
	omitted := make([]bool, n)
	byKey := make(map[scopeKey]*call[store.CompleteParams, bool], n)
	for i, c := range batch {
		p := c.p
		scopes[i], keys[i], fences[i], ttls[i] = p.Scope, p.Key, p.Fence, roundMicros(p.TTL)
		statuses[i], omitted[i] = int32(p.Response.Status), p.Response.BodyOmitted
		if p.Response.Header != nil {
			h, _ := json.Marshal(p.Response.Header) // a map of string slices always encodes
			s := string(h)
			headers[i] = &s
		}
		if !omitted[i] {
			bodies[i] = p.Response.Body
			if bodies[i] == nil {
				bodies[i] = []byte{}
			}
		}
		byKey[scopeKey{p.Scope, p.Key}] = c
	}
	rows, err := bs.pool.Query(ctx, bs.update, scopes, keys, fences, statuses, headers, bodies, omitted, ttls, nil)
	if err == nil {
		defer rows.Close()
		for rows.Next() {
			var k scopeKey
			if err = rows.Scan(&k.scope, &k.key); err != nil {
				break
			}
			byKey[k].r = true
		}
		if err == nil {
			err = rows.Err()
		}
	}
	if err != nil {
		for _, c := range batch {
			c.r, c.err = false, fmt.Errorf("idem/postgres: complete batch: %w", err)
		}
	}
}

// roundMicros is the store's rounding of durations: up to whole
// microseconds.
func roundMicros(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Microsecond - 1) / time.Microsecond)
}
