package cli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/listpage"
	"github.com/idem-go/idem/store"
)

// keys is `idem keys`: it dispatches to its subcommands.
var keys = registerGroup(&group{
	name: "keys",
	description: `Browse the idempotency records of a store: which keys a tenant or a route
used, in which state, with which answer. idem inspect shows one in full.`,
	subs: []command{
		{"list", "list records, newest first, by route, tenant, state or key", runKeysList},
	},
})

// runKeys is `idem keys`.
func runKeys(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return keys.run(ctx, args, stdout, stderr)
}

// keysPage is the JSON form of one page of idem keys list.
type keysPage struct {
	Records []keyView `json:"records"`
	// Next is the --after value of the next page; empty on the last page.
	Next string `json:"next,omitempty"`
}

// keyView is one record of idem keys list.
type keyView struct {
	Scope       string      `json:"scope"`
	Tenant      string      `json:"tenant"`
	Method      string      `json:"method"`
	Route       string      `json:"route"`
	Key         string      `json:"key"`
	State       store.State `json:"state"`
	Fence       int64       `json:"fence"`
	Attempts    int         `json:"attempts"`
	Status      int         `json:"status,omitempty"` // of the stored answer
	LastError   string      `json:"last_error,omitempty"`
	CreatedAt   *time.Time  `json:"created_at,omitempty"`
	UpdatedAt   *time.Time  `json:"updated_at,omitempty"`
	ExpiresAt   *time.Time  `json:"expires_at,omitempty"`
	DeadLetters bool        `json:"dead_lettered,omitempty"`
}

func viewKey(r store.Record) keyView {
	tenant, method, route, _ := idem.ParseScope(r.Scope)
	v := keyView{
		Scope: r.Scope, Tenant: tenant, Method: method, Route: route, Key: r.Key, State: r.State,
		Fence: r.Fence, Attempts: r.Attempts, LastError: r.LastError, DeadLetters: r.DeadLettered(),
		CreatedAt: timePtr(r.CreatedAt), UpdatedAt: timePtr(r.UpdatedAt), ExpiresAt: timePtr(r.ExpiresAt),
	}
	if r.Response != nil {
		v.Status = r.Response.Status
	}
	return v
}

// keysFilter is what idem keys list keeps. The store filters by scope
// prefix, key and state; the exact route is checked here, since a route's
// scope is also the prefix of longer routes ("/v1/charges" of
// "/v1/charges?x=1").
type keysFilter struct {
	params store.ListParams
	scope  string // exact scope to keep; "" keeps every scope under the prefix
	// anyTenant keeps the operation of scope under any tenant.
	anyTenant bool
}

// keysListSynopsis is the usage text of idem keys list.
const keysListSynopsis = `[--store DSN] [--tenant T | --authorization V | --tenant-credential SOURCE=V]
       [[--method M] --route R | --scope S] [--state STATE] [--key KEY] [--limit N] [--after CURSOR] [--json]

Lists records newest first (by creation), --limit at a time: created,
state, attempts, the stored answer's status, method and route, tenant and
key (--json adds fence, times and last error). Filters combine: --tenant
keeps one tenant's records (or --authorization / --tenant-credential: the
caller's credential, hashed as the proxy does), --route (with --method)
one operation's, of every tenant unless one is named (--tenant "" for
records without a tenant), --scope one raw scope, --state
one state (in_progress, completed, failed_retryable, unknown, expired),
--key one key (quoted or bare, as the client sent it). When there are
more, the command ends with the --after CURSOR of the next page (on stderr,
or "next" in --json). Paging is stable: records created after the first
page do not shift later pages.

` + scopeHelp

