package idem_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"os"
	"strings"
	"testing"

	gomysql "github.com/go-sql-driver/mysql"
	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/mysql"
	"github.com/idem-go/idem/store/postgres"
	"github.com/idem-go/idem/store/redis"
	"github.com/jackc/pgx/v5"
)

// The server-backed stores join BenchmarkMiddleware when their test
// environment variables are set.
func init() {
	if url := os.Getenv("IDEM_TEST_POSTGRES_URL"); url != "" {
		benchStores = append(benchStores, benchStore{"postgres", func(b *testing.B) store.Store {
			schema := benchName()
			ctx := context.Background()
			conn, err := pgx.Connect(ctx, url)
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Close(ctx)
			if _, err := conn.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() {
				if c, err := pgx.Connect(ctx, url); err == nil {
					c.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE")
					c.Close(ctx)
				}
			})
			s, err := postgres.Open(ctx, url, postgres.Config{Schema: schema})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { s.Close() })
			return s
		}})
	}
	if dsn := os.Getenv("IDEM_TEST_MYSQL_DSN"); dsn != "" {
		benchStores = append(benchStores, benchStore{"mysql", func(b *testing.B) store.Store {
			db, err := sql.Open("mysql", dsn)
			if err != nil {
				b.Fatal(err)
			}
			defer db.Close()
			name := benchName()
			if _, err := db.Exec("CREATE DATABASE " + name); err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() {
				if db, err := sql.Open("mysql", dsn); err == nil {
					db.Exec("DROP DATABASE " + name)
					db.Close()
				}
			})
			cfg, err := gomysql.ParseDSN(dsn)
			if err != nil {
				b.Fatal(err)
			}
			cfg.DBName = name
			s, err := mysql.Open(context.Background(), cfg.FormatDSN(), mysql.Config{MaxConns: 16})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { s.Close() })
			return s
		}})
	}
	if addr := os.Getenv("IDEM_TEST_REDIS_ADDR"); addr != "" {
		benchStores = append(benchStores, benchStore{"redis", func(b *testing.B) store.Store {
			s, err := redis.Open(context.Background(), "redis://"+addr+"/0", redis.Config{Prefix: benchName() + ":"})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { s.Close() })
			return s
		}})
	}
}

func benchName() string {
	b := make([]byte, 6)
	rand.Read(b)
	return "idem_bench_" + strings.ToLower(hex.EncodeToString(b))
}
