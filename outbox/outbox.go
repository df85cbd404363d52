package outbox

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/riverdriver/riversqlite"
	"github.com/riverqueue/river/rivermigrate"
	"github.com/riverqueue/river/rivertype"
	"go.opentelemetry.io/otel/metric"
)

// Message is one side effect to perform after the enqueuing transaction
// commits.
type Message struct {
	// Kind routes the message to its Deliverer (Config.Deliverers).
	Kind string
	// Key is the idempotency key the Deliverer sends downstream (as
	// Idempotency-Key, or the provider's equivalent). It must be unique
	// across tenants and across the messages of one request that go to
	// the same provider: build it with KeyFor rather than passing the
	// client's raw key, which two tenants may share.
	Key string
	// Fence is the lease fence (idem.Execution.Fence) of the execution that
	// enqueued the message, carried downstream so a provider that keeps the
	// highest fence it saw can refuse a stale holder.
	Fence int64
	// Payload is the message body, valid JSON; empty means null.
	Payload json.RawMessage
}

// Deliverer performs the side effect of one Kind of message.
type Deliverer interface {
	// Deliver performs the side effect and returns the downstream object's
	// id. It must pass msg.Key to the provider as its idempotency key: a
	// delivery is at least once, and the provider's deduplication on that
	// key is what makes a redelivery (after a crash between the provider's
	// answer and the recording of its id) free of a second effect.
	//
	// An error fails the attempt; it is retried with backoff until
	// Config.MaxAttempts, then dead-lettered. Deliver must return when ctx
	// is done.
	Deliver(ctx context.Context, msg Message) (downstreamID string, err error)
}

// DelivererFunc adapts a function to Deliverer.
type DelivererFunc func(ctx context.Context, msg Message) (string, error)

// Deliver calls f.
func (f DelivererFunc) Deliver(ctx context.Context, msg Message) (string, error) { return f(ctx, msg) }

// KeyFor returns the downstream idempotency key for the message of kind
// sent on behalf of the idempotency record (scope, key): stable across the
// client's retries, distinct across tenants (which may pick the same key)
// and across the kinds of one request. The result is 49 characters of
// URL-safe base64 behind "idem_".
func KeyFor(scope, key, kind string) string {
	h := sha256.New()
	var n [binary.MaxVarintLen64]byte
	for _, s := range [...]string{scope, key, kind} {
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(s)))])
		h.Write([]byte(s))
	}
	return "idem_" + base64.RawURLEncoding.EncodeToString(h.Sum(nil))
}

