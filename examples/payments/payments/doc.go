// Package payments is the reference payments service of idem: a small but
// complete service that uses every pattern of the library together. The
// command in the parent directory runs it; README.md there walks through
// it with curl.
//
// # Write-first payments
//
// POST /v1/payments never calls the card provider. Behind the engine's
// middleware (fingerprint over amount, currency and customer; tenant from
// the bearer account), one database transaction inserts the payment as
// pending, completes the idempotency key with the 201 about to be sent
// (Execution.CompleteParams and the store's CompleteTx, then
// Execution.Committed), and enqueues an outbox message to charge the card
// (outbox.EnqueueTx) under the provider key outbox.KeyFor(scope, key,
// "charge"). The outbox worker then charges the card at least once with
// that key (the provider deduplicates on it) and marks the payment
// succeeded or failed with the provider's charge id.
//
// # Dead charges: requires_review
//
// A charge whose every attempt failed (the outbox's default of 10) is
// dead-lettered, and the outbox's OnDead settles its payment. It never
// marks it failed: an attempt that went unanswered may have charged the
// card. It asks the provider for the charge made with the payment's key,
// the lookup of reconciliation; if the provider has it, its answer is
// recorded as a delivery records it (succeeded or failed). Otherwise, or
// if the provider cannot be asked, the payment goes to requires_review,
// with the reason in its failure, and cannot be refunded. An operator
// looks the key (the payment's charge_key column, the log's key, the
// outbox's DeadLetters) up in the provider's dashboard, then either
// enqueues the dead message again (outbox.Redeliver: its key, fence and
// payload on a new job), whose delivery records succeeded or failed as a
// first one would, or settles the payment by hand. A charge whose last
// attempt crashed its process is dead-lettered too (River's rescuer
// discards it) and settled the same way: the outbox calls OnDead for every
// dead charge, and again after an error (the database briefly down) until
// it succeeds; the lookup and the move to requires_review are idempotent,
// so a second call changes nothing.
//
// # Refunds in atomic phases
//
// POST /v1/refunds runs three phases with phase.Run on an engine with
// LeasePolicy store.LeaseResume: refund_created (the local refund row,
// after checking what is left to refund), provider_refunded (the one
// foreign call, with the refund's provider key and the lease fence, and
// the local record of its answer) and payment_updated (credit the
// payment). Each phase commits with its recovery point, so a retry after
// a crash resumes after the last committed phase and never repeats one.
//
// # Unknown outcomes
//
// A provider call that gets no answer (a timeout) may have taken effect:
// the handler declares the outcome uncertain, retries get 409, and the
// maintainer's Resolver asks the provider, by the derived key, whether the
// refund (or charge) exists, then settles the record: the answer the
// request would have had, or a released key that the next retry runs.
//
// # The fake provider
//
// Provider is an in-process card provider served over HTTP. It honours
// Idempotency-Key and Idempotency-Fence, counts its effects, and can be
// told to fail, time out or slow down (POST /admin/faults), so every
// failure path can be shown by hand and checked by the tests.
package payments
