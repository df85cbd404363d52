package cli

import (
	"context"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/listpage"
	"github.com/idem-go/idem/cmd/idem/internal/storeurl"
	"github.com/idem-go/idem/internal/header"
	"github.com/idem-go/idem/store"
)

// runMigrate is `idem migrate`.
func runMigrate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("migrate", `[--store DSN]

Creates the store's schema, or brings it to the version this binary needs,
and prints what it did. Safe to run again and from several hosts at once.
The proxy migrates at start unless --migrate=false; run this instead when
the proxy's database user may not change the schema. Memory and Redis
stores have no schema.`, stderr)
	dsn := storeFlag(fs)
	if err := parseFlags(fs, args, dsn); err != nil {
		return err
	}
	d, err := storeurl.Parse(dsn.value)
	if err != nil {
		return err
	}
	s, err := storeurl.Open(ctx, dsn.value, storeurl.Options{})
	if err != nil {
		return err
	}
	defer s.Close()
	ok, err := storeurl.Migrate(ctx, s)
	switch {
	case err != nil:
		return fmt.Errorf("migrate %s store: %w", d.Kind, err)
	case !ok:
		fmt.Fprintf(stdout, "%s store has no schema: nothing to migrate\n", d.Kind)
	default:
		fmt.Fprintf(stdout, "%s store: migrations applied\n", d.Kind)
	}
	return nil
}

// keyFlags are the flags that name one record: a raw --scope, or the
// tenant, method and route the engine builds the scope from.
type keyFlags struct {
	store            *dsnFlag
	dsn              string // set by resolve
	scope            string
	tenant           string
	method           string
	route            string
	authorization    string
	credential       string
	tenantSecretFile string
}

// keySynopsis is the usage of the commands that name one record.
const keySynopsis = "[--store DSN] (--scope SCOPE | [--tenant T | --authorization V | --tenant-credential SOURCE=V] [--method M] --route R) KEY"

// keyHelp says how KEY is read.
const keyHelp = `KEY is the Idempotency-Key value as the client sent it: quoted ("abc", as
the IETF header sends it; quote it for the shell: '"abc"') or bare (abc).
Both name the same record.`

// scopeHelp says how a record's scope is built.
const scopeHelp = `The engine's scope is len(tenant) ":" tenant METHOD " " route, e.g.
"0:POST /v1/charges" without a tenant. Behind idem proxy the route is the
request's path and query as sent. The tenant is the value of the proxy's
trusted header (give it with --tenant), or a keyed hash of the caller's
credential: give the credential the caller sent and the command hashes it
as the proxy does, under the same tenant secret (--tenant-secret-file,
$IDEM_TENANT_SECRET, or the DB.tenant-secret file beside a SQLite store):
  --authorization 'Bearer sk_live_1'             (--tenant-from authorization)
  --tenant-credential header:X-Api-Key=k_1       (--tenant-from header:X-Api-Key)
  --tenant-credential cookie:session=s_1         (--tenant-from cookie:session)`

func (k *keyFlags) register(fs *flag.FlagSet) {
	k.store = storeFlag(fs)
	fs.StringVar(&k.scope, "scope", "", "the record's raw `scope`")
	fs.StringVar(&k.tenant, "tenant", "", "`tenant` of the request as stored, e.g. a trusted header's value (instead of --scope)")
	fs.StringVar(&k.authorization, "authorization", "", "the caller's Authorization header `value`, hashed into the tenant as the proxy does")
	fs.StringVar(&k.credential, "tenant-credential", "", "`SOURCE=VALUE`: the caller's credential in a proxy tenant source (header:NAME=V, cookie:NAME=V), hashed as the proxy does")
	fs.StringVar(&k.tenantSecretFile, "tenant-secret-file", "", "`file` holding the proxy's tenant secret (else $"+tenantSecretEnv+", else DB.tenant-secret beside a SQLite store)")
	fs.StringVar(&k.method, "method", http.MethodPost, "`method` of the request (instead of --scope)")
	fs.StringVar(&k.route, "route", "", "`route` of the request, e.g. /v1/charges (instead of --scope)")
}

