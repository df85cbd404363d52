package postgres_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-go/idem/store/postgres"
)

// BenchmarkBatchStatements sends a batch of 8 Reserves on one connection,
// as 8 single statements in one pipeline (single) or as one multi-row
// statement (many), for keys with a completed record (replay) or new keys
// (new), and reports the server backend's CPU per call (pg-cpu-us/op, from
// /proc when the server runs on this machine) besides the time.
func BenchmarkBatchStatements(b *testing.B) {
	const existing = 20000
	ctx := context.Background()
	schema := newSchema(b)
	openStore(b, schema, nil) // runs the migrations
	pcfg, err := pgxpool.ParseConfig(withSearchPath(b, schema))
	if err != nil {
		b.Fatal(err)
	}
	pcfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `INSERT INTO idem_records (scope, key, fingerprint, state, fence, lease_policy,
		locked_until, attempts, created_at, updated_at, expires_at, response_status, response_body, completed_at)
		SELECT 's', 'k' || g, 'fp', 'completed', 1, 'unknown', now(), 1, now(), now(), now() + interval '1 day',
			201, '\x7b7d', now()
		FROM generate_series(1, $1::int) g`, existing); err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "ANALYZE idem_records"); err != nil {
		b.Fatal(err)
	}
	single, many := postgres.Filled(postgres.SQLReserve, ""), postgres.Filled(postgres.SQLReserveMany, "")
	cpu := newCPUMeter(ctx, pool)
	run := 0
	for _, batch := range []int{3, 8} {
		for _, keys := range []string{"replay", "new"} {
			for _, form := range []string{"single", "many"} {
				b.Run(fmt.Sprintf("%d/%s/%s", batch, keys, form), func(b *testing.B) {
					run++
					_, server0 := cpu.read()
					calls := 0
					for i := 0; b.Loop(); i++ {
						var pb pgx.Batch
						scopes, ks, fps, policies, tenants := make([]string, batch), make([]string, batch), make([]string, batch), make([]string, batch), make([]string, batch)
						leases, ttls, owners := make([]int64, batch), make([]int64, batch), make([]int64, batch)
						nows := make([]pgtype.Timestamptz, batch)
						for j := range batch {
							k := fmt.Sprint("k", 1+(i*batch+j)%existing)
							if keys == "new" {
								k = fmt.Sprintf("n%d-%d-%d", run, i, j)
							}
							scopes[j], ks[j], fps[j], policies[j] = "s", k, "fp", "unknown"
							leases[j], ttls[j] = int64(30*time.Second/time.Microsecond), int64(24*time.Hour/time.Microsecond)
							if form == "single" {
								pb.Queue(single, "s", k, "fp", leases[j], ttls[j], "unknown", nil, "", int64(j))
							}
						}
						if form == "many" {
							pb.Queue(many, scopes, ks, fps, leases, ttls, policies, nows, tenants, owners)
						}
						if err := pool.SendBatch(ctx, &pb).Close(); err != nil {
							b.Fatal(err)
						}
						calls += batch
					}
					if _, server := cpu.read(); cpu.server {
						b.ReportMetric(float64((server-server0).Microseconds())/float64(calls), "pg-cpu-us/op")
					}
					b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(calls), "ns/call")
				})
			}
		}
	}
}
