package postgres_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/postgres"
)

// The benchmarks run requests from several goroutines per CPU, as a server
// would (the work is bound by database latency, not by Go CPU), on a pool
// large enough that none of them waits for a connection.
const (
	benchParallelism = 4
	benchConns       = 16
)

// benchPool opens a pool on a fresh, migrated schema.
func benchPool(b *testing.B) (*pgxpool.Pool, string) {
	b.Helper()
	schema := newSchema(b)
	pcfg, err := pgxpool.ParseConfig(testURL(b))
	if err != nil {
		b.Fatal(err)
	}
	pcfg.MaxConns = benchConns
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	s, err := postgres.New(context.Background(), pool, postgres.Config{Schema: schema})
	if err != nil {
		b.Fatal(err)
	}
	s.Close()
	return pool, schema
}

func benchStore(b *testing.B) *postgres.Store {
	b.Helper()
	pool, schema := benchPool(b)
	s, err := postgres.New(context.Background(), pool, postgres.Config{Schema: schema, SkipMigrate: true})
	if err != nil {
		b.Fatal(err)
	}
	return s
}

var benchResponse = store.Response{
	Status: 201,
	Header: map[string][]string{"Content-Type": {"application/json"}},
	Body:   []byte(`{"id":"pay_1","amount":100,"currency":"EUR"}`),
}

// BenchmarkReserveComplete: one new request, reserve then complete;
// BenchmarkReserveCompleteCapped: the same under a tenant cap that is never
// reached (what the cap's count and lock cost).
func BenchmarkReserveComplete(b *testing.B) { benchReserveComplete(b, 0) }

func BenchmarkReserveCompleteCapped(b *testing.B) { benchReserveComplete(b, 1_000_000) }

func benchReserveComplete(b *testing.B, maxActive int) {
	s := benchStore(b)
	ctx := context.Background()
	var seq atomic.Int64
	b.SetParallelism(benchParallelism)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			p := reserveParams(fmt.Sprint("new-", seq.Add(1)))
			if maxActive > 0 {
				p.Tenant, p.MaxActive = "acme", maxActive
			}
			r, err := s.Reserve(ctx, p)
			if err != nil || r.Outcome != store.Created {
				b.Fatalf("reserve: %v %v", r.Outcome, err)
			}
			err = s.Complete(ctx, store.CompleteParams{
				FenceParams: store.FenceParams{Scope: p.Scope, Key: p.Key, Fence: r.Record.Fence},
				Response:    benchResponse,
			})
			if err != nil {
				b.Fatal(err)
			}
		}
	})
}

const replayKeys = 1000

// BenchmarkReplay: retries of completed requests.
func BenchmarkReplay(b *testing.B) {
	s := benchStore(b)
	ctx := context.Background()
	for i := range replayKeys {
		p := reserveParams(fmt.Sprint("done-", i))
		r, err := s.Reserve(ctx, p)
		if err != nil {
			b.Fatal(err)
		}
		if err := s.Complete(ctx, store.CompleteParams{FenceParams: store.FenceParams{Scope: p.Scope, Key: p.Key, Fence: r.Record.Fence}, Response: benchResponse}); err != nil {
			b.Fatal(err)
		}
	}
	var seq atomic.Int64
	b.SetParallelism(benchParallelism)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			p := reserveParams(fmt.Sprint("done-", seq.Add(1)%replayKeys))
			r, err := s.Reserve(ctx, p)
			if err != nil || r.Outcome != store.Existing || r.Record.State != store.StateCompleted {
				b.Fatalf("replay: %v %v %v", r.Outcome, r.Record.State, err)
			}
		}
	})
}

// Textbook statements: the least a reserve, a complete and a replay can
// ask of PostgreSQL, with none of the store's state machine.
const (
	minimalInsert = `
INSERT INTO {schema}idem_records
	(scope, key, fingerprint, state, fence, lease_policy, locked_until, attempts,
	 created_at, updated_at, expires_at)
VALUES ($1, $2, $3, 'in_progress', 1, 'unknown', now() + interval '30 seconds', 1,
	now(), now(), now() + interval '24 hours')
ON CONFLICT (scope, key) DO NOTHING
RETURNING fence`
	minimalComplete = `
UPDATE {schema}idem_records SET state = 'completed', response_status = $4,
	response_headers = $5, response_body = $6, completed_at = now(), updated_at = now()
WHERE scope = $1 AND key = $2 AND fence = $3 AND state = 'in_progress'`
	minimalSelect = `
SELECT fingerprint, state, fence, response_status, response_headers, response_body
FROM {schema}idem_records WHERE scope = $1 AND key = $2`
)

