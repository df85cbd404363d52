package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-go/idem/cmd/idem/internal/storeurl"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/store/sqlite"
)

// outboxCmd is `idem outbox`: it dispatches to its subcommands.
var outboxCmd = registerGroup(&group{
	name: "outbox",
	description: `Look after the transactional outbox (package outbox) of an application whose
handlers enqueue messages in the store's database: list the messages that
were dead-lettered, show what the outbox knows of one, and deliver a dead
one anew once what killed it is mended (a provider that was down).`,
	subs: []command{
		{"dead", "list dead-lettered messages, most recently dead first", runOutboxDead},
		{"show", "print what the outbox knows of one message: state, attempts, last error", runOutboxShow},
		{"redeliver", "enqueue a dead message again: same key, fence and payload, a new job", runOutboxRedeliver},
	},
})

// runOutbox is `idem outbox`.
func runOutbox(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return outboxCmd.run(ctx, args, stdout, stderr)
}

// outboxOps is what the commands use of an outbox, whichever its
// database's transaction type.
type outboxOps interface {
	DeadLetters(ctx context.Context, limit int) ([]outbox.Delivery, error)
	Delivery(ctx context.Context, key, kind string) (outbox.Delivery, error)
	Redeliver(ctx context.Context, key, kind string) (outbox.Delivery, error)
}

// outboxFlags are the flags every outbox subcommand takes.
type outboxFlags struct {
	store       *dsnFlag
	queue       string
	maxAttempts int
	asJSON      bool
}

func (o *outboxFlags) register(fs *flag.FlagSet) {
	o.store = registerDSN(fs, "store", storeurl.Default,
		"`DSN` of the database that holds the outbox: sqlite:PATH or postgres://... (River's tables in its search_path)")
	fs.StringVar(&o.queue, "queue", outbox.DefaultQueue, "River `queue` of the outbox (its Config.Queue)")
	fs.BoolVar(&o.asJSON, "json", false, "print JSON instead of text")
}

// open opens the outbox of the parsed flags without delivering, creating
// or migrating anything: an outbox without deliverers only reads and
// enqueues.
func (o *outboxFlags) open(ctx context.Context, fs *flag.FlagSet) (outboxOps, func(), error) {
	d, err := storeurl.Parse(o.store.value)
	if err != nil {
		return nil, nil, usageErr(fs, "--store: %v", err)
	}
	cfg := outbox.Config{Queue: o.queue, MaxAttempts: o.maxAttempts, Logger: slog.New(slog.DiscardHandler)}
	switch d.Kind {
	case storeurl.Postgres:
		pcfg, err := pgxpool.ParseConfig(d.Target)
		if err != nil {
			return nil, nil, usageErr(fs, "--store: %v", err)
		}
		pcfg.MaxConns = 2
		pool, err := pgxpool.NewWithConfig(ctx, pcfg)
		if err != nil {
			return nil, nil, fmt.Errorf("open the database: %w", err)
		}
		ob, err := outbox.NewPostgres(pool, cfg)
		if err != nil {
			pool.Close()
			return nil, nil, err
		}
		return ob, pool.Close, nil
	case storeurl.SQLite:
		if path, missing := sqliteMissing(o.store.value); missing {
			return nil, nil, fmt.Errorf("sqlite database %s does not exist", path)
		}
		s, err := sqlite.Open(ctx, d.Target, sqlite.Config{SkipMigrate: true})
		if err != nil {
			return nil, nil, fmt.Errorf("open the database: %w", err)
		}
		ob, err := outbox.NewSQLite(s.DB(), cfg)
		if err != nil {
			s.Close()
			return nil, nil, err
		}
		return ob, func() { s.Close() }, nil
	}
	return nil, nil, usageErr(fs, "--store: an outbox lives in PostgreSQL or SQLite, not %s", d.Kind)
}

// deliveryView is one message in --json.
type deliveryView struct {
	Key          string       `json:"key"`
	Kind         string       `json:"kind"`
	Fence        int64        `json:"fence"`
	State        outbox.State `json:"state"`
	Attempts     int          `json:"attempts"`
	LastError    string       `json:"last_error,omitempty"`
	DownstreamID string       `json:"downstream_id,omitempty"`
	EnqueuedAt   *time.Time   `json:"enqueued_at,omitempty"`
	DeliveredAt  *time.Time   `json:"delivered_at,omitempty"`
	SettledAt    *time.Time   `json:"settled_at,omitempty"`
	JobID        int64        `json:"job_id"`
}

func viewDelivery(d outbox.Delivery) deliveryView {
	return deliveryView{
		Key: d.Key, Kind: d.Kind, Fence: d.Fence, State: d.State, Attempts: d.Attempts,
		LastError: d.LastError, DownstreamID: d.DownstreamID, JobID: d.JobID,
		EnqueuedAt: timePtr(d.EnqueuedAt), DeliveredAt: timePtr(d.DeliveredAt), SettledAt: timePtr(d.SettledAt),
	}
}

// printDelivery prints one message for a person.
func printDelivery(w io.Writer, d outbox.Delivery) error {
	f := newFieldList(w)
	row, at := f.row, f.at
	row("key", "%q", d.Key)
	row("kind", "%q", d.Kind)
	row("state", "%s", d.State)
	row("fence", "%d", d.Fence)
	row("attempts", "%d", d.Attempts)
	if d.LastError != "" {
		row("last error", "%s", oneLine(d.LastError))
	}
	if d.DownstreamID != "" {
		row("downstream id", "%s", printable(d.DownstreamID, false))
	}
	at("enqueued", d.EnqueuedAt)
	at("delivered", d.DeliveredAt)
	at("settled", d.SettledAt)
	row("job", "%d", d.JobID)
	return f.flush()
}