// credentialTenant hashes the credential given on the command line the
// way the proxy hashes the request that carried it.
func (k *keyFlags) credentialTenant() (string, error) {
	spec, value := srcAuthorization, k.authorization
	if k.credential != "" {
		var ok bool
		if spec, value, ok = strings.Cut(k.credential, "="); !ok {
			return "", fmt.Errorf("--tenant-credential %q: want SOURCE=VALUE, e.g. header:X-Api-Key=k_1", k.credential)
		}
	}
	src, err := parseTenantSource(spec)
	if err != nil {
		return "", err
	}
	if !src.hashed() {
		return "", errors.New("a trusted header's value is the tenant as is: give it with --tenant")
	}
	secret, err := readSecret(k.tenantSecretFile, tenantSecretEnv, "tenant")
	if err == nil && secret == nil {
		path := sqliteSecretPath(k.dsn)
		if path == "" {
			return "", errors.New("hashing a credential needs the proxy's tenant secret: " + noSecretHelp)
		}
		// Read it only: an operator command never creates one.
		secret, err = readSecret(path, "", "tenant")
	}
	if err != nil {
		return "", err
	}
	r := &http.Request{Header: http.Header{}}
	switch src.kind {
	case srcAuthorization:
		r.Header.Set("Authorization", value)
	case srcHeader:
		r.Header.Set(src.name, value)
	case srcCookie:
		r.Header.Set("Cookie", src.name+"="+value)
	}
	t := &tenants{sources: []tenantSource{src}, secret: secret}
	return t.tenant(r)
}

// resolve returns the scope and key named on the command line.
func (k *keyFlags) resolve(fs *flag.FlagSet, pos []string) (scope, key string, err error) {
	if len(pos) != 1 || pos[0] == "" {
		return "", "", usageErr(fs, "want exactly one KEY argument")
	}
	key, err = parseKey(pos[0])
	if err != nil {
		return "", "", usageErr(fs, "%v", err)
	}
	set, named, err := k.settle(fs)
	if err != nil {
		return "", "", err
	}
	switch {
	case k.scope != "":
		return k.scope, key, nil
	case k.route == "":
		return "", "", usageErr(fs, "name the record with --scope, or with --route (and --tenant or a credential, --method)")
	case named > 1:
		return "", "", usageErr(fs, "give one of --tenant, --authorization and --tenant-credential")
	}
	tenant, err := k.tenantOf(fs, set)
	if err != nil {
		return "", "", err
	}
	req := idem.Request{Tenant: tenant, Method: strings.ToUpper(k.method), Route: k.route}
	return req.Scope(), key, nil
}

// settle resolves the store flags and reads which flags were set and how
// many of them name a tenant, refusing --scope together with the flags
// that build a scope.
func (k *keyFlags) settle(fs *flag.FlagSet) (set map[string]bool, named int, err error) {
	if err := k.store.resolve(fs); err != nil {
		return nil, 0, err
	}
	k.dsn = k.store.value
	set = setOn(fs)
	named = k.tenantFlags(set)
	if k.scope != "" && (named > 0 || set["method"] || set["route"]) {
		return nil, 0, usageErr(fs, "give either --scope or --tenant/--authorization/--tenant-credential/--method/--route, not both")
	}
	return set, named, nil
}

// tenantFlags counts the flags among set that name a tenant.
func (k *keyFlags) tenantFlags(set map[string]bool) int {
	named := 0
	for _, f := range []string{"tenant", "authorization", "tenant-credential"} {
		if set[f] {
			named++
		}
	}
	return named
}

// tenantOf returns the tenant the flags name: --tenant as stored, or the
// credential of --authorization or --tenant-credential hashed as the
// proxy does.
func (k *keyFlags) tenantOf(fs *flag.FlagSet, set map[string]bool) (string, error) {
	if !set["authorization"] && !set["tenant-credential"] {
		return k.tenant, nil
	}
	tenant, err := k.credentialTenant()
	if err != nil {
		return "", usageErr(fs, "%v", err)
	}
	return tenant, nil
}

// parseKey reads KEY as the Idempotency-Key field value the client sent,
// quoted ("abc", an RFC 8941 sf-string) or bare (abc), with the engine's
// own parser: both spellings name the same record.
func parseKey(arg string) (string, error) {
	key, err := header.Parse([]string{arg})
	if err != nil {
		return "", fmt.Errorf("KEY %q: %w", arg, err)
	}
	return key, nil
}

// openExisting opens the store of an operator command, which must never
// create a database or change its schema.
// A non-empty cache is the Redis replay cache in front of it (--cache).
func openExisting(ctx context.Context, dsn, cache string) (store.Store, error) {
	if path, missing := sqliteMissing(dsn); missing {
		return nil, fmt.Errorf("sqlite database %s does not exist", path)
	}
	return storeurl.Open(ctx, dsn, storeurl.Options{Cache: cache})
}

