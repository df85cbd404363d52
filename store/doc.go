// Package store is the contract between the idem engine and a store of
// idempotency records: what a store is, what each operation does, and
// nothing else. A store implements [Store]; [Queue] when it keeps
// asynchronous requests; [TxStore] when its transitions can run inside the
// caller's transaction; [DurabilityChecker] when its durability depends on
// how its database is configured; [Syncer] when its reads can show a write
// before it is as durable as an acknowledged one. The conformance suite
// (package storetest) holds every store to this page, and package storekit
// holds what store authors share (the rules of Reserve as functions, the
// fence, paging).
//
// # Records and states
//
// A [Record] is identified by (Scope, Key); scope is opaque to the store.
// Its [State] moves only along these transitions:
//
//	absent ──Reserve──▶ in_progress ──Complete──▶ completed
//	                        │  ▲   └──Release───▶ failed_retryable ──Reserve──▶ in_progress
//	                        │  └── lease expired + policy retry/resume (new fence)
//	                        └──MarkUnknown / lease expired + policy unknown──▶ unknown
//	unknown ──Resolve (reconciler or operator)──▶ completed | failed_retryable
//	absent ──ReservePending──▶ pending ──Claim──▶ in_progress (asynchronous routes, see Queue)
//
// Past ExpiresAt, Reap deletes terminal records and closes the others (see
// [Store.Reap]); nothing is ever deleted silently.
//
// # Atomicity
//
// Every transition is one atomic step in the store, guarded by the
// record's state and fence: never a read then a write that another process
// can come between. N concurrent Reserves of one absent key, from any
// number of goroutines and processes sharing the database, yield exactly
// one Created and N-1 Existing, never an error. A store is safe for
// concurrent use.
//
// # Fences
//
// The fence ([Record.Fence]) is the lease token. Complete, Release,
// MarkUnknown, Checkpoint and Extend must present the current one and fail
// with [ErrLeaseLost], changing nothing, otherwise; so a worker that lost
// its lease never overwrites the work of the worker that took it over.
//
// Resolve and Defer, which act on an unknown outcome, name the execution
// they are about the same way: the fence the record had when its caller
// was shown it. A record that ran again since has another fence, and they
// fail with [ErrLeaseLost], changing nothing, so that a late verdict about
// an older execution never settles, reschedules or dead-letters a newer
// one. Defer also names the [Record.ReconcileAttempts] its caller was
// shown, and fails with [ErrStateConflict], changing nothing, once another
// reconciler has deferred the record since: several reconcilers asking
// about one record count one attempt.
//
// Delete may name an execution the same way ([DeleteParams].Fence), and
// then fails with [ErrLeaseLost], changing nothing, when the record ran
// again since: an operator who decided to delete what they were shown
// never removes an answer they were not shown, which the next retry would
// otherwise run the request again for.
//
// A fence is never handed out twice for one (scope, key): a record created,
// taken over, reclaimed or recreated at instant now gets max(now in
// microseconds since the Unix epoch, previous fence + 1), where the
// previous fence is that of the row it replaces (0 when there is none),
// computed in the same statement as the transition and from the clock the
// transition uses. While a row exists, previous+1 carries the rule whatever
// the clock does; across a delete the clock carries it, so a holder cut off
// long enough cannot complete a record created after its own was deleted.
// The residual case is a store clock set back, and a record deleted and
// recreated before the clock catches up again.
//
// # Time
//
// Every expiry decision uses one clock: the store's (the database's now(),
// the Redis server's TIME), or the [Clock] the store was given, which tests
// use to move time without sleeping. Times and durations are kept in whole
// microseconds ([Resolution]); a duration given to a store is rounded up
// to it, so a lease is never cut short and one duration means the same
// instant on every store.
//
// # Parameters and limits
//
// Every parameter type has a Validate method. A store calls it before
// touching its database, so a request that breaks the contract gets
// [ErrInvalidParams] (or [ErrTooLong]) from every store alike, never a
// driver error. Scope and key are checked by [CheckID]: present, within
// [MaxScopeBytes] and [MaxKeyBytes], UTF-8 without NUL.
//
// # Errors
//
// An operation succeeds, gives a definite answer about the record or the
// request ([ErrNotFound], [ErrLeaseLost], [ErrStateConflict],
// [ErrInvalidParams], [ErrTooLong], [ErrOverCap]), or fails. A failure is
// returned, never swallowed: the engine fails closed on it. A store wraps
// its driver's transient failures (a broken connection, a server
// restarting, a lost deadlock, a busy lock) with [Retryable], so that
// [IsRetryable] tells them from the others.
//
// # Reading for operators
//
// [Store.List] pages through records newest first with keyset cursors (see
// [ListParams]); [Store.ListUnknown] lists what reconciliation must settle.
// Neither changes anything.
package store
