package postgres_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
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

// BenchmarkReserveComplete: one new request, reserve then complete.
func BenchmarkReserveComplete(b *testing.B) {
	s := benchStore(b)
	ctx := context.Background()
	var seq atomic.Int64
	b.SetParallelism(benchParallelism)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			p := reserveParams(fmt.Sprint("new-", seq.Add(1)))
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

// BenchmarkCeiling runs SQL straight through pgx with no store code around
// it, on the same pool settings and parallelism, so one run gives both
// ratios: store/store_sql is the cost of the Go layer (validation,
// scanning into a Record, header JSON), store_sql/minimal_sql the cost of
// the one-statement state machine over the textbook statements.
func BenchmarkCeiling(b *testing.B) {
	headers := []byte(`{"Content-Type":["application/json"]}`)
	for _, c := range []struct {
		name             string
		reserve, complet string
		reserveArgs      func(p store.ReserveParams) []any
		completeArgs     func(p store.ReserveParams, fence int64) []any
	}{
		{
			name:    "store_sql",
			reserve: postgres.SQLReserve, complet: postgres.SQLComplete,
			reserveArgs: func(p store.ReserveParams) []any {
				return []any{p.Scope, p.Key, p.Fingerprint, p.Lease.Microseconds(), p.TTL.Microseconds(), string(p.LeasePolicy), nil}
			},
			completeArgs: func(p store.ReserveParams, fence int64) []any {
				return []any{p.Scope, p.Key, fence, nil, benchResponse.Status, headers, benchResponse.Body, false, int64(0)}
			},
		},
		{
			name:    "minimal_sql",
			reserve: minimalInsert, complet: minimalComplete,
			reserveArgs: func(p store.ReserveParams) []any { return []any{p.Scope, p.Key, p.Fingerprint} },
			completeArgs: func(p store.ReserveParams, fence int64) []any {
				return []any{p.Scope, p.Key, fence, benchResponse.Status, headers, benchResponse.Body}
			},
		},
	} {
		b.Run("reserve_complete/"+c.name, func(b *testing.B) {
			pool, schema := benchPool(b)
			reserve, complet := inSchema(c.reserve, schema), inSchema(c.complet, schema)
			ctx := context.Background()
			var seq atomic.Int64
			b.SetParallelism(benchParallelism)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					p := reserveParams(fmt.Sprint("new-", seq.Add(1)))
					row := pool.QueryRow(ctx, reserve, c.reserveArgs(p)...)
					var fence int64
					dest := scanDest(c.name, &fence)
					if err := row.Scan(dest...); err != nil {
						b.Fatal(err)
					}
					tag, err := pool.Exec(ctx, complet, c.completeArgs(p, fence)...)
					if err != nil || tag.RowsAffected() != 1 {
						b.Fatalf("complete: %v %v", tag, err)
					}
				}
			})
		})
	}
	for _, c := range []struct{ name, sql string }{
		{"store_sql", postgres.SQLReserve},
		{"minimal_sql", minimalSelect},
	} {
		b.Run("replay/"+c.name, func(b *testing.B) {
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
			sql := inSchema(c.sql, schema)
			var seq atomic.Int64
			b.SetParallelism(benchParallelism)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					p := reserveParams(fmt.Sprint("done-", seq.Add(1)%replayKeys))
					args := []any{p.Scope, p.Key}
					if c.name == "store_sql" {
						args = []any{p.Scope, p.Key, p.Fingerprint, p.Lease.Microseconds(), p.TTL.Microseconds(), string(p.LeasePolicy), nil}
					}
					rows, err := pool.Query(ctx, sql, args...)
					if err != nil {
						b.Fatal(err)
					}
					n := 0
					for rows.Next() {
						n++
					}
					if rows.Err() != nil || n != 1 {
						b.Fatalf("replay: %d rows, %v", n, rows.Err())
					}
				}
			})
		})
	}
}

// scanDest keeps the fence and skips the other columns (a nil destination
// skips a column in pgx).
func scanDest(name string, fence *int64) []any {
	if name == "minimal_sql" {
		return []any{fence}
	}
	dest := make([]any, 21) // action + 20 record columns; fence is the 6th
	dest[5] = fence
	return dest
}

func inSchema(sql, schema string) string {
	return strings.ReplaceAll(sql, "{schema}", pgx.Identifier{schema}.Sanitize()+".")
}