// runInspect is `idem inspect`.
func runInspect(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("inspect", "[--json] [--body-out FILE] "+keySynopsis+`

Prints the record of one key: its state, fence, attempts, times and last
error and, once it completed, the stored answer every retry replays:
status, headers and body. A body is printed as text when it is valid UTF-8
and its Content-Type is textual (text/*, JSON, XML, form); otherwise its
size, type and a hex preview of its first bytes. Control characters in
what a record holds (a terminal's escape sequences) are printed escaped,
as \x1b; --body-out writes the body exactly as stored. --json prints one
JSON object instead (the body as "body" text or "body_base64").

`+keyHelp+"\n\n"+scopeHelp, stderr)
	var k keyFlags
	k.register(fs)
	asJSON := fs.Bool("json", false, "print the record as one JSON object")
	bodyOut := fs.String("body-out", "", "write the stored response body, raw, to `FILE` (- for stdout)")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	scope, key, err := k.resolve(fs, pos)
	if err != nil {
		return err
	}
	s, err := openExisting(ctx, k.dsn, "")
	if err != nil {
		return err
	}
	defer s.Close()
	rec, err := s.Get(ctx, scope, key)
	if errors.Is(err, store.ErrNotFound) {
		return notFound(ctx, s, scope, key)
	}
	if err != nil {
		return err
	}
	if *bodyOut != "" {
		if err := writeBody(rec, *bodyOut, stdout); err != nil {
			return err
		}
		if *bodyOut == "-" {
			return nil // the body alone on stdout, for a pipe
		}
	}
	if *asJSON {
		v := viewRecord(rec)
		if rec.State == store.StateUnknown {
			viewRequest(&v, &rec) // Get reads it; a list does not
		}
		return writeJSON(stdout, v)
	}
	return printRecord(stdout, rec)
}

// writeBody writes the stored response body of rec to path, or to stdout
// for "-".
func writeBody(rec store.Record, path string, stdout io.Writer) error {
	switch {
	case rec.Response == nil:
		return fmt.Errorf("--body-out: key %q is %s and has no stored response", rec.Key, rec.State)
	case rec.Response.BodyOmitted:
		return fmt.Errorf("--body-out: the response body of key %q was too large to store and was not kept", rec.Key)
	case path == "-":
		_, err := stdout.Write(rec.Response.Body)
		return err
	}
	if err := os.WriteFile(path, rec.Response.Body, 0o600); err != nil {
		return fmt.Errorf("--body-out: %w", err)
	}
	return nil
}

// runDelete is `idem delete`.
func runDelete(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("delete", "[--fence N] [--cache URL] "+keySynopsis+`

Deletes the record of one key: the next request with it runs again. An
in-progress record is not deleted (its request may still be running).

--fence N deletes the record only if its fence is still N, as idem inspect
or the console showed it, checked by the store in the same step as the
delete. A record that ran again since (released and retried, settled,
taken over) has another fence, perhaps with an answer nobody looked at;
it is kept, and the command fails. Without --fence, the record goes
whatever ran since. Either way the command prints what went: its state,
its stored status and its fence.

With --cache (the proxy's --cache), the replay cache's entry goes too;
without it, a cached replay keeps answering until the entry's max_ttl.`, stderr)
	var k keyFlags
	k.register(fs)
	cache := cacheFlag(fs, "Redis `URL` of the proxy's replay cache, to drop its entry too: "+storeurl.CacheSupported)
	fence := fs.Int64("fence", 0, "delete only if the record's fence is still `N` (idem inspect shows it)")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if err := cache.resolve(fs); err != nil {
		return err
	}
	if setOn(fs)["fence"] && *fence <= 0 {
		return usageErr(fs, "--fence must be positive")
	}
	scope, key, err := k.resolve(fs, pos)
	if err != nil {
		return err
	}
	s, err := openExisting(ctx, k.dsn, cache.value)
	if err != nil {
		return err
	}
	defer s.Close()
	gone, err := deleteRecord(ctx, s, scope, key, *fence)
	if errors.Is(err, store.ErrNotFound) {
		return notFound(ctx, s, scope, key)
	}
	if errors.Is(err, store.ErrLeaseLost) {
		now := ""
		if rec, gerr := s.Get(ctx, scope, key); gerr == nil {
			now = fmt.Sprintf(": it is %s with fence %d", rec.State, rec.Fence)
		}
		return fmt.Errorf("key %q in scope %q ran again since fence %d%s; nothing was deleted (look at it again)", key, scope, *fence, now)
	}
	if errors.Is(err, store.ErrStateConflict) {
		return fmt.Errorf("key %q in scope %q is in progress and is not deleted: its request may still be running; "+
			"once its lease expires the sweeper makes it unknown (idem sweep), and it can be resolved or deleted then", key, scope)
	}
	if err != nil {
		return err
	}
	what := string(gone.State)
	if gone.Response != nil {
		what += fmt.Sprintf(" (%d)", gone.Response.Status)
	}
	fmt.Fprintf(stdout, "deleted key %q in scope %q: it was %s, fence %d\n", key, scope, what, gone.Fence)
	return nil
}

