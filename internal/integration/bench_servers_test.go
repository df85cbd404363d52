package integration_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/idem-go/idem/internal/testkit/enginetest"
	"github.com/idem-go/idem/internal/testkit/mysqldb"
	"github.com/idem-go/idem/internal/testkit/pgdb"
	"github.com/idem-go/idem/internal/testkit/testenv"
	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/mysql"
	"github.com/idem-go/idem/store/postgres"
	"github.com/idem-go/idem/store/redis"
	"github.com/idem-go/idem/store/sqlite"
	_ "github.com/jackc/pgx/v5/stdlib"
)

// BenchmarkMiddleware is the core's benchmark of the middleware
// (enginetest.BenchMiddleware) on SQLite and on the server-backed stores
// whose test environment variables are set.
func BenchmarkMiddleware(b *testing.B) {
	benchStores := []enginetest.BenchStore{{Name: "sqlite", Open: func(b *testing.B) store.Store {
		s, err := sqlite.Open(context.Background(), filepath.Join(b.TempDir(), "bench.db"), sqlite.Config{})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { s.Close() })
		return s
	}}}
	if url := os.Getenv(testenv.PostgresEnv); url != "" {
		benchStores = append(benchStores, enginetest.BenchStore{Name: "postgres", Open: func(b *testing.B) store.Store {
			s, err := postgres.Open(context.Background(), url, postgres.Config{Schema: pgdb.Schema(b, url)})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { s.Close() })
			return s
		}})
	}
	if os.Getenv(testenv.MySQLEnv) != "" {
		benchStores = append(benchStores, enginetest.BenchStore{Name: "mysql", Open: func(b *testing.B) store.Store {
			s, err := mysql.Open(context.Background(), mysqldb.Database(b), mysql.Config{MaxConns: 16})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { s.Close() })
			return s
		}})
	}
	if os.Getenv(testenv.RedisEnv) != "" {
		url := testenv.RedisURL(b)
		benchStores = append(benchStores, enginetest.BenchStore{Name: "redis", Open: func(b *testing.B) store.Store {
			s, err := redis.Open(context.Background(), url, redis.Config{Prefix: testenv.Name("idem_bench_") + ":"})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { s.Close() })
			return s
		}})
	}
	enginetest.BenchMiddleware(b, benchStores...)
}
