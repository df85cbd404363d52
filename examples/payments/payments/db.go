package payments

import (
	"context"
	"database/sql"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// errNotFound: no such row (pgx.ErrNoRows wraps sql.ErrNoRows too).
var errNotFound = sql.ErrNoRows

// row is a single-row result of either driver.
type row interface{ Scan(dest ...any) error }

// conn runs the service's statements on one database: inside the caller's
// transaction TTx, or on the pool for reads outside any. Its two
// implementations are the only code that knows the driver.
type conn[TTx any] interface {
	exec(ctx context.Context, tx TTx, query string, args ...any) (int64, error)
	queryRow(ctx context.Context, tx TTx, query string, args ...any) row
	read(ctx context.Context, query string, args ...any) row
	// paymentForRefund is the dialect's qPaymentForRefund.
	paymentForRefund() string
}

// sqliteConn runs statements on the SQLite store's writer pool: its one
// connection serves the transactions and the reads, so a read waits for a
// running write transaction to end.
type sqliteConn struct{ db *sql.DB }

func (c sqliteConn) exec(ctx context.Context, tx *sql.Tx, query string, args ...any) (int64, error) {
	res, err := tx.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func (c sqliteConn) queryRow(ctx context.Context, tx *sql.Tx, query string, args ...any) row {
	return tx.QueryRowContext(ctx, query, args...)
}

func (c sqliteConn) read(ctx context.Context, query string, args ...any) row {
	return c.db.QueryRowContext(ctx, query, args...)
}

func (sqliteConn) paymentForRefund() string { return qPaymentForRefundSQLite }

type postgresConn struct{ pool *pgxpool.Pool }

func (c postgresConn) exec(ctx context.Context, tx pgx.Tx, query string, args ...any) (int64, error) {
	tag, err := tx.Exec(ctx, query, args...)
	return tag.RowsAffected(), err
}

func (c postgresConn) queryRow(ctx context.Context, tx pgx.Tx, query string, args ...any) row {
	return tx.QueryRow(ctx, query, args...)
}

func (c postgresConn) read(ctx context.Context, query string, args ...any) row {
	return c.pool.QueryRow(ctx, query, args...)
}

func (postgresConn) paymentForRefund() string { return qPaymentForRefundPostgres }

// Payment is a payment as the API shows it.
type Payment struct {
	ID       string `json:"id"`
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
	Customer string `json:"customer"`
	// Status is pending until the outbox has charged the card, then
	// succeeded or failed; refunded once refunds cover the amount.
	//
	// It is requires_review when every attempt to charge failed (the
	// charge was dead-lettered) and the provider, asked for the charge
	// made with the payment's key, did not show one: the card may or may
	// not have been charged (an unanswered attempt may have landed, or be
	// landing still), so the payment is neither succeeded nor failed, and
	// it cannot be refunded. Failure holds the reason. An operator looks
	// the key up in the provider's dashboard, then either has the charge
	// delivered again (outbox.Redeliver of the dead message: the provider
	// answers the charge it has, or makes it), which records succeeded or
	// failed as a first delivery would, or settles the payment by hand.
	Status string `json:"status"`
	Charge string `json:"charge,omitempty"`
	// Failure is the provider's failure code of a failed payment, or the
	// reason of a payment in requires_review.
	Failure        string `json:"failure,omitempty"`
	AmountRefunded int64  `json:"amount_refunded"`
	Created        int64  `json:"created"`

	account   string
	chargeKey string
}

// asCreated is the payment as its creation answered it: every answer to
// the request that created it is this one, byte for byte, whatever the
// payment became since.
func (p Payment) asCreated() Payment {
	p.Status, p.Charge, p.Failure, p.AmountRefunded = "pending", "", "", 0
	return p
}

func scanPayment(r row) (Payment, error) {
	var p Payment
	err := r.Scan(&p.ID, &p.account, &p.Amount, &p.Currency, &p.Customer, &p.Status, &p.chargeKey,
		&p.Charge, &p.Failure, &p.AmountRefunded, &p.Created)
	return p, err
}

// Refund is a refund as the API shows it.
type Refund struct {
	ID      string `json:"id"`
	Payment string `json:"payment"`
	Amount  int64  `json:"amount"`
	// Status is succeeded or failed (the provider refused it).
	Status         string `json:"status"`
	ProviderRefund string `json:"provider_refund,omitempty"`
	Failure        string `json:"failure,omitempty"`
	Created        int64  `json:"created"`

	account   string
	refundKey string
}

func scanRefund(r row) (Refund, error) {
	var f Refund
	err := r.Scan(&f.ID, &f.account, &f.Payment, &f.Amount, &f.Status, &f.refundKey, &f.ProviderRefund,
		&f.Failure, &f.Created)
	return f, err
}

// applyRefund credits a succeeded refund to its payment, once: it is the
// local write of phase payment_updated, and of a reconciler that finishes
// a refund whose provider call went unanswered.
func applyRefund[TTx any](ctx context.Context, c conn[TTx], tx TTx, refundKey string) error {
	f, err := scanRefund(c.queryRow(ctx, tx, qRefundByKey, refundKey))
	if err != nil {
		return err
	}
	n, err := c.exec(ctx, tx, qRefundApply, refundKey)
	if err != nil || n == 0 {
		return err // failed, or credited already
	}
	_, err = c.exec(ctx, tx, qPaymentRefunded, f.Payment, f.Amount)
	return err
}

// recordRefund stores the provider's answer on a pending refund.
func recordRefund[TTx any](ctx context.Context, c conn[TTx], tx TTx, refundKey string, obj providerObject) error {
	_, err := c.exec(ctx, tx, qRefundResult, refundKey, obj.Status, obj.ID, obj.FailureCode)
	return err
}

func isNotFound(err error) bool { return errors.Is(err, errNotFound) }
