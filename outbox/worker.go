package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"strings"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
)

// jobKind is the River job kind of every outbox message; Message.Kind
// travels in the args and picks the Deliverer.
const jobKind = "idem_outbox"

// jobArgs is a message as River stores it. Key and kind make the job
// unique (river:"unique"), matching the outbox table's primary key.
type jobArgs struct {
	MsgKind string          `json:"kind" river:"unique"`
	Key     string          `json:"key" river:"unique"`
	Fence   int64           `json:"fence"`
	Payload json.RawMessage `json:"payload"`
}

func (jobArgs) Kind() string { return jobKind }

func newJobArgs(m Message) jobArgs {
	return jobArgs{MsgKind: m.Kind, Key: m.Key, Fence: m.Fence, Payload: m.Payload}
}

func (a jobArgs) message() Message {
	return Message{Kind: a.MsgKind, Key: a.Key, Fence: a.Fence, Payload: a.Payload}
}

// messageOf decodes the message of a job read from River's table, as River
// decodes the args it hands the worker (JSON into jobArgs).
func messageOf(job *rivertype.JobRow) (Message, error) {
	var a jobArgs
	if err := json.Unmarshal(job.EncodedArgs, &a); err != nil {
		return Message{}, fmt.Errorf("job %d: %w", job.ID, err)
	}
	return a.message(), nil
}

// worker delivers one message per River job.
type worker[TTx any] struct {
	river.WorkerDefaults[jobArgs]
	o *Outbox[TTx]
}

// NextRetry applies Config.Backoff to this kind only; zero defers to
// River's policy. River's rescuer uses it too for crashed deliveries.
func (w *worker[TTx]) NextRetry(job *river.Job[jobArgs]) time.Time {
	if w.o.cfg.Backoff == nil {
		return time.Time{}
	}
	return time.Now().Add(w.o.cfg.Backoff(job.Attempt))
}

func (w *worker[TTx]) Timeout(*river.Job[jobArgs]) time.Duration { return w.o.cfg.DeliveryTimeout }

// Work delivers the message unless a downstream id is already recorded
// for it, and records the provider's id before it returns success to
// River. A crash anywhere before the record leaves the job running, and
// River's rescuer retries it after RescueAfter: the provider, given the
// same key, answers without a second effect. A crash after the record
// makes the retry find the id and skip the provider.
func (w *worker[TTx]) Work(ctx context.Context, job *river.Job[jobArgs]) error {
	o := w.o
	msg := job.Args.message()
	log := o.log.With("key", msg.Key, "kind", msg.Kind, "fence", msg.Fence, "job_id", job.ID, "attempt", job.Attempt)

	r, err := o.db.lookup(ctx, msg.Key, msg.Kind)
	switch {
	case err == nil && r.downstreamID != "":
		log.InfoContext(ctx, "outbox: already delivered; provider not called again", "downstream_id", r.downstreamID)
		return nil
	case err != nil && !errors.Is(err, errNoRow):
		// The outbox's own database failed, or was slower than the
		// attempt's time, before the provider was called: that costs the
		// message no attempt, or a slow database could dead-letter it
		// without its provider ever having been asked.
		o.obs.add(ctx, o.obs.retried, msg.Kind)
		log.WarnContext(ctx, "outbox: looking up the delivery failed; the message runs again", "err", err)
		return river.JobSnooze(recordRetry)
	}

	d := o.cfg.Deliverers[msg.Kind]
	if d == nil {
		// Possibly enqueued by a newer deployment: another worker may know it.
		return o.failed(ctx, log, job, msg, fmt.Errorf("no Deliverer for kind %q in this process", msg.Kind))
	}
	id, err := deliver(ctx, d, msg)
	if err != nil {
		return o.failed(ctx, log, job, msg, err)
	}
	// The effect happened: its id is recorded whatever is left of the
	// attempt's time (the provider may have answered at its very end).
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), recordTimeout)
	stored, err := o.db.record(rctx, msg, job.ID, id, job.Attempt)
	cancel()
	if err != nil {
		// Not recorded: the next run calls the provider again with the
		// same key, which answers the same id. That run costs no attempt:
		// a delivery that happened must never be dead-lettered.
		o.obs.add(ctx, o.obs.retried, msg.Kind)
		log.WarnContext(ctx, "outbox: delivered, but recording the downstream id failed; the provider will be asked again with the same key",
			"downstream_id", id, "err", err)
		return river.JobSnooze(recordRetry)
	}
	if stored != id {
		log.WarnContext(ctx, "outbox: provider answered another id than the one recorded for this key; keeping the recorded one",
			"downstream_id", stored, "answered_id", id)
	}
	o.obs.add(ctx, o.obs.delivered, msg.Kind)
	log.InfoContext(ctx, "outbox: delivered", "downstream_id", stored)
	return nil
}

const (
	// recordTimeout bounds the write of a downstream id once delivered.
	recordTimeout = 10 * time.Second
	// recordRetry is how soon a delivery whose id could not be recorded,
	// or whose record could not be looked up, runs again.
	recordRetry = time.Second
)

// deliver calls d, turning a panic into an error so it is counted and
// retried like any failed attempt.
func deliver(ctx context.Context, d Deliverer, msg Message) (id string, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("deliverer panicked: %v\n%s", p, debug.Stack())
		}
	}()
	id, err = d.Deliver(ctx, msg)
	if err == nil && id == "" {
		err = errors.New("deliverer returned an empty downstream id")
	}
	return id, err
}

// failed counts and logs a failed attempt and returns err to River, which
// retries it or, on the last allowed attempt, discards the job: that is
// the dead letter. With OnDead set, the dead-letter pass counts it and
// calls OnDead (deadletter.go), as it does for one whose last attempt
// crashed; without, it is counted here.
func (o *Outbox[TTx]) failed(ctx context.Context, log *slog.Logger, job *river.Job[jobArgs], msg Message, err error) error {
	switch {
	case job.Attempt < job.MaxAttempts:
		o.obs.add(ctx, o.obs.retried, msg.Kind)
		log.WarnContext(ctx, "outbox: delivery failed; will retry", "max_attempts", job.MaxAttempts, "err", err)
	case o.cfg.OnDead != nil:
		log.WarnContext(ctx, "outbox: last attempt failed", "max_attempts", job.MaxAttempts, "err", err)
	default:
		o.obs.add(ctx, o.obs.dead, msg.Kind)
		log.ErrorContext(ctx, "outbox: dead-lettered after its last attempt", "max_attempts", job.MaxAttempts, "err", err)
	}
	if strings.ContainsRune(err.Error(), 0) {
		// River records the attempt's error in a jsonb column, which
		// refuses the NUL character: the attempt would never be recorded,
		// nor the message retried or dead-lettered.
		return storableError{err}
	}
	return err
}

// storableError is an error whose text has its NUL characters replaced,
// so that River can record it; errors.Is and errors.As see the original.
type storableError struct{ err error }

func (e storableError) Error() string { return strings.ReplaceAll(e.err.Error(), "\x00", "\uFFFD") }
func (e storableError) Unwrap() error { return e.err }