// Config configures an Outbox.
type Config struct {
	// Deliverers maps each Message.Kind to its Deliverer. EnqueueTx refuses
	// a kind not in it. An outbox without Deliverers only enqueues (any
	// non-empty kind) and cannot Start: processes that deliver must
	// register every kind.
	Deliverers map[string]Deliverer
	// MaxAttempts bounds the delivery attempts of a message before it is
	// dead-lettered. Defaults to 10.
	MaxAttempts int
	// Workers is the number of deliveries this process runs at once.
	// Defaults to 10.
	Workers int
	// Queue is the River queue of the outbox's jobs. Defaults to
	// "idem_outbox".
	Queue string
	// Backoff returns the delay after the attempt-th failed attempt (1 for
	// the first). Defaults to River's policy: attempt^4 seconds with 10%
	// jitter (1s, 16s, 81s, ...).
	Backoff func(attempt int) time.Duration
	// DeliveryTimeout bounds one attempt: its context is cancelled after
	// it. Defaults to 1 minute, or half of RescueAfter when that is
	// shorter, so that an attempt cut off at its timeout is recorded before
	// the rescuer could start it again; at most RescueAfter.
	DeliveryTimeout time.Duration
	// RescueAfter is how long a delivery may run before it is presumed
	// dead (its process crashed) and retried; River's RescueStuckJobsAfter.
	// Keep it above DeliveryTimeout with a margin: a delivery still running
	// when rescued is delivered twice at once (the provider's deduplication
	// on the key keeps that to one effect). Defaults to 5 minutes.
	RescueAfter time.Duration
	// PollInterval is how often workers look for messages when no
	// notification woke them (River's FetchPollInterval). Defaults to 1s.
	PollInterval time.Duration
	// DeadLetterInterval is how often a started outbox with OnDead runs
	// its dead-letter pass, which looks for the dead-lettered messages of
	// Queue not settled yet: it counts each in idem.outbox.dead and logs it
	// the first time, calls OnDead, and records it settled once OnDead
	// returned nil. It bounds how long after its death a message waits for
	// OnDead. Defaults to PollInterval.
	DeadLetterInterval time.Duration
	// DeadLetterRetention is how long River keeps dead-lettered jobs, and
	// so how long DeadLetters lists them (River's
	// DiscardedJobRetentionPeriod); -1 keeps them until deleted. Another
	// River client on the same tables cleans them with its own setting.
	// Defaults to 7 days.
	DeadLetterRetention time.Duration
	// OnDead, when set, is called for every dead-lettered message, so the
	// application can settle what waited on it (mark a payment failed,
	// page an operator): one whose last allowed attempt failed, one whose
	// last attempt crashed its process (River's rescuer discards it after
	// RescueAfter, without a worker), and one whose job was cancelled
	// (River's JobCancel). msg is the message as the worker decodes it;
	// lastErr carries the error River recorded for the last attempt (for a
	// crash, the rescuer's note that the job was stuck).
	//
	// It is called at least once for each dead message, until it returns
	// nil, and then never again for it. The dead-letter pass calls it (see
	// DeadLetterInterval), with a context of its own bounded by
	// DeliveryTimeout; after an error or a panic, which are logged, a later
	// pass calls it again, once DeadLetterInterval, doubled at each failed
	// call up to 5 minutes, has passed. A claim keeps passes of several
	// processes from calling it for one message at once, but a call that
	// outlives its claim (DeliveryTimeout and 10 seconds), or a process
	// that crashes between OnDead's return and the record of it, lets it
	// be called again: it must be idempotent. A message enqueued again
	// (EnqueueTx of the same key and kind) is a new delivery: OnDead is
	// called again if it dies too, and no longer for the earlier death if
	// that was not settled yet.
	//
	// The worker does not call it on the last attempt: one path for every
	// way a message dies, which a crash cannot skip. The price is up to
	// DeadLetterInterval of latency, small beside the retries before
	// (hours with the default MaxAttempts and backoff).
	//
	// Set it in every process that starts the outbox, or in none: the pass
	// runs where it is set, and the worker counts a message whose last
	// attempt failed in idem.outbox.dead where it is not (a mix may count
	// one twice). Without OnDead, no pass runs, and a message whose last
	// attempt crashed is neither counted nor logged; DeadLetters lists it.
	OnDead func(ctx context.Context, msg Message, lastErr error) error
	// Logger receives delivery events and River's logs. Defaults to
	// slog.Default().
	Logger *slog.Logger
	// MeterProvider receives the counters idem.outbox.delivered, retried
	// and dead. Defaults to the global provider.
	MeterProvider metric.MeterProvider
}

// Defaults.
const (
	DefaultMaxAttempts         = 10
	DefaultWorkers             = 10
	DefaultQueue               = "idem_outbox"
	DefaultDeliveryTimeout     = time.Minute
	DefaultRescueAfter         = 5 * time.Minute
	DefaultPollInterval        = time.Second
	DefaultDeadLetterRetention = 7 * 24 * time.Hour
)

