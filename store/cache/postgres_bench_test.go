package cache_test

import (
	"context"
	"testing"

	"github.com/idem-go/idem/internal/testdb/pgdb"
	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/postgres"
)

func openPostgresBench(b *testing.B, url string) store.Store {
	s, err := postgres.Open(context.Background(), url, postgres.Config{Schema: pgdb.Schema(b, url)})
	if err != nil {
		b.Fatal(err)
	}
	return s
}