// runKeysList is `idem keys list`.
func runKeysList(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("keys list", keysListSynopsis, stderr)
	var k keyFlags
	k.register(fs)
	state := fs.String("state", "", "keep records in this `state`: in_progress, completed, failed_retryable, unknown or expired")
	key := fs.String("key", "", "keep records of this `KEY`, quoted or bare")
	limit := fs.Int("limit", 50, "records per page, `N` from 1 to "+strconv.Itoa(store.MaxListLimit))
	after := fs.String("after", "", "continue after this `CURSOR`, printed at the end of the previous page")
	asJSON := fs.Bool("json", false, "print the page as one JSON object: records and the next cursor")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	f, err := k.filter(fs)
	if err != nil {
		return err
	}
	if *limit < 1 || *limit > store.MaxListLimit {
		return usageErr(fs, "--limit must be from 1 to %d", store.MaxListLimit)
	}
	f.params.Limit = *limit
	if *state != "" {
		if f.params.State = store.State(*state); !f.params.State.Valid() {
			return usageErr(fs, "--state %q: want in_progress, completed, failed_retryable, unknown or expired", *state)
		}
	}
	if *key != "" {
		if f.params.Key, err = parseKey(*key); err != nil {
			return usageErr(fs, "--key: %v", err)
		}
	}
	if *after != "" {
		c, err := store.ParseCursor(*after)
		if err != nil {
			return usageErr(fs, "--after: %v", err)
		}
		f.params.After = &c
	}
	s, err := openExisting(ctx, k.dsn, "")
	if err != nil {
		return err
	}
	defer s.Close()
	recs, next, err := listKeys(ctx, s, f)
	if err != nil {
		return err
	}
	page := keysPage{Records: make([]keyView, 0, len(recs))}
	for _, r := range recs {
		page.Records = append(page.Records, viewKey(r))
	}
	if next != nil {
		page.Next = next.String()
	}
	if *asJSON {
		return writeJSON(stdout, page)
	}
	return printKeysPage(stdout, stderr, page)
}

// printKeysPage prints page as a table on stdout, and on stderr that it
// is empty or where the next page starts.
func printKeysPage(stdout, stderr io.Writer, page keysPage) error {
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CREATED\tSTATE\tSTATUS\tATTEMPTS\tOPERATION\tTENANT\tKEY")
	for _, v := range page.Records {
		created, status, state := "-", "-", string(v.State)
		if v.CreatedAt != nil {
			created = v.CreatedAt.Format(time.RFC3339)
		}
		if v.Status != 0 {
			status = strconv.Itoa(v.Status)
		}
		if v.DeadLetters {
			state += " (dead-lettered)"
		}
		op := printable(v.Method+" "+v.Route, false)
		if v.Method == "" {
			op = fmt.Sprintf("scope %q", v.Scope)
		}
		tenant := printable(v.Tenant, false)
		if tenant == "" {
			tenant = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%q\n", created, state, status, v.Attempts, op, tenant, v.Key)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(page.Records) == 0 {
		fmt.Fprintln(stderr, "idem keys list: no records match")
	}
	if page.Next != "" {
		fmt.Fprintf(stderr, "idem keys list: more records; next page: --after %s\n", page.Next)
	}
	return nil
}

// filter builds the listing the flags ask for.
func (k *keyFlags) filter(fs *flag.FlagSet) (keysFilter, error) {
	var f keysFilter
	set, named, err := k.settle(fs)
	if err != nil {
		return f, err
	}
	switch {
	case k.scope != "":
		f.scope, f.params.ScopePrefix = k.scope, k.scope
		return f, nil
	case named > 1:
		return f, usageErr(fs, "give one of --tenant, --authorization and --tenant-credential")
	case set["method"] && k.route == "":
		return f, usageErr(fs, "--method goes with --route")
	}
	tenant, err := k.tenantOf(fs, set)
	if err != nil {
		return f, err
	}
	switch {
	case k.route != "" && named == 0:
		// No tenant named: the route under every tenant. The store cannot
		// filter by the end of a scope; every record is read and checked.
		f.anyTenant = true
		f.scope = (&idem.Request{Method: strings.ToUpper(k.method), Route: k.route}).Scope()
	case k.route != "":
		f.scope = (&idem.Request{Tenant: tenant, Method: strings.ToUpper(k.method), Route: k.route}).Scope()
		f.params.ScopePrefix = f.scope
	case named > 0:
		// Every scope of a tenant starts with its length and itself.
		f.params.ScopePrefix = strconv.Itoa(len(tenant)) + ":" + tenant
	}
	return f, nil
}

// listKeys reads one page of f: store pages until f.params.Limit records
// pass the exact-scope check, or the store has no more. The next cursor
// is that of the last record read, so no record is skipped or repeated.
func listKeys(ctx context.Context, s store.Store, f keysFilter) ([]store.Record, *store.Cursor, error) {
	return listpage.Filtered(ctx, s, f.params, 0, 0, func(r *store.Record) bool {
		if f.anyTenant {
			return sameOperation(r.Scope, f.scope)
		}
		return f.scope == "" || r.Scope == f.scope
	})
}

// sameOperation reports whether scopes a and b name the same method and
// route, whatever their tenants.
func sameOperation(a, b string) bool {
	_, am, ar, aok := idem.ParseScope(a)
	_, bm, br, bok := idem.ParseScope(b)
	return aok && bok && am == bm && ar == br
}