// BenchmarkCeiling runs the same requests three ways, interleaved in every
// goroutine so that all three see the same machine load at the same time:
//
//   - store: through the Store (validation, Record scanning, header JSON);
//   - store_sql: the store's own statements sent straight through pgx, with
//     no store code around them;
//   - minimal_sql: textbook statements with none of the state machine
//     (INSERT ... ON CONFLICT DO NOTHING + UPDATE; a point SELECT).
//
// It reports each one's latency (ns/req) and the ratios: store/store_sql is
// the cost of the Go layer, store_sql/minimal_sql the cost of the
// one-statement state machine over the textbook statements.
func BenchmarkCeiling(b *testing.B) {
	headers := []byte(`{"Content-Type":["application/json"]}`)
	b.Run("reserve_complete", func(b *testing.B) {
		pool, schema := benchPool(b)
		s, err := postgres.New(context.Background(), pool, postgres.Config{Schema: schema, SkipMigrate: true})
		if err != nil {
			b.Fatal(err)
		}
		reserve, complet := inSchema(postgres.SQLReserve, schema), inSchema(postgres.SQLComplete, schema)
		minIns, minUpd := inSchema(minimalInsert, schema), inSchema(minimalComplete, schema)
		ctx := context.Background()
		var seq atomic.Int64
		ways := []func(p store.ReserveParams) error{
			func(p store.ReserveParams) error { // store
				r, err := s.Reserve(ctx, p)
				if err != nil {
					return err
				}
				return s.Complete(ctx, store.CompleteParams{
					FenceParams: store.FenceParams{Scope: p.Scope, Key: p.Key, Fence: r.Record.Fence},
					Response:    benchResponse,
				})
			},
			func(p store.ReserveParams) error { // store_sql
				var fence int64
				err := pool.QueryRow(ctx, reserve, p.Scope, p.Key, p.Fingerprint, p.Lease.Microseconds(),
					p.TTL.Microseconds(), string(p.LeasePolicy), nil, "", int64(0)).Scan(scanDest(&fence)...)
				if err != nil {
					return err
				}
				return expectOne(pool.Exec(ctx, complet, p.Scope, p.Key, fence, nil,
					benchResponse.Status, headers, benchResponse.Body, false, int64(0)))
			},
			func(p store.ReserveParams) error { // minimal_sql
				var fence int64
				if err := pool.QueryRow(ctx, minIns, p.Scope, p.Key, p.Fingerprint).Scan(&fence); err != nil {
					return err
				}
				return expectOne(pool.Exec(ctx, minUpd, p.Scope, p.Key, fence,
					benchResponse.Status, headers, benchResponse.Body))
			},
		}
		runInterleaved(b, ways, func() store.ReserveParams {
			return reserveParams(fmt.Sprint("new-", seq.Add(1)))
		})
	})
	b.Run("replay", func(b *testing.B) {
		pool, schema := benchPool(b)
		s, err := postgres.New(context.Background(), pool, postgres.Config{Schema: schema, SkipMigrate: true})
		if err != nil {
			b.Fatal(err)
		}
		ctx := context.Background()
		for i := range replayKeys {
			p := reserveParams(fmt.Sprint("done-", i))
			r, err := s.Reserve(ctx, p)
			if err != nil {
				b.Fatal(err)
			}
			if err := s.Complete(ctx, store.CompleteParams{FenceParams: store.FenceParams{Scope: p.Scope, Key: p.Key, Fence: r.Record.Fence}, Response: benchResponse}); err != nil {
				b.Fatal(err)
			}
		}
		reserve, minSel := inSchema(postgres.SQLReserve, schema), inSchema(minimalSelect, schema)
		var seq atomic.Int64
		ways := []func(p store.ReserveParams) error{
			func(p store.ReserveParams) error { // store
				r, err := s.Reserve(ctx, p)
				if err == nil && r.Record.State != store.StateCompleted {
					err = fmt.Errorf("replay saw %s", r.Record.State)
				}
				return err
			},
			func(p store.ReserveParams) error { // store_sql
				var fence int64
				return pool.QueryRow(ctx, reserve, p.Scope, p.Key, p.Fingerprint, p.Lease.Microseconds(),
					p.TTL.Microseconds(), string(p.LeasePolicy), nil, "", int64(0)).Scan(scanDest(&fence)...)
			},
			func(p store.ReserveParams) error { // minimal_sql
				var (
					fp, state string
					fence     int64
					status    int32
					hdr, body []byte
				)
				return pool.QueryRow(ctx, minSel, p.Scope, p.Key).Scan(&fp, &state, &fence, &status, &hdr, &body)
			},
		}
		runInterleaved(b, ways, func() store.ReserveParams {
			return reserveParams(fmt.Sprint("done-", seq.Add(1)%replayKeys))
		})
	})
}

var ceilingWays = []string{"store", "store_sql", "minimal_sql"}

// runInterleaved runs every way once per iteration, rotating which goes
// first, and reports each way's mean latency and the ratios.
func runInterleaved(b *testing.B, ways []func(store.ReserveParams) error, next func() store.ReserveParams) {
	var total [3]atomic.Int64
	var rot atomic.Int64
	b.SetParallelism(benchParallelism)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			first := int(rot.Add(1))
			for j := range ways {
				w := (first + j) % len(ways)
				p := next()
				start := time.Now()
				if err := ways[w](p); err != nil {
					b.Fatalf("%s: %v", ceilingWays[w], err)
				}
				total[w].Add(int64(time.Since(start)))
			}
		}
	})
	b.StopTimer()
	per := func(w int) float64 { return float64(total[w].Load()) / float64(b.N) }
	for w, name := range ceilingWays {
		b.ReportMetric(per(w), name+"-ns/req")
	}
	b.ReportMetric(per(0)/per(1), "store/store_sql")
	b.ReportMetric(per(1)/per(2), "store_sql/minimal_sql")
	b.ReportMetric(per(0)/per(2), "store/minimal_sql")
}

func expectOne(tag pgconn.CommandTag, err error) error {
	if err == nil && tag.RowsAffected() != 1 {
		err = fmt.Errorf("%d rows affected, want 1", tag.RowsAffected())
	}
	return err
}

// scanDest keeps the fence and skips the other columns (a nil destination
// skips a column in pgx).
func scanDest(fence *int64) []any {
	dest := make([]any, 23) // action + 22 record columns; fence is the 6th
	dest[5] = fence
	return dest
}

func inSchema(sql, schema string) string {
	return postgres.Filled(sql, schema)
}