// writeJSON prints v as indented JSON, the --json form of every command
// that prints one value.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// runOutboxDead is `idem outbox dead`.
func runOutboxDead(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("outbox dead", `[--store DSN] [--queue Q] [--limit N] [--json]

Lists the dead-lettered messages of the outbox, most recently dead first:
those whose last allowed attempt failed or crashed its process, and those
whose job was cancelled, while River keeps them (DeadLetterRetention).
Settled means the application's OnDead handled it. A message enqueued again
since it died is no longer listed.`, stderr)
	var o outboxFlags
	o.register(fs)
	limit := fs.Int("limit", 50, "list at most `N` messages, 1 to 10000")
	if err := parseFlags(fs, args, o.store); err != nil {
		return err
	}
	if *limit < 1 || *limit > 10000 {
		return usageErr(fs, "--limit must be from 1 to 10000")
	}
	ob, closeDB, err := o.open(ctx, fs)
	if err != nil {
		return err
	}
	defer closeDB()
	dead, err := ob.DeadLetters(ctx, *limit)
	if err != nil {
		return err
	}
	if o.asJSON {
		views := make([]deliveryView, len(dead))
		for i, d := range dead {
			views[i] = viewDelivery(d)
		}
		return writeJSON(stdout, views)
	}
	if len(dead) == 0 {
		fmt.Fprintln(stderr, "no dead-lettered messages")
		return nil
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ENQUEUED\tKIND\tATTEMPTS\tSETTLED\tKEY\tLAST ERROR")
	for _, d := range dead {
		settled := "no"
		if !d.SettledAt.IsZero() {
			settled = "yes"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\n", d.EnqueuedAt.UTC().Format(time.RFC3339), printable(d.Kind, false),
			d.Attempts, settled, strconv.Quote(d.Key), oneLine(excerpt([]byte(d.LastError), 60)))
	}
	return tw.Flush()
}

// outboxMessage parses the flags and the KEY of a command about one
// message.
func outboxMessage(fs *flag.FlagSet, o *outboxFlags, args []string) (key, kind string, err error) {
	fs.StringVar(&kind, "kind", "", "the message's `kind` (Message.Kind); required")
	pos, err := parse(fs, args)
	if err != nil {
		return "", "", err
	}
	if err := o.store.resolve(fs); err != nil {
		return "", "", err
	}
	switch {
	case len(pos) != 1:
		return "", "", usageErr(fs, "want one KEY, the message's key (outbox.KeyFor), got %d arguments", len(pos))
	case kind == "":
		return "", "", usageErr(fs, "--kind is required")
	}
	return pos[0], kind, nil
}

// runOutboxShow is `idem outbox show`.
func runOutboxShow(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("outbox show", `[--store DSN] [--queue Q] [--json] --kind KIND KEY

Prints what the outbox knows of the message of KEY and KIND: pending (not
delivered yet: waiting, running or between retries), delivered (with the
provider's id) or dead, its fence, attempts and last error.`, stderr)
	var o outboxFlags
	o.register(fs)
	key, kind, err := outboxMessage(fs, &o, args)
	if err != nil {
		return err
	}
	ob, closeDB, err := o.open(ctx, fs)
	if err != nil {
		return err
	}
	defer closeDB()
	d, err := ob.Delivery(ctx, key, kind)
	if err != nil {
		return err
	}
	if o.asJSON {
		return writeJSON(stdout, viewDelivery(d))
	}
	return printDelivery(stdout, d)
}

// runOutboxRedeliver is `idem outbox redeliver`.
func runOutboxRedeliver(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("outbox redeliver", `[--store DSN] [--queue Q] [--max-attempts N] [--json] --kind KIND KEY

Enqueues the dead message of KEY and KIND again, as the application's
EnqueueTx of the same key, kind, fence and payload would: a new job with
--max-attempts attempts, which the application's workers deliver; if it
dies too, it is a new dead letter. The provider sees the same key, so a
charge it already made is answered, not made twice. Refused for a message
that is pending or delivered, for one that died in another queue than
--queue, and for one whose dead job River no longer keeps (past
DeadLetterRetention). Prints the message afterwards.`, stderr)
	var o outboxFlags
	o.register(fs)
	fs.IntVar(&o.maxAttempts, "max-attempts", outbox.DefaultMaxAttempts, "delivery attempts of the new job, `N` (the application's Config.MaxAttempts)")
	key, kind, err := outboxMessage(fs, &o, args)
	if err != nil {
		return err
	}
	if o.maxAttempts < 1 {
		return usageErr(fs, "--max-attempts must be positive")
	}
	ob, closeDB, err := o.open(ctx, fs)
	if err != nil {
		return err
	}
	defer closeDB()
	d, err := ob.Redeliver(ctx, key, kind)
	if errors.Is(err, outbox.ErrNotDead) {
		return fmt.Errorf("%s %q is %s, not dead: nothing to redeliver", kind, key, d.State)
	}
	if err != nil {
		return err
	}
	if o.asJSON {
		return writeJSON(stdout, viewDelivery(d))
	}
	return printDelivery(stdout, d)
}
