package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/idem-go/idem/internal/plural"

	"github.com/idem-go/idem/maintenance"
	"github.com/idem-go/idem/store"
)

// The operator commands run one pass of a background service (package
// maintenance) against a store and print what it did: for a cron job
// when no proxy runs the services, or for an operator who wants it now.

// maintainer opens the store of an operator command and returns the
// background services over it. cfg's zero fields take the defaults. The
// caller closes the store.
func maintainer(ctx context.Context, dsn string, cfg maintenance.Config, stderr io.Writer) (*maintenance.Maintainer, store.Store, error) {
	return countedMaintainer(ctx, dsn, cfg, stderr, nil)
}

// countedMaintainer is maintainer whose passes count their batches and
// records in c when c is not nil.
func countedMaintainer(ctx context.Context, dsn string, cfg maintenance.Config, stderr io.Writer, c *passCounter) (*maintenance.Maintainer, store.Store, error) {
	s, err := openExisting(ctx, dsn, "")
	if err != nil {
		return nil, nil, err
	}
	var ms store.Store = s
	if c != nil {
		ms = countingStore{Store: s, c: c}
		if cfg.Resolver != nil {
			cfg.Resolver = countingResolver{Resolver: cfg.Resolver, c: c}
		}
	}
	// The services' events (each swept zombie, each dead letter) go to
	// stderr; stdout keeps the command's own report.
	cfg.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	m, err := maintenance.New(ms, cfg)
	if err != nil {
		s.Close()
		return nil, nil, err
	}
	return m, s, nil
}

// maintenanceConfig is the configuration of the proxy's background
// services: a response settled as happened is replayed as long as one the
// engine stored, and the services log and measure where the engine does.
func (p *Proxy) maintenanceConfig() maintenance.Config {
	c := p.cfg.Maintenance
	if c.TTL == 0 {
		c.TTL = p.engine.TTL()
	}
	if c.StoreTimeout == 0 {
		c.StoreTimeout = p.engine.StoreTimeout()
	}
	if c.Logger == nil {
		c.Logger = p.cfg.Logger
	}
	if c.Observer == nil {
		c.Observer = p.obs
	}
	return c
}

// positive checks a numeric flag that must be above zero.
func positive(fs *flag.FlagSet, name string, v int) error {
	if v <= 0 {
		return usageErr(fs, "--%s must be positive", name)
	}
	return nil
}

// runSweep is `idem sweep`.
func runSweep(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("sweep", `[--store DSN] [--batch N]

Moves every in-progress record whose lease expired (its holder died) to
unknown, once, and prints how many. Records whose lease policy is retry or
resume stay for their retry to take over. The proxy runs this every
--sweep-interval unless --maintenance=false.`, stderr)
	dsn := storeFlag(fs)
	batch := fs.Int("batch", maintenance.DefaultBatchSize, "records changed per store call")
	if err := parseFlags(fs, args, dsn); err != nil {
		return err
	}
	if err := positive(fs, "batch", *batch); err != nil {
		return err
	}
	m, s, err := maintainer(ctx, dsn.value, maintenance.Config{BatchSize: *batch}, stderr)
	if err != nil {
		return err
	}
	defer s.Close()
	n, err := m.SweepOnce(ctx)
	fmt.Fprintf(stdout, "swept %d expired lease(s) to unknown\n", n)
	return err
}

