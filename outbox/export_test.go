package outbox

import (
	"context"
	"time"

	"github.com/riverqueue/river"
)

// RetryJob makes River run a job again at once, as River does after a
// crash between the record of a delivery and River's completion.
func (o *Outbox[TTx]) RetryJob(ctx context.Context, id int64) error {
	_, err := o.client.JobRetry(ctx, id)
	return err
}

// Job returns the state and attempt of a River job.
func (o *Outbox[TTx]) Job(ctx context.Context, id int64) (state string, attempt int, err error) {
	j, err := o.client.JobGet(ctx, id)
	if err != nil {
		return "", 0, err
	}
	return string(j.State), j.Attempt, nil
}

// JobCount returns how many River jobs of the outbox's kind exist.
func (o *Outbox[TTx]) JobCount(ctx context.Context) (int, error) {
	res, err := o.client.JobList(ctx, river.NewJobListParams().Kinds(jobKind).First(10_000))
	if err != nil {
		return 0, err
	}
	return len(res.Jobs), nil
}

// RecordDelivery records a delivery of a message as a worker does once
// its Deliverer answered, and returns the downstream id the table keeps.
func (o *Outbox[TTx]) RecordDelivery(ctx context.Context, key, kind string, fence, jobID int64, downstreamID string, attempt int) (string, error) {
	return o.db.record(ctx, Message{Key: key, Kind: kind, Fence: fence}, jobID, downstreamID, attempt)
}

// DeliveryTimeout is the delivery timeout cfg gets once defaulted.
func DeliveryTimeout(cfg Config) time.Duration { return cfg.withDefaults().DeliveryTimeout }

// MigrationSQL returns the text of one of the outbox's own migrations, by
// its path in the package ("migrations/postgres/002_dead_letters.sql").
func MigrationSQL(path string) (string, error) {
	b, err := migrationFS.ReadFile(path)
	return string(b), err
}
