package postgres_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem/store"
	"github.com/idem-go/idem/store/postgres"
)

// TestCappedReserveTxRepeatableRead reserves two keys of one tenant whose
// cap is one, each in a caller's REPEATABLE READ transaction whose
// snapshot was taken before the other committed: the second must not
// count from that snapshot, which cannot see the first's record, and take
// the tenant past its cap.
func TestCappedReserveTxRepeatableRead(t *testing.T) {
	for name, cfg := range map[string]postgres.Config{
		"plain":       {TenantCap: true, MaxBatches: -1},
		"partitioned": {TenantCap: true, MaxBatches: -1, Partitions: 6 * time.Hour},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			s, _ := openSchema(t, cfg)
			begin := func() pgx.Tx {
				t.Helper()
				tx, err := s.Pool().BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = tx.Rollback(ctx) })
				// The caller's business reads fix the snapshot.
				if _, err := tx.Exec(ctx, "SELECT 1"); err != nil {
					t.Fatal(err)
				}
				return tx
			}
			capped := func(key string) store.ReserveParams {
				p := reserveParams(key)
				p.Tenant, p.MaxActive = "tenant-1", 1
				return p
			}
			first, second := begin(), begin()
			r, err := s.ReserveTx(ctx, first, capped("a"))
			if err == nil {
				if r.Outcome != store.Created {
					t.Fatalf("first reservation: %v", r.Outcome)
				}
				if err := first.Commit(ctx); err != nil {
					t.Fatal(err)
				}
			} else {
				_ = first.Rollback(ctx)
			}
			if r, err := s.ReserveTx(ctx, second, capped("b")); err == nil && r.Outcome == store.Created {
				if err := second.Commit(ctx); err != nil {
					t.Fatal(err)
				}
			} else if !errors.Is(err, store.ErrInvalidParams) && !errors.Is(err, store.ErrOverCap) {
				t.Errorf("second reservation: %v %v, want a refusal", r.Outcome, err)
			}
			n := 0
			for _, k := range []string{"a", "b"} {
				if rec, err := s.Get(ctx, "tenant-1 POST /payments", k); err == nil && rec.State.Active() {
					n++
				}
			}
			if n > 1 {
				t.Errorf("the tenant holds %d active records, its cap is 1", n)
			}
		})
	}
}
