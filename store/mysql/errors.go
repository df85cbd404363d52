package mysql

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	mysqldrv "github.com/go-sql-driver/mysql"

	"github.com/idem-go/idem/store"
)

// Server error numbers the store acts on (the same on MySQL and MariaDB).
const (
	errDupEntry = 1062 // ER_DUP_ENTRY
	errSyntax   = 1064 // ER_PARSE_ERROR
	errDeadlock = 1213 // ER_LOCK_DEADLOCK: InnoDB rolled the transaction back
)

// maxAttempts bounds the retries of a statement or transaction that lost a
// deadlock or an insert race. Under a 64-way storm on one key a handful of
// attempts is the most seen; the bound only stops a pathological loop.
const maxAttempts = 20

func errorNumber(err error) uint16 {
	var me *mysqldrv.MySQLError
	if errors.As(err, &me) {
		return me.Number
	}
	return 0
}

// transient reports errors after which running the same work again is safe
// and likely to succeed: InnoDB already undid the loser's work.
func transient(err error) bool {
	n := errorNumber(err)
	return n == errDeadlock || n == errDupEntry
}

// retry runs fn until it succeeds, fails with an error retryable does not
// accept, or has failed maxAttempts times. The first retry is immediate (the winner of a
// deadlock has usually committed by then); later ones back off with jitter so
// that a storm of losers does not collide again in lockstep.
func (s *Store) retry(ctx context.Context, retryable func(error) bool, fn func() error) error {
	for attempt := 1; ; attempt++ {
		err := fn()
		if err == nil || !retryable(err) || attempt >= maxAttempts {
			return err
		}
		s.retries.Add(1)
		if attempt == 1 {
			continue
		}
		backoff := time.Duration(rand.Int64N(int64(min(attempt, 10)) * int64(time.Millisecond)))
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return errors.Join(err, ctx.Err())
		case <-t.C:
		}
	}
}

// duplicateKey reports an insert race: only the failed statement was rolled
// back, so it can run again even inside a caller's transaction.
func duplicateKey(err error) bool { return errorNumber(err) == errDupEntry }

func wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("idem/mysql: %s: %w", op, err)
}

func invalid(msg string) error {
	return fmt.Errorf("%w: %s", store.ErrInvalidParams, msg)
}
