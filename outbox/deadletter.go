package outbox

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
)

// The dead-letter pass. River discards a job in two ways: after the worker
// returned the error of the last allowed attempt, and when its rescuer finds
// the last attempt stuck (its process crashed); River's JobCancel cancels
// one. Only the first goes through the worker, so OnDead is called from one
// place for all three: every DeadLetterInterval, each started outbox with
// OnDead lists the discarded and cancelled jobs of its queue whose message
// is neither delivered nor settled (River's job list, given a predicate on
// idem_outbox), and for each claims the message in idem_outbox, calls
// OnDead, and records it settled once OnDead returned nil. The claim keeps
// two passes (two processes) from calling OnDead for one message at once
// while it holds; a pass that dies holding it leaves it to lapse.

const (
	// deadPage is how many dead jobs a pass reads from River at once.
	deadPage = 100
	// deadClaimMargin is how much longer than OnDead's timeout a claim
	// holds: time to record the outcome before another pass may claim.
	deadClaimMargin = 10 * time.Second
)

// runDeadLetters runs a pass at once, then every DeadLetterInterval, until
// ctx is done; it closes done when it returns.
func (o *Outbox[TTx]) runDeadLetters(ctx context.Context, done chan<- struct{}) {
	defer close(done)
	t := time.NewTicker(o.cfg.DeadLetterInterval)
	defer t.Stop()
	for {
		if err := o.deadLetterPass(ctx); err != nil && ctx.Err() == nil {
			o.log.ErrorContext(ctx, "outbox: dead-letter pass failed; the next one tries again", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// deadLetterPass settles the dead letters of the outbox's queue that are
// not settled yet, oldest job first. A settled message drops out of the
// list, so the cursor only skips those another pass holds or that failed.
func (o *Outbox[TTx]) deadLetterPass(ctx context.Context) error {
	params := river.NewJobListParams().
		Kinds(jobKind).
		Queues(o.cfg.Queue).
		States(rivertype.JobStateDiscarded, rivertype.JobStateCancelled).
		Where(unsettledJobs).
		OrderBy(river.JobListOrderByID, river.SortOrderAsc).
		First(deadPage)
	for {
		res, err := o.client.JobList(ctx, params)
		if err != nil {
			return err
		}
		for _, job := range res.Jobs {
			if ctx.Err() != nil {
				return nil
			}
			o.settleDead(ctx, job)
		}
		if len(res.Jobs) < deadPage {
			return nil
		}
		params = params.After(res.LastCursor)
	}
}

// settleDead claims the dead message of job, counts and logs it the first
// time, calls OnDead and records the message settled when it returns nil.
// On failure the claim is released and the next pass calls OnDead again.
func (o *Outbox[TTx]) settleDead(ctx context.Context, job *rivertype.JobRow) {
	msg, err := messageOf(job)
	if err != nil {
		o.log.ErrorContext(ctx, "outbox: dead job with unreadable args; OnDead cannot be called", "job_id", job.ID, "err", err)
		return
	}
	log := o.log.With("key", msg.Key, "kind", msg.Kind, "fence", msg.Fence, "job_id", job.ID, "attempt", job.Attempt)
	call, err := o.db.claimDead(ctx, msg.Key, msg.Kind, job.ID, o.cfg.DeliveryTimeout+deadClaimMargin)
	switch {
	case errors.Is(err, errNoRow):
		return // settled or delivered meanwhile, or another pass holds it
	case err != nil:
		log.ErrorContext(ctx, "outbox: claiming a dead letter failed; the next pass tries again", "err", err)
		return
	}
	lastErr := lastError(job)
	if call == 1 {
		o.obs.add(ctx, o.obs.dead, msg.Kind)
		if job.State == rivertype.JobStateCancelled {
			log.ErrorContext(ctx, "outbox: dead-lettered: its job was cancelled", "err", lastErr)
		} else {
			log.ErrorContext(ctx, "outbox: dead-lettered after its last attempt", "max_attempts", job.MaxAttempts, "err", lastErr)
		}
	}
	// The outcome is recorded whatever is left of the pass's time: a Stop
	// does not undo an OnDead that returned.
	wctx := context.WithoutCancel(ctx)
	if herr := o.onDead(wctx, msg, lastErr); herr != nil {
		log.ErrorContext(ctx, "outbox: OnDead failed; a later pass calls it again", "calls", call, "err", herr)
		rctx, cancel := context.WithTimeout(wctx, recordTimeout)
		defer cancel()
		if err := o.db.releaseDead(rctx, msg.Key, msg.Kind, job.ID, call, o.deadRetry(call)); err != nil {
			log.WarnContext(ctx, "outbox: releasing a dead letter failed; its claim lapses", "err", err)
		}
		return
	}
	rctx, cancel := context.WithTimeout(wctx, recordTimeout)
	defer cancel()
	if err := o.db.settleDead(rctx, msg.Key, msg.Kind, job.ID); err != nil {
		log.ErrorContext(ctx, "outbox: OnDead returned, but recording it failed; a later pass calls it again", "err", err)
		return
	}
	log.InfoContext(ctx, "outbox: dead letter settled", "calls", call)
}

// maxDeadRetry bounds the wait before OnDead is called again after an
// error.
const maxDeadRetry = 5 * time.Minute

// deadRetry is how long a message whose call number call of OnDead failed
// waits before a pass calls it again: DeadLetterInterval, doubled at each
// failed call, at most maxDeadRetry (at least DeadLetterInterval). An
// OnDead that cannot succeed for a while (its database down) is then not
// called, and logged, at every pass.
func (o *Outbox[TTx]) deadRetry(call int) time.Duration {
	d := o.cfg.DeadLetterInterval
	for i := 1; i < call && d < maxDeadRetry; i++ {
		d *= 2
	}
	return max(min(d, maxDeadRetry), o.cfg.DeadLetterInterval)
}

// onDead calls Config.OnDead with a timeout of DeliveryTimeout, turning a
// panic into an error so it is retried like a failure.
func (o *Outbox[TTx]) onDead(ctx context.Context, msg Message, lastErr error) (err error) {
	ctx, cancel := context.WithTimeout(ctx, o.cfg.DeliveryTimeout)
	defer cancel()
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("OnDead panicked: %v\n%s", p, debug.Stack())
		}
	}()
	return o.cfg.OnDead(ctx, msg, lastErr)
}

// lastError is the error River recorded for the job's last attempt: the
// worker's, or the rescuer's for an attempt that crashed. A job cancelled
// before any attempt failed has none.
func lastError(job *rivertype.JobRow) error {
	if n := len(job.Errors); n > 0 {
		return errors.New(job.Errors[n-1].Error)
	}
	return fmt.Errorf("job %s with no error recorded", job.State)
}

// startDeadLetters starts the pass, if OnDead is set, unless it runs
// already; Start calls it.
func (o *Outbox[TTx]) startDeadLetters(ctx context.Context) {
	if o.cfg.OnDead == nil {
		return
	}
	o.passMu.Lock()
	defer o.passMu.Unlock()
	if o.passDone != nil {
		select {
		case <-o.passDone: // ended with the context of an earlier Start
		default:
			return
		}
	}
	ctx, o.passStop = context.WithCancel(ctx)
	o.passDone = make(chan struct{})
	go o.runDeadLetters(ctx, o.passDone)
}

// stopDeadLetters stops the pass and returns a channel closed once the
// OnDead call it may be making has returned; nil if it was not running.
func (o *Outbox[TTx]) stopDeadLetters() <-chan struct{} {
	o.passMu.Lock()
	defer o.passMu.Unlock()
	if o.passDone == nil {
		return nil
	}
	o.passStop()
	done := o.passDone
	o.passStop, o.passDone = nil, nil
	return done
}
