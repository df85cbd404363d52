package payments

// Every statement of the service lives in this file. The business tables
// sit in the same database as idem's records and the outbox, which is what
// lets one transaction write a payment, complete its idempotency key and
// enqueue its charge. Both databases take the same statements ($n
// placeholders work in SQLite too); only the schema and the row lock of
// qPaymentForRefund differ.

// sqliteSchema and postgresSchema create the business tables. Amounts are
// in minor units; created is a unix time in seconds, as in the API.
var sqliteSchema = []string{
	`CREATE TABLE IF NOT EXISTS payments (
	id              TEXT PRIMARY KEY,
	account         TEXT NOT NULL,
	amount          INTEGER NOT NULL CHECK (amount > 0),
	currency        TEXT NOT NULL,
	customer        TEXT NOT NULL,
	status          TEXT NOT NULL,
	charge_key      TEXT NOT NULL UNIQUE,
	charge_id       TEXT NOT NULL DEFAULT '',
	failure         TEXT NOT NULL DEFAULT '',
	amount_refunded INTEGER NOT NULL DEFAULT 0,
	created         INTEGER NOT NULL
)`,
	`CREATE TABLE IF NOT EXISTS refunds (
	id                 TEXT PRIMARY KEY,
	account            TEXT NOT NULL,
	payment_id         TEXT NOT NULL REFERENCES payments (id),
	amount             INTEGER NOT NULL CHECK (amount > 0),
	status             TEXT NOT NULL,
	refund_key         TEXT NOT NULL UNIQUE,
	provider_refund_id TEXT NOT NULL DEFAULT '',
	failure            TEXT NOT NULL DEFAULT '',
	applied            BOOLEAN NOT NULL DEFAULT FALSE,
	created            INTEGER NOT NULL
)`,
	`CREATE INDEX IF NOT EXISTS refunds_payment ON refunds (payment_id)`,
}

var postgresSchema = []string{
	// Two processes starting together would race on CREATE TABLE IF NOT
	// EXISTS; the lock ends with the transaction.
	`SELECT pg_advisory_xact_lock(hashtext('idem examples/payments schema'))`,
	`CREATE TABLE IF NOT EXISTS payments (
	id              text PRIMARY KEY,
	account         text NOT NULL,
	amount          bigint NOT NULL CHECK (amount > 0),
	currency        text NOT NULL,
	customer        text NOT NULL,
	status          text NOT NULL,
	charge_key      text NOT NULL UNIQUE,
	charge_id       text NOT NULL DEFAULT '',
	failure         text NOT NULL DEFAULT '',
	amount_refunded bigint NOT NULL DEFAULT 0,
	created         bigint NOT NULL
)`,
	`CREATE TABLE IF NOT EXISTS refunds (
	id                 text PRIMARY KEY,
	account            text NOT NULL,
	payment_id         text NOT NULL REFERENCES payments (id),
	amount             bigint NOT NULL CHECK (amount > 0),
	status             text NOT NULL,
	refund_key         text NOT NULL UNIQUE,
	provider_refund_id text NOT NULL DEFAULT '',
	failure            text NOT NULL DEFAULT '',
	applied            boolean NOT NULL DEFAULT false,
	created            bigint NOT NULL
)`,
	`CREATE INDEX IF NOT EXISTS refunds_payment ON refunds (payment_id)`,
}

// paymentColumns is the column list scanPayment reads, in its order.
const paymentColumns = `id, account, amount, currency, customer, status, charge_key, charge_id, failure,
	amount_refunded, created`

const qInsertPayment = `INSERT INTO payments (id, account, amount, currency, customer, status, charge_key, created)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`

// qPayment reads a payment of an account: another account's payment does
// not exist for the caller.
const qPayment = `SELECT ` + paymentColumns + ` FROM payments WHERE id = $1 AND account = $2`

const qPaymentByID = `SELECT ` + paymentColumns + ` FROM payments WHERE id = $1`

const qPaymentByChargeKey = `SELECT ` + paymentColumns + ` FROM payments WHERE charge_key = $1`

// qPaymentForRefund is qPayment holding the payment's row until the
// transaction ends, so two refunds of one payment cannot both pass the
// check of what is left to refund. SQLite needs no lock: its write
// transactions run one at a time.
const (
	qPaymentForRefundSQLite   = qPayment
	qPaymentForRefundPostgres = qPayment + ` FOR UPDATE`
)

// qChargeResult records the provider's answer to the charge of a payment
// still waiting for it: pending, or requires_review when the charge was
// dead-lettered and an operator had it delivered again. A redelivery finds
// it recorded and changes nothing.
const qChargeResult = `UPDATE payments SET status = $2, charge_id = $3, failure = $4
WHERE charge_key = $1 AND status IN ('pending', 'requires_review')`

// qChargeReview puts the payment of a dead-lettered charge that the
// provider does not know (or could not be asked about) in requires_review,
// with the reason; a payment the provider's answer settled is left alone.
const qChargeReview = `UPDATE payments SET status = 'requires_review', failure = $2
WHERE charge_key = $1 AND status IN ('pending', 'requires_review')`

// qRefundsHeld sums the refunds of a payment that are not failed: what is
// already refunded or on its way.
const qRefundsHeld = `SELECT coalesce(sum(amount), 0) FROM refunds WHERE payment_id = $1 AND status <> 'failed'`

// refundColumns is the column list scanRefund reads, in its order.
const refundColumns = `id, account, payment_id, amount, status, refund_key, provider_refund_id, failure, created`

const qInsertRefund = `INSERT INTO refunds (id, account, payment_id, amount, status, refund_key, created)
VALUES ($1, $2, $3, $4, 'pending', $5, $6)`

const qRefundByKey = `SELECT ` + refundColumns + ` FROM refunds WHERE refund_key = $1`

// qRefundResult records the provider's answer to a pending refund.
const qRefundResult = `UPDATE refunds SET status = $2, provider_refund_id = $3, failure = $4
WHERE refund_key = $1 AND status = 'pending'`

// qRefundApply marks a succeeded refund as applied to its payment, once:
// the caller adds the amount to the payment only when this changed a row,
// so the payment is credited once whoever finishes the refund.
const qRefundApply = `UPDATE refunds SET applied = TRUE
WHERE refund_key = $1 AND status = 'succeeded' AND NOT applied`

const qPaymentRefunded = `UPDATE payments SET
	amount_refunded = amount_refunded + $2,
	status = CASE WHEN amount_refunded + $2 >= amount THEN 'refunded' ELSE status END
WHERE id = $1`

const qCountRefunds = `SELECT count(*) FROM refunds WHERE payment_id = $1`
