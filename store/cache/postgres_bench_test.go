package cache_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"

	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/postgres"
	"github.com/jackc/pgx/v5"
)

func openPostgresBench(b *testing.B, url string) store.Store {
	ctx := context.Background()
	buf := make([]byte, 6)
	rand.Read(buf)
	schema := "idem_cachebench_" + hex.EncodeToString(buf)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		c, err := pgx.Connect(ctx, url)
		if err == nil {
			c.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE")
			c.Close(ctx)
		}
	})
	s, err := postgres.Open(ctx, url, postgres.Config{Schema: schema})
	if err != nil {
		b.Fatal(err)
	}
	return s
}