// deleteRecord deletes the record (scope, key) and returns it as it was.
// The delete is always fenced with the execution it returns, so what the
// command reports is what went: with fence 0 (no --fence) it reads the
// record and deletes that execution, reading again if it ran again in
// between (a few times: then the store's ErrLeaseLost is returned).
func deleteRecord(ctx context.Context, s store.Store, scope, key string, fence int64) (store.Record, error) {
	for tries := 1; ; tries++ {
		rec, err := s.Get(ctx, scope, key)
		if err != nil {
			return rec, err
		}
		f := fence
		if f == 0 {
			f = rec.Fence
		}
		err = s.Delete(ctx, store.DeleteParams{Scope: scope, Key: key, Fence: f})
		if errors.Is(err, store.ErrLeaseLost) && fence == 0 && tries < 3 {
			continue
		}
		return rec, err
	}
}

// recordView is the JSON form of a record printed by inspect. Times are
// RFC 3339 in UTC; zero times are left out.
type recordView struct {
	Scope             string            `json:"scope"`
	Key               string            `json:"key"`
	State             store.State       `json:"state"`
	Fence             int64             `json:"fence"`
	Fingerprint       string            `json:"fingerprint"`
	LeasePolicy       store.LeasePolicy `json:"lease_policy"`
	LockedUntil       *time.Time        `json:"locked_until,omitempty"`
	RecoveryPoint     string            `json:"recovery_point,omitempty"`
	Attempts          int               `json:"attempts"`
	LastError         string            `json:"last_error"`
	CreatedAt         *time.Time        `json:"created_at,omitempty"`
	UpdatedAt         *time.Time        `json:"updated_at,omitempty"`
	CompletedAt       *time.Time        `json:"completed_at,omitempty"`
	ExpiresAt         *time.Time        `json:"expires_at,omitempty"`
	ReconcileAfter    *time.Time        `json:"reconcile_after,omitempty"`
	ReconcileAttempts int               `json:"reconcile_attempts"`
	Response          *responseView     `json:"response,omitempty"`
	// Request is the request an unknown record keeps for its current
	// execution; RequestNotRecorded says why there is none.
	Request            *requestView `json:"request,omitempty"`
	RequestNotRecorded string       `json:"request_not_recorded,omitempty"`
}

type responseView struct {
	Status      int         `json:"status"`
	Header      http.Header `json:"header,omitempty"`
	BodyLength  int         `json:"body_length"`
	BodyOmitted bool        `json:"body_omitted,omitempty"`
	// Body is the body when it is text (see bodyText), BodyBase64 when not.
	Body       *string `json:"body,omitempty"`
	BodyBase64 string  `json:"body_base64,omitempty"`
}

func viewRecord(r store.Record) recordView {
	v := recordView{
		Scope: r.Scope, Key: r.Key, State: r.State, Fence: r.Fence, Fingerprint: r.Fingerprint,
		LeasePolicy: r.LeasePolicy, RecoveryPoint: r.RecoveryPoint, Attempts: r.Attempts,
		LastError: r.LastError, ReconcileAttempts: r.ReconcileAttempts,
		LockedUntil: timePtr(r.LockedUntil), CreatedAt: timePtr(r.CreatedAt), UpdatedAt: timePtr(r.UpdatedAt),
		CompletedAt: timePtr(r.CompletedAt), ExpiresAt: timePtr(r.ExpiresAt), ReconcileAfter: timePtr(r.ReconcileAfter),
	}
	if r.Response != nil {
		v.Response = &responseView{
			Status: r.Response.Status, BodyLength: len(r.Response.Body),
			BodyOmitted: r.Response.BodyOmitted, Header: r.Response.Header,
		}
		if text, ok := bodyText(r.Response); ok {
			v.Response.Body = &text
		} else if len(r.Response.Body) > 0 {
			v.Response.BodyBase64 = base64.StdEncoding.EncodeToString(r.Response.Body)
		}
	}
	return v
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	t = t.UTC()
	return &t
}

// notFound is the error for a key with no record in scope: it names the
// tenants that have a record of that key for the same operation, since the
// usual cause is a tenant not given (or another one).
func notFound(ctx context.Context, s store.Store, scope, key string) error {
	err := fmt.Errorf("no record for key %q in scope %q", key, scope)
	recs, _, lerr := listpage.Filtered(ctx, s, store.ListParams{Key: key, Limit: store.MaxListLimit}, 0, 0,
		func(r *store.Record) bool { return r.Scope != scope && sameOperation(r.Scope, scope) })
	if lerr != nil || len(recs) == 0 {
		return err
	}
	var tenants []string
	for _, r := range recs {
		t, _, _, _ := idem.ParseScope(r.Scope)
		if q := strconv.Quote(t); !slices.Contains(tenants, q) {
			tenants = append(tenants, q)
		}
	}
	return fmt.Errorf("%w; the key has a record for this route under tenant %s: give it with --tenant", err, strings.Join(tenants, ", "))
}