// runReap is `idem reap`.
func runReap(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("reap", `[--store DSN] [--soft] [--batch N] [--abandoned-ttl D] [--progress]

Deletes completed and failed records past their expiry (--soft keeps them
as state expired, for audit), and closes abandoned records (in progress or
unknown past their expiry) with a stored 504 answer, once; prints the
counts. The proxy runs this every --reap-interval unless --maintenance=false.
Over many records, --progress (the default on a terminal) prints the
batches done and records processed on stderr as the pass goes.`, stderr)
	dsn := storeFlag(fs)
	soft := fs.Bool("soft", false, "keep expired records as state expired instead of deleting them")
	batch := fs.Int("batch", maintenance.DefaultBatchSize, "records changed per store call")
	abandonedTTL := fs.Duration("abandoned-ttl", maintenance.DefaultAbandonedTTL, "how long an abandoned record keeps its 504 answer")
	var pf progressFlags
	pf.register(fs)
	if err := parseFlags(fs, args, dsn); err != nil {
		return err
	}
	if err := positive(fs, "batch", *batch); err != nil {
		return err
	}
	if *abandonedTTL <= 0 {
		return usageErr(fs, "--abandoned-ttl must be positive")
	}
	prog, err := pf.open(stderr)
	if err != nil {
		return err
	}
	var c passCounter
	m, s, err := countedMaintainer(ctx, dsn.value, maintenance.Config{BatchSize: *batch, SoftExpire: *soft, AbandonedTTL: *abandonedTTL}, stderr, &c)
	if err != nil {
		return err
	}
	defer s.Close()
	verb := "deleted"
	if *soft {
		verb = "expired"
	}
	start := time.Now()
	stop := prog.start(func() string {
		return fmt.Sprintf("reap: %s, %s (%s %d, abandoned %d), %s, %s",
			plural.Count(c.batches.Load(), "batch", "batches"), plural.Count(c.records.Load(), "record", "records"), verb, c.deleted.Load(), c.abandoned.Load(),
			rate(c.records.Load(), time.Since(start)), time.Since(start).Round(time.Millisecond))
	})
	res, err := m.ReapOnce(ctx)
	stop()
	fmt.Fprintf(stdout, "%s %d expired record(s), closed %d abandoned record(s)\n", verb, res.Deleted, res.Abandoned)
	return err
}

// reconcile is `idem reconcile`: it dispatches to its subcommands.
var reconcile = registerGroup(&group{
	name: "reconcile",
	description: `Unknown records are requests that may or may not have taken effect (the
proxy or the upstream failed mid-request). Retries get 409 until the record
is settled: as happened (retries replay the given response) or as not
happened (the next retry runs the request).`,
	subs: []command{
		{"list", "list records whose outcome is unknown", runReconcileList},
		{"resolve", "settle one unknown record by hand", runReconcileResolve},
		{"run", "ask a resolve URL about every due unknown record, once", runReconcileRun},
	},
})

// runReconcile is `idem reconcile`.
func runReconcile(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return reconcile.run(ctx, args, stdout, stderr)
}

// runReconcileList is `idem reconcile list`.
func runReconcileList(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("reconcile list", `[--store DSN] [--all] [--limit N] [--json]

Lists unknown records due for reconciliation, oldest first; --all lists
every unknown record, also those waiting for their next attempt and the
dead-lettered ones (given up on by the reconciler: only an operator settles
them, with idem reconcile resolve), shown as DEAD-LETTERED in the
RECONCILE_AFTER column. ATTEMPTS counts reconciliation attempts.`, stderr)
	dsn := storeFlag(fs)
	all := fs.Bool("all", false, "list every unknown record, not only the due ones")
	limit := fs.Int("limit", 100, "list at most `N` records")
	asJSON := fs.Bool("json", false, "print one JSON object per line instead of a table")
	if err := parseFlags(fs, args, dsn); err != nil {
		return err
	}
	if err := positive(fs, "limit", *limit); err != nil {
		return err
	}
	s, err := openExisting(ctx, dsn.value, "")
	if err != nil {
		return err
	}
	defer s.Close()
	recs, err := s.ListUnknown(ctx, store.ListUnknownParams{DueOnly: !*all, Limit: *limit})
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		for _, r := range recs {
			v := struct {
				recordView
				DeadLettered bool `json:"dead_lettered"`
			}{viewRecord(r), r.DeadLettered()}
			if err := enc.Encode(v); err != nil {
				return err
			}
		}
	} else {
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "SCOPE\tKEY\tFENCE\tATTEMPTS\tRECONCILE_AFTER\tLAST_ERROR")
		for _, r := range recs {
			after := r.ReconcileAfter.UTC().Format(time.RFC3339)
			if r.DeadLettered() {
				after = "DEAD-LETTERED"
			}
			fmt.Fprintf(tw, "%q\t%q\t%d\t%d\t%s\t%s\n", r.Scope, r.Key, r.Fence, r.ReconcileAttempts, after, oneLine(r.LastError))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if len(recs) == *limit {
		fmt.Fprintf(stderr, "idem reconcile list: showing the first %d; there may be more (--limit)\n", *limit)
	}
	return nil
}

