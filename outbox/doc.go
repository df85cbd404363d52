// Package outbox is the transactional outbox of idem: a handler
// that must call an external service (a payment provider, an email
// service) does not call it inline. It writes its business rows, completes
// its idempotency key and enqueues an outbox message in one database
// transaction; a worker then delivers the message at least once, carrying
// the idempotency key and the lease fence downstream so the provider
// deduplicates.
//
// It is built on River (github.com/riverqueue/river) with its pgx v5 driver
// for PostgreSQL and its database/sql driver for SQLite, plus one table of
// its own, idem_outbox, in the same database.
//
// # The handler side
//
//	err := store.InTx(ctx, func(tx pgx.Tx) error {
//		// business rows ...
//		if err := store.CompleteTx(ctx, tx, x.CompleteParams(resp)); err != nil {
//			return err
//		}
//		return ob.EnqueueTx(ctx, tx, outbox.Message{
//			Kind:  "charge",
//			Key:   outbox.KeyFor(x.Scope(), x.Key(), "charge"),
//			Fence: x.Fence(),
//			Payload: payload,
//		})
//	})
//
// The message exists if and only if the transaction commits: a rollback
// leaves nothing to deliver, a commit leaves the payment, the stored
// response and the message together. Message.Key is what the provider
// deduplicates on, so it must not be the client's raw key, which two
// tenants may both pick: [KeyFor] derives it from the record's scope, key
// and the message's kind.
//
// # Delivery
//
// River runs one job per message; the worker
//
//  1. reads the message's row: if a downstream id is recorded, the message
//     was delivered before (River lost the completion in a crash) and the
//     provider is not called again;
//  2. calls the message kind's [Deliverer], which passes Message.Key to the
//     provider as its idempotency key;
//  3. records the provider's id in idem_outbox (unique on (key, kind); the
//     first id recorded is kept) and only then returns success to River.
//
// A crash between 2 and 3 leaves the job running; after
// [Config.RescueAfter] River's rescuer retries it, and the provider, given
// the same key, answers with the same object and makes no second effect.
// The crash test of this package kills a real worker process (SIGKILL) at
// exactly that point, on PostgreSQL and on SQLite.
//
// A failed attempt is retried after [Config.Backoff] (River's worker
// NextRetry); after [Config.MaxAttempts] River discards the job: that is
// the dead letter. [Outbox.DeadLetters] reads them from River's job table
// (discarded and cancelled jobs of the outbox's kind that still carry an
// undelivered message), [Outbox.Delivery] combines the outbox's row (for
// good once delivered) with the River job (pending or dead). Enqueuing a
// dead message again delivers it anew.
//
// # Dead letters and OnDead
//
// [Config.OnDead] lets the application settle what waited on a message that
// died (a payment to fail, or to review). A message dies in three ways: its
// last allowed attempt fails in the worker; its last attempt crashes its
// process, and River's rescuer discards the job after RescueAfter without
// any worker running; or its job is cancelled. Only the first goes through
// the worker, so OnDead is called from one place for all three: every
// [Config.DeadLetterInterval], each started outbox with OnDead runs a
// dead-letter pass that lists the dead jobs of its queue whose message is
// neither delivered nor settled, claims each in idem_outbox, calls OnDead,
// and records the message settled ([Delivery.SettledAt]) once OnDead
// returned nil. An error, a panic or a crash leaves it unsettled, and a
// later pass calls OnDead again (after an error or a panic, once
// DeadLetterInterval, doubled at each failed call up to 5 minutes, has
// passed): it is called at least once per dead message, possibly more (it
// must be idempotent), and never again once settled. The claim keeps the
// passes of several processes from calling it for one message at once.
//
// [Outbox.DeadLetters] lists the dead messages, and [Outbox.Redeliver]
// enqueues one again (same key, fence and payload, a new job with the full
// attempts) once an operator has mended what killed it.
//
// # Observability
//
// Counters idem.outbox.delivered, idem.outbox.retried and idem.outbox.dead
// (attribute kind) through the OpenTelemetry metric API, and slog events
// "outbox: delivered", "outbox: delivery failed; will retry",
// "outbox: dead-lettered after its last attempt" and
// "outbox: already delivered; provider not called again", each with key,
// kind, fence, job_id and attempt. With OnDead, the dead-letter pass counts
// a dead message and logs its dead-letter event the first time it claims
// it (the worker logs "outbox: last attempt failed"), then logs
// "outbox: dead letter settled" or "outbox: OnDead failed; a later pass
// calls it again"; without OnDead the worker counts and logs the last
// failed attempt.
//
// # PostgreSQL and SQLite
//
// [NewPostgres] takes a pgxpool.Pool and the transactions are pgx.Tx; River's
// tables and idem_outbox live in the pool's search_path. [NewSQLite] takes a
// database/sql pool of modernc.org/sqlite, transactions are *sql.Tx; it
// needs the pool idem's SQLite store writes through (WAL, synchronous=FULL,
// busy_timeout, _txlock=immediate, one connection): pass that store's DB()
// and the outbox shares its file and its transactions. With one connection,
// do not call the outbox's non-Tx methods inside an open transaction of the
// same pool: they would wait for the connection the transaction holds.
//
// [Outbox.Migrate] applies River's migrations (rivermigrate) and the
// outbox's own under a lock (a PostgreSQL advisory lock; one immediate
// transaction on SQLite), since rivermigrate takes none.
//
// # What River decides, and its limits
//
// River's maintenance services, the rescuer and the scheduler among them,
// run only in the process elected leader. The rescuer looks for stuck jobs
// every 30 seconds (not configurable) and at once when a process becomes
// leader; a rescued job waits for the scheduler (every 5 seconds). A leader
// that dies keeps its leadership until it expires, 10 to 15 seconds later,
// and the others bid every 5 seconds. So a crashed delivery is redelivered
// up to about 35 s after RescueAfter has passed when the crashed process
// was not the leader, and 10 to 26 s after the crash (once RescueAfter has
// passed) when it was: the crash test measures about 22 s with
// RescueAfter = 1 s. The rescuer reads the process clock, so no injected
// clock can shorten that wait.
//
// A River client of another application in the same tables and elected
// leader there rescues the outbox's jobs too, and discards them if it has no
// worker for the outbox's kind; it also cleans finished jobs with its own
// retention. Give the outbox its own schema (search_path) on PostgreSQL, or
// its own River tables.
//
// A delivery whose process crashes during its last allowed attempt is
// discarded by River's rescuer without returning to the worker. The
// dead-letter pass finds it like any other dead letter, counts it and calls
// OnDead, once the rescuer has run (the delays above) and within
// DeadLetterInterval after; its lastErr is the rescuer's. Without OnDead no
// pass runs: DeadLetters lists it, but idem.outbox.dead does not count it
// and no dead-letter event is logged.
package outbox