func (c Config) withDefaults() Config {
	if c.MaxAttempts == 0 {
		c.MaxAttempts = DefaultMaxAttempts
	}
	if c.Workers == 0 {
		c.Workers = DefaultWorkers
	}
	if c.Queue == "" {
		c.Queue = DefaultQueue
	}
	if c.RescueAfter == 0 {
		c.RescueAfter = DefaultRescueAfter
	}
	if c.DeliveryTimeout == 0 {
		c.DeliveryTimeout = min(DefaultDeliveryTimeout, c.RescueAfter/2)
	}
	if c.PollInterval == 0 {
		c.PollInterval = DefaultPollInterval
	}
	if c.DeadLetterInterval == 0 {
		c.DeadLetterInterval = c.PollInterval
	}
	if c.DeadLetterRetention == 0 {
		c.DeadLetterRetention = DefaultDeadLetterRetention
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

func (c Config) validate() error {
	switch {
	case c.MaxAttempts < 1:
		return fmt.Errorf("outbox: MaxAttempts must be at least 1, got %d", c.MaxAttempts)
	case c.Workers < 1 || c.Workers > river.QueueNumWorkersMax:
		return fmt.Errorf("outbox: Workers must be between 1 and %d, got %d", river.QueueNumWorkersMax, c.Workers)
	case c.DeliveryTimeout < 0:
		return fmt.Errorf("outbox: DeliveryTimeout must be positive, got %s", c.DeliveryTimeout)
	case c.RescueAfter < c.DeliveryTimeout:
		return fmt.Errorf("outbox: RescueAfter (%s) must be at least DeliveryTimeout (%s)", c.RescueAfter, c.DeliveryTimeout)
	case c.PollInterval < time.Millisecond:
		return fmt.Errorf("outbox: PollInterval must be at least 1ms, got %s", c.PollInterval)
	case c.DeadLetterInterval < time.Millisecond:
		return fmt.Errorf("outbox: DeadLetterInterval must be at least 1ms, got %s", c.DeadLetterInterval)
	case c.DeadLetterRetention < -1:
		return fmt.Errorf("outbox: DeadLetterRetention must be positive or -1, got %s", c.DeadLetterRetention)
	}
	for kind, d := range c.Deliverers {
		if kind == "" || d == nil {
			return fmt.Errorf("outbox: Deliverers: empty kind or nil Deliverer (kind %q)", kind)
		}
	}
	return nil
}

// State is the delivery state of a message.
type State string

const (
	// Pending: not delivered yet; waiting, running or between retries.
	Pending State = "pending"
	// Delivered: the provider answered and its id is recorded.
	Delivered State = "delivered"
	// Dead: dead-lettered after its last allowed attempt failed or
	// crashed, or its job was cancelled. OnDead settles it; an operator
	// may deliver it anew (EnqueueTx of the same message).
	Dead State = "dead"
)

// Delivery is what the outbox knows of one message.
type Delivery struct {
	Key   string
	Kind  string
	Fence int64
	State State
	// DownstreamID is the provider's id, set when State is Delivered.
	DownstreamID string
	// Attempts is the number of delivery attempts started so far (for a
	// delivered message: the attempt that delivered it).
	Attempts int
	// LastError is the error of the last failed attempt, if any.
	LastError   string
	EnqueuedAt  time.Time
	DeliveredAt time.Time // zero unless Delivered
	// SettledAt is when OnDead returned nil for a Dead message (the
	// dead-letter pass settled it); zero until then, and unless Dead.
	SettledAt time.Time
	// JobID is the River job carrying the message.
	JobID int64
}

var (
	// ErrNotFound: no message with that key and kind was ever enqueued.
	ErrNotFound = errors.New("outbox: message not found")
	// ErrInvalidMessage: EnqueueTx refused the message.
	ErrInvalidMessage = errors.New("outbox: invalid message")
	// ErrNotDead is Redeliver's answer for a message that is pending or
	// delivered.
	ErrNotDead = errors.New("outbox: message not dead")
)

// Outbox is a transactional outbox on one database. TTx is the database's
// transaction type: pgx.Tx for PostgreSQL, *sql.Tx for SQLite. It is safe
// for concurrent use.
type Outbox[TTx any] struct {
	cfg    Config
	client *river.Client[TTx]
	driver riverdriver.Driver[TTx]
	db     backend[TTx]
	obs    *observer
	log    *slog.Logger
	// delivers is false for an enqueue-only outbox (no Deliverers).
	delivers bool

	// The dead-letter pass, while started (deadletter.go).
	passMu   sync.Mutex
	passStop context.CancelFunc
	passDone chan struct{}
}

// NewPostgres returns an outbox on pool. River's tables and the outbox's
// own live in the pool's search_path (set search_path in the pool's
// configuration to give them a schema of their own). Run Migrate once
// before use.
func NewPostgres(pool *pgxpool.Pool, cfg Config) (*Outbox[pgx.Tx], error) {
	if pool == nil {
		return nil, errors.New("outbox: nil pool")
	}
	return newOutbox(riverpgxv5.New(pool), pgBackend{pool}, cfg)
}

// NewSQLite returns an outbox on db, a database/sql pool of the modernc
// driver ("sqlite"). Open db as idem's SQLite store opens its writer (and
// pass that store's DB() to share its file and transactions): WAL,
// busy_timeout, _txlock=immediate, and a single connection
// (SetMaxOpenConns(1)), which River's SQLite driver needs to avoid
// SQLITE_BUSY between its own concurrent operations. Run Migrate once
// before use.
func NewSQLite(db *sql.DB, cfg Config) (*Outbox[*sql.Tx], error) {
	if db == nil {
		return nil, errors.New("outbox: nil db")
	}
	o, err := newOutbox(riversqlite.New(db), sqliteBackend{db}, cfg)
	if err != nil {
		return nil, err
	}
	if n := db.Stats().MaxOpenConnections; n != 1 {
		o.log.Warn("outbox: the SQLite pool should have exactly one connection (SetMaxOpenConns(1)); River's concurrent operations may fail with SQLITE_BUSY",
			"max_open_conns", n)
	}
	return o, nil
}

func newOutbox[TTx any](driver riverdriver.Driver[TTx], db backend[TTx], cfg Config) (*Outbox[TTx], error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	obs, err := newObserver(cfg.MeterProvider)
	if err != nil {
		return nil, fmt.Errorf("outbox: metrics: %w", err)
	}
	o := &Outbox[TTx]{cfg: cfg, driver: driver, db: db, obs: obs, log: cfg.Logger, delivers: len(cfg.Deliverers) > 0}
	workers := river.NewWorkers()
	if err := river.AddWorkerSafely(workers, &worker[TTx]{o: o}); err != nil {
		return nil, fmt.Errorf("outbox: %w", err)
	}
	o.client, err = river.NewClient(driver, &river.Config{
		Queues:                      map[string]river.QueueConfig{cfg.Queue: {MaxWorkers: cfg.Workers}},
		Workers:                     workers,
		MaxAttempts:                 cfg.MaxAttempts,
		JobTimeout:                  cfg.DeliveryTimeout,
		RescueStuckJobsAfter:        cfg.RescueAfter,
		FetchPollInterval:           cfg.PollInterval,
		FetchCooldown:               min(river.FetchCooldownDefault, cfg.PollInterval),
		DiscardedJobRetentionPeriod: cfg.DeadLetterRetention,
		Logger:                      cfg.Logger,
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: %w", err)
	}
	return o, nil
}

// Migrate applies River's migrations (rivermigrate) and the outbox's own,
// holding a lock so processes starting together apply each once. It is a
// no-op when everything is applied.
func (o *Outbox[TTx]) Migrate(ctx context.Context) error {
	m, err := rivermigrate.New(o.driver, &rivermigrate.Config{Logger: o.log})
	if err != nil {
		return fmt.Errorf("outbox: migrate: %w", err)
	}
	if err := o.db.migrate(ctx, m); err != nil {
		return fmt.Errorf("outbox: migrate: %w", err)
	}
	return nil
}

// EnqueueTx enqueues msg in tx, the transaction that writes the business
// rows and completes the idempotency key: the message is delivered if and
// only if tx commits.
//
// One (Key, Kind) is one message. Enqueuing it again while River still
// has its job (pending, or finished within River's retention) is a no-op;
// enqueuing a dead-lettered message again delivers it anew; a message
// already delivered is never delivered again, whatever is enqueued later.
func (o *Outbox[TTx]) EnqueueTx(ctx context.Context, tx TTx, msg Message) error {
	if err := o.check(msg); err != nil {
		return err
	}
	if len(msg.Payload) == 0 {
		msg.Payload = json.RawMessage("null")
	}
	res, err := o.client.InsertTx(ctx, tx, newJobArgs(msg), &river.InsertOpts{
		Queue:       o.cfg.Queue,
		MaxAttempts: o.cfg.MaxAttempts,
		// Unique by (key, kind) among River's live and finished jobs
		// (River's default states, which leave discarded ones out).
		UniqueOpts: river.UniqueOpts{ByArgs: true},
	})
	if err != nil {
		return fmt.Errorf("outbox: enqueue: %w", err)
	}
	if err := o.db.enqueue(ctx, tx, msg, res.Job.ID); err != nil {
		return fmt.Errorf("outbox: enqueue: %w", err)
	}
	return nil
}

func (o *Outbox[TTx]) check(msg Message) error {
	switch {
	case msg.Kind == "":
		return fmt.Errorf("%w: empty Kind", ErrInvalidMessage)
	case msg.Key == "":
		return fmt.Errorf("%w: empty Key", ErrInvalidMessage)
	case o.delivers && o.cfg.Deliverers[msg.Kind] == nil:
		return fmt.Errorf("%w: no Deliverer for kind %q", ErrInvalidMessage, msg.Kind)
	case len(msg.Payload) > 0 && !json.Valid(msg.Payload):
		return fmt.Errorf("%w: Payload is not valid JSON", ErrInvalidMessage)
	}
	return nil
}

// Start starts delivering, and the dead-letter pass (see OnDead), in the
// background until Stop or until ctx is done; ctx must outlive the
// deliveries (not a request's context).
func (o *Outbox[TTx]) Start(ctx context.Context) error {
	if !o.delivers {
		return errors.New("outbox: no Deliverers configured; this outbox only enqueues")
	}
	if err := o.client.Start(ctx); err != nil {
		return fmt.Errorf("outbox: start: %w", err)
	}
	o.startDeadLetters(ctx)
	return nil
}

// Stop stops taking new messages and waits for running deliveries, and
// the OnDead call of the dead-letter pass, to return. If ctx is done first
// it returns ctx's error; the deliveries go on until they return or their
// DeliveryTimeout cancels them, and so does the OnDead call.
func (o *Outbox[TTx]) Stop(ctx context.Context) error {
	passDone := o.stopDeadLetters()
	err := o.client.Stop(ctx)
	if passDone != nil {
		select {
		case <-passDone:
		case <-ctx.Done():
			if err == nil {
				err = ctx.Err()
			}
		}
	}
	if err != nil {
		return fmt.Errorf("outbox: stop: %w", err)
	}
	return nil
}

// Delivery returns what the outbox knows of the message (key, kind), or
// ErrNotFound. A delivered message's state comes from the outbox's table,
// which keeps it for good; an undelivered one's from its River job: pending
// while River may still run it, dead once River discarded it (or no longer
// has it).
func (o *Outbox[TTx]) Delivery(ctx context.Context, key, kind string) (Delivery, error) {
	d, _, err := o.delivery(ctx, key, kind)
	return d, err
}

// delivery is Delivery, with the River job it read: nil for a message
// delivered, or whose job River no longer has.
func (o *Outbox[TTx]) delivery(ctx context.Context, key, kind string) (Delivery, *rivertype.JobRow, error) {
	r, err := o.db.lookup(ctx, key, kind)
	if errors.Is(err, errNoRow) {
		return Delivery{}, nil, ErrNotFound
	}
	if err != nil {
		return Delivery{}, nil, fmt.Errorf("outbox: delivery: %w", err)
	}
	d := Delivery{
		Key: key, Kind: kind, Fence: r.fence, JobID: r.jobID,
		EnqueuedAt: r.createdAt,
	}
	if r.downstreamID != "" {
		d.State, d.DownstreamID, d.Attempts, d.DeliveredAt = Delivered, r.downstreamID, r.attempts, r.deliveredAt
		return d, nil, nil
	}
	job, err := o.client.JobGet(ctx, r.jobID)
	if errors.Is(err, river.ErrNotFound) {
		// Undelivered and gone from River: discarded (or cancelled) and
		// then cleaned after the retention period.
		d.State, d.LastError, d.SettledAt = Dead, "job no longer in River's table", r.deadSettledAt
		return d, nil, nil
	}
	if err != nil {
		return Delivery{}, nil, fmt.Errorf("outbox: delivery: %w", err)
	}
	fill(&d, job, r.deadSettledAt)
	return d, job, nil
}

// Redeliver enqueues a dead message again, as EnqueueTx of the same key,
// kind, fence and payload would in a transaction of its own: a new job
// with the full MaxAttempts, whose delivery records the message as a
// first one would, and whose death, if it dies too, is a new dead letter
// (OnDead is called for it). It is for an operator who has dealt with
// what killed the message (a provider that was down). The payload comes
// from the dead job, so a message whose job River has already cleaned
// (after DeadLetterRetention) cannot be redelivered: it must be enqueued
// again with EnqueueTx; nor can one that died in another outbox's Queue.
// It returns ErrNotFound for a message the outbox does not know and
// ErrNotDead for one pending or delivered, and the message's Delivery
// after it is enqueued.
func (o *Outbox[TTx]) Redeliver(ctx context.Context, key, kind string) (Delivery, error) {
	d, job, err := o.delivery(ctx, key, kind)
	switch {
	case err != nil:
		return Delivery{}, err
	case d.State != Dead:
		return d, fmt.Errorf("%w: %s %q is %s", ErrNotDead, kind, key, d.State)
	case job == nil:
		return d, fmt.Errorf("outbox: redeliver %s %q: its dead job %d is no longer kept (DeadLetterRetention); enqueue it again with EnqueueTx", kind, key, d.JobID)
	case job.Queue != o.cfg.Queue:
		// Enqueued again here, it would move to this outbox's queue,
		// whose workers may not be the ones that deliver it.
		return d, fmt.Errorf("outbox: redeliver %s %q: it died in queue %q, not this outbox's %q; redeliver it from an outbox on that queue",
			kind, key, job.Queue, o.cfg.Queue)
	}
	msg, err := messageOf(job)
	if err != nil {
		return d, fmt.Errorf("outbox: redeliver: %w", err)
	}
	if err := o.db.inTx(ctx, func(tx TTx) error { return o.EnqueueTx(ctx, tx, msg) }); err != nil {
		return d, err
	}
	return o.Delivery(ctx, key, kind)
}

// fill sets d's state, attempts and last error from its job, and for a
// dead one when it was settled (settledAt, from the outbox's row).
func fill(d *Delivery, job *rivertype.JobRow, settledAt time.Time) {
	d.Attempts = job.Attempt
	if n := len(job.Errors); n > 0 {
		d.LastError = job.Errors[n-1].Error
	}
	switch job.State {
	case rivertype.JobStateDiscarded, rivertype.JobStateCancelled:
		d.State, d.SettledAt = Dead, settledAt
	default:
		// A completed job without a recorded delivery cannot happen: the
		// worker records before it returns success.
		d.State = Pending
	}
}

// DeadLetters returns up to limit dead-lettered messages of the outbox's
// Queue, most recently dead first, settled by OnDead or not
// (Delivery.SettledAt). They are read from River's job table (discarded
// and cancelled jobs of the outbox's kind and queue: outboxes with queues
// of their own on one database list only their own) and kept only while
// they still carry an undelivered message: a
// message enqueued again after it died is no longer listed. River keeps
// them for Config.DeadLetterRetention.
func (o *Outbox[TTx]) DeadLetters(ctx context.Context, limit int) ([]Delivery, error) {
	if limit <= 0 {
		return nil, nil
	}
	page := min(limit, 1000) // River lists at most 10,000 jobs at once
	params := river.NewJobListParams().
		Kinds(jobKind).
		Queues(o.cfg.Queue).
		States(rivertype.JobStateDiscarded, rivertype.JobStateCancelled).
		OrderBy(river.JobListOrderByFinalizedAt, river.SortOrderDesc).
		First(page)
	var out []Delivery
	for {
		res, err := o.client.JobList(ctx, params)
		if err != nil {
			return nil, fmt.Errorf("outbox: dead letters: %w", err)
		}
		if len(res.Jobs) == 0 {
			return out, nil
		}
		ids := make([]int64, len(res.Jobs))
		for i, j := range res.Jobs {
			ids[i] = j.ID
		}
		live, err := o.db.undelivered(ctx, ids)
		if err != nil {
			return nil, fmt.Errorf("outbox: dead letters: %w", err)
		}
		for _, j := range res.Jobs {
			settledAt, ok := live[j.ID]
			if !ok {
				continue
			}
			m, err := messageOf(j)
			if err != nil {
				return nil, fmt.Errorf("outbox: dead letters: %w", err)
			}
			d := Delivery{Key: m.Key, Kind: m.Kind, Fence: m.Fence, JobID: j.ID, EnqueuedAt: j.CreatedAt.UTC()}
			fill(&d, j, settledAt)
			if out = append(out, d); len(out) == limit {
				return out, nil
			}
		}
		if len(res.Jobs) < page {
			return out, nil
		}
		params = params.After(res.LastCursor)
	}
}