// oneLine keeps a table row on one line whatever an error message holds,
// and its control characters off the terminal (printable).
func oneLine(s string) string {
	return printable(strings.Join(strings.Fields(s), " "), false)
}

// headerFlag collects repeated --header 'Name: value' flags.
type headerFlag struct{ h http.Header }

func (f *headerFlag) String() string { return "" }

func (f *headerFlag) Set(s string) error {
	name, value, ok := strings.Cut(s, ":")
	if !ok {
		return errors.New(`want "Name: value"`)
	}
	if f.h == nil {
		f.h = http.Header{}
	}
	return addHeader(f.h, strings.TrimSpace(name), value)
}

// reconcileResolveSynopsis is the usage text of idem reconcile resolve.
const reconcileResolveSynopsis = `KEY (--scope S | [--tenant T] [--method M] --route R) [--store DSN] --fence N
       (--completed --status CODE [--header 'Name: value']... [--body TEXT | --body @FILE] | --retryable)

Settles one unknown record. --completed: the request took effect, and every
retry replays the given status, headers and body (with Idempotent-Replayed:
true). --retryable: it certainly had no effect, and the next retry runs it.
Only unknown records can be settled; in-progress ones are swept to unknown
once their lease expires (idem sweep).

--fence names the execution the decision is about: the record's fence as
idem reconcile list, idem inspect or the console showed it. A record that
ran again since has another fence, and the settlement is refused: a
decision about one execution never settles the next.

` + scopeHelp

// runReconcileResolve is `idem reconcile resolve`.
func runReconcileResolve(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("reconcile resolve", reconcileResolveSynopsis, stderr)
	var k keyFlags
	k.register(fs)
	var d decisionFlags
	d.register(fs)
	ttl := fs.Duration("ttl", maintenance.DefaultTTL, "how long the settled record is kept (completed: replayed)")
	fence := fs.Int64("fence", 0, "the record's fence `N` the decision is about (idem reconcile list shows it)")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	scope, key, err := k.resolve(fs, pos)
	if err != nil {
		return err
	}
	res, err := d.resolution(fs)
	if err != nil {
		return err
	}
	set := setOn(fs)
	if *ttl <= 0 {
		return usageErr(fs, "--ttl must be positive")
	}
	if set["fence"] && *fence <= 0 {
		return usageErr(fs, "--fence must be positive")
	}
	m, s, err := maintainer(ctx, k.dsn, maintenance.Config{TTL: *ttl}, stderr)
	if err != nil {
		return err
	}
	defer s.Close()
	if !set["fence"] {
		// Said with the record's fence when there is one, so the operator
		// checks it is the execution the decision is about.
		now := ""
		if rec, gerr := s.Get(ctx, scope, key); gerr == nil {
			now = fmt.Sprintf(" (key %q is %s with fence %d)", key, rec.State, rec.Fence)
		}
		return usageErr(fs, "--fence is required: the fence of the execution the decision is about, as idem reconcile list shows it%s", now)
	}
	if err := m.Settle(ctx, scope, key, *fence, res); err != nil {
		return settleError(ctx, s, scope, key, *fence, err)
	}
	to := store.StateCompleted
	if res.Outcome == maintenance.DidNotHappen {
		to = store.StateFailedRetryable
	}
	fmt.Fprintf(stdout, "resolved key %q in scope %q: %s\n", key, scope, to)
	return nil
}

// decisionFlags are the flags of idem reconcile resolve that say the
// decision: --completed with the response to replay, or --retryable.
type decisionFlags struct {
	completed, retryable bool
	status               int
	hdr                  headerFlag
	body                 string
}

func (f *decisionFlags) register(fs *flag.FlagSet) {
	fs.BoolVar(&f.completed, "completed", false, "the request took effect: store the response given by --status, --header and --body")
	fs.BoolVar(&f.retryable, "retryable", false, "the request had no effect: release the key so the next retry runs it")
	fs.IntVar(&f.status, "status", 0, "HTTP status `code` replayed to every retry (with --completed)")
	fs.Var(&f.hdr, "header", "response header `'Name: value'` replayed (repeatable; with --completed)")
	fs.StringVar(&f.body, "body", "", "response body replayed: `TEXT`, or @FILE to read it from a file (with --completed)")
}

