package idem_test

import (
	"context"
	"os"
	"testing"

	"github.com/idem-go/idem/internal/testenv"
	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/mysql"
	"github.com/idem-go/idem/store/postgres"
	"github.com/idem-go/idem/store/redis"
)

// The server-backed stores join BenchmarkMiddleware when their test
// environment variables are set.
func init() {
	if url := os.Getenv(testenv.PostgresEnv); url != "" {
		benchStores = append(benchStores, benchStore{"postgres", func(b *testing.B) store.Store {
			s, err := postgres.Open(context.Background(), url, postgres.Config{Schema: testenv.PostgresSchema(b, url)})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { s.Close() })
			return s
		}})
	}
	if os.Getenv(testenv.MySQLEnv) != "" {
		benchStores = append(benchStores, benchStore{"mysql", func(b *testing.B) store.Store {
			s, err := mysql.Open(context.Background(), testenv.MySQLDatabase(b).FormatDSN(), mysql.Config{MaxConns: 16})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { s.Close() })
			return s
		}})
	}
	if addr := os.Getenv("IDEM_TEST_REDIS_ADDR"); addr != "" {
		benchStores = append(benchStores, benchStore{"redis", func(b *testing.B) store.Store {
			s, err := redis.Open(context.Background(), "redis://"+addr+"/0", redis.Config{Prefix: testenv.Name("idem_bench_") + ":"})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { s.Close() })
			return s
		}})
	}
}
