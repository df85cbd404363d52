package cache_test

import (
	"context"
	"testing"

	"github.com/idem-go/idem/internal/testkit/pgdb"
	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/postgres"
	_ "github.com/jackc/pgx/v5/stdlib"
)

func openPostgresBench(b *testing.B, url string) store.Store {
	s, err := postgres.Open(context.Background(), url, postgres.Config{Schema: pgdb.Schema(b, url)})
	if err != nil {
		b.Fatal(err)
	}
	return s
}
