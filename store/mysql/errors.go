package mysql

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"time"

	mysqldrv "github.com/go-sql-driver/mysql"

	"github.com/idem-go/idem/store"
)

// Server error numbers the store acts on (the same on MySQL and MariaDB).
const (
	errDupEntry = 1062 // ER_DUP_ENTRY
	errSyntax   = 1064 // ER_PARSE_ERROR
	errDeadlock = 1213 // ER_LOCK_DEADLOCK: InnoDB rolled the transaction back
	// ER_DUP_FIELDNAME: an ADD COLUMN that already ran (migrations run again
	// after a crash between their DDL and their idem_migrations row).
	errDupFieldName = 1060
	// ER_DUP_KEYNAME: a CREATE INDEX that already ran, likewise.
	errDupKeyName = 1061
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

// wrap prefixes a driver error with the operation and marks the transient
// ones retryable (store.IsRetryable).
func wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	if retryable(err) {
		err = store.Retryable(err)
	}
	return fmt.Errorf("idem/mysql: %s: %w", op, err)
}

// retryable reports failures that say nothing about the record: a lost or
// refused connection, a server shutting down or out of connections, a lost
// deadlock or a lock wait timeout (the work was undone). The store already
// retries deadlocks itself; one that still fails after maxAttempts, or one
// inside a caller's transaction, is the caller's to retry.
func retryable(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	switch errorNumber(err) {
	case errDeadlock,
		1020, // ER_CHECKREAD: the row changed since the transaction's snapshot (innodb_snapshot_isolation)
		1205, // ER_LOCK_WAIT_TIMEOUT
		1040, // ER_CON_COUNT_ERROR: too many connections
		1053, // ER_SERVER_SHUTDOWN
		1927, // ER_CONNECTION_KILLED (MariaDB)
		4031: // ER_CLIENT_INTERACTION_TIMEOUT (MySQL): the server closed an idle session
		return true
	case 0:
	default:
		return false
	}
	var netErr net.Error
	return errors.Is(err, driver.ErrBadConn) || errors.Is(err, mysqldrv.ErrInvalidConn) ||
		errors.As(err, &netErr) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}
