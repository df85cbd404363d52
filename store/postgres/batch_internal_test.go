package postgres

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem/internal/testkit/testenv"
)

// The lock timeout a batch opens with holds for the batch's statements and
// ends with its implicit transaction: the lone statements that later run on
// the same connection wait for locks as long as they must.
func TestBatchLockTimeoutEndsWithTheBatch(t *testing.T) {
	ctx := context.Background()
	c, err := pgx.Connect(ctx, testenv.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	setting := func() string {
		t.Helper()
		var v string
		if err := c.QueryRow(ctx, "SELECT current_setting('lock_timeout')").Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	before := setting()
	var pb pgx.Batch
	pb.Queue(sqlBatchLockTimeout, batchLockTimeout)
	pb.Queue("SELECT current_setting('lock_timeout')")
	br := c.SendBatch(ctx, &pb)
	if _, err := br.Exec(); err != nil {
		t.Fatal(err)
	}
	var in string
	if err := br.QueryRow().Scan(&in); err != nil {
		t.Fatal(err)
	}
	if err := br.Close(); err != nil {
		t.Fatal(err)
	}
	if after := setting(); in != batchLockTimeout || after != before {
		t.Fatalf("lock_timeout %q in the batch and %q after it, want %q and %q as before it", in, after, batchLockTimeout, before)
	}
}