// resolution is the decision the flags of fs say.
func (f *decisionFlags) resolution(fs *flag.FlagSet) (maintenance.Resolution, error) {
	set := setOn(fs)
	var res maintenance.Resolution
	switch {
	case f.completed == f.retryable:
		return res, usageErr(fs, "give exactly one of --completed and --retryable")
	case f.retryable:
		if set["status"] || set["header"] || set["body"] {
			return res, usageErr(fs, "--status, --header and --body go with --completed")
		}
		res.Outcome = maintenance.DidNotHappen
	default:
		if !set["status"] {
			return res, usageErr(fs, "--completed needs --status")
		}
		if err := checkStatus(f.status); err != nil {
			return res, usageErr(fs, "--status: %v", err)
		}
		b := []byte(f.body)
		if path, ok := strings.CutPrefix(f.body, "@"); ok {
			var err error
			if b, err = os.ReadFile(path); err != nil {
				return res, fmt.Errorf("--body: %w", err)
			}
		}
		res = maintenance.Resolution{Outcome: maintenance.Happened, Response: &store.Response{Status: f.status, Header: f.hdr.h, Body: b}}
	}
	return res, nil
}

// settleError says why settling key in scope at fence failed with err,
// with what the record is now.
func settleError(ctx context.Context, s store.Store, scope, key string, fence int64, err error) error {
	switch {
	case errors.Is(err, store.ErrNotFound):
		return notFound(ctx, s, scope, key)
	case errors.Is(err, store.ErrLeaseLost):
		now := ""
		if rec, gerr := s.Get(ctx, scope, key); gerr == nil {
			now = fmt.Sprintf(": it is %s with fence %d", rec.State, rec.Fence)
		}
		return fmt.Errorf("key %q in scope %q ran again since fence %d%s; nothing was settled (look at it again)", key, scope, fence, now)
	case errors.Is(err, store.ErrStateConflict):
		state := "not unknown"
		if rec, gerr := s.Get(ctx, scope, key); gerr == nil {
			state = string(rec.State)
		}
		return fmt.Errorf("key %q in scope %q is %s: only unknown records can be settled", key, scope, state)
	}
	return err
}

// runReconcileRun is `idem reconcile run`.
func runReconcileRun(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("reconcile run", `--resolve-url URL [--store DSN] [--batch N] [--progress]

Asks the resolve URL about every unknown record that is due, once, settles
the ones it can tell, and prints the counts. The proxy does the same every
--reconcile-interval when it is given --resolve-url. Over many records,
--progress (the default on a terminal) prints the batches done and records
asked about on stderr as the pass goes.

`+resolveProtocol, stderr)
	dsn := storeFlag(fs)
	resolveURL := fs.String("resolve-url", "", "`URL` of the upstream operators' resolve endpoint (required)")
	batch := fs.Int("batch", maintenance.DefaultBatchSize, "records asked about per store call")
	var pf progressFlags
	pf.register(fs)
	if err := parseFlags(fs, args, dsn); err != nil {
		return err
	}
	if *resolveURL == "" {
		return usageErr(fs, "--resolve-url is required")
	}
	if err := positive(fs, "batch", *batch); err != nil {
		return err
	}
	r, err := newHTTPResolver(*resolveURL)
	if err != nil {
		return usageErr(fs, "%v", err)
	}
	prog, err := pf.open(stderr)
	if err != nil {
		return err
	}
	var c passCounter
	m, s, err := countedMaintainer(ctx, dsn.value, maintenance.Config{BatchSize: *batch, Resolver: r}, stderr, &c)
	if err != nil {
		return err
	}
	defer s.Close()
	start := time.Now()
	stop := prog.start(func() string {
		return fmt.Sprintf("reconcile: %s, %s asked about, %s, %s",
			plural.Count(c.batches.Load(), "batch", "batches"), plural.Count(c.records.Load(), "record", "records"), rate(c.records.Load(), time.Since(start)), time.Since(start).Round(time.Millisecond))
	})
	res, err := m.ReconcileOnce(ctx)
	stop()
	fmt.Fprintf(stdout, "resolved %d, deferred %d, dead-lettered %d\n", res.Resolved, res.Deferred, res.DeadLettered)
	return err
}
