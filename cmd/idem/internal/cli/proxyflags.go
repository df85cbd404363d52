package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/console"
	"github.com/idem-go/idem/cmd/idem/internal/storeurl"
	"github.com/idem-go/idem/maintenance"
	"github.com/idem-go/idem/store"
)

// proxySynopsis is the usage text of idem proxy.
const proxySynopsis = `--upstream URL [flags]

Puts the idempotency engine in front of the API at --upstream: a request
under an Idempotency-Key runs once, and its retries get the first answer.

Duplicates in flight (a retry that arrives while its first attempt still
runs, as Go's transport and most SDKs send them): the duplicate waits up to
--wait (5s) for the first answer to be stored and gets it replayed. After
the wait, or at once with --wait 0, it gets --in-progress-status with
Retry-After: under --profile ietf 409 (every retrying client retries it) or
202 (only for clients that read the problem type of a 2xx: Stripe's SDKs,
Python requests and anything that takes 2xx for done would take it for the
result); under --profile stripe 429 with the code lock_timeout and
Stripe-Should-Retry: true (the one refusal stripe-go retries, unlike
Stripe's own 409 idempotency_key_in_use, which --in-progress-status 409
gives). 202 is refused with --profile stripe. Each waiting duplicate holds
its connection and reads the store about four times a second.

While it serves, the proxy runs the background services, unless
--maintenance=false: the sweeper moves in-progress records whose lease
expired (their holder crashed) to unknown every --sweep-interval, the
reaper deletes expired records every --reap-interval, and with
--resolve-url the reconciler asks the upstream's operators about unknown
outcomes every --reconcile-interval. Several proxies on one store may all
run them. Without a reconciler, settle unknown records with
idem reconcile resolve (or idem reconcile run).

With --admin, /metrics serves the engine's metrics in the Prometheus format
(idem_reserve_outcomes_total{outcome=...}, idem_store_errors_total,
idem_store_duration_seconds, idem_zombies_swept_total, ...).
With OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) set,
the proxy exports its spans over OTLP/HTTP; it continues the caller's W3C
traceparent and passes it on to the upstream.

Asynchronous routes: --async 'POST /v1/reports' (repeatable; a method and a
ServeMux path pattern) records a keyed request on that route and answers 202
Accepted at once, with Location: /.idem/requests/ID and Retry-After; a
worker of any proxy on the store (--async-workers each, 0 for none) forwards
it to the upstream once and stores the answer, which retries with the key and
GET Location (same tenant only) then replay. A request no worker claims
within --async-wait ends with a stored 408. Authorization and Cookie are
never stored unless --async-keep-headers names them. A route of the config
file with "async": true is the same as --async for its pattern (both may be
given: one route, with the file's key-required, fields and lease-policy; an
asynchronous route takes no ttl or lease and cannot be "protected": false).
Asynchronous patterns are matched before the file's other routes.
Per-tenant protection (off by default): --tenant-rate limits the new keys
a tenant sends a second (key spraying: a client minting a fresh key per
request to defeat deduplication, or filling the store), per proxy;
--tenant-max-active caps the records a tenant holds in progress or
awaiting reconciliation, counted by the store across every proxy on it
(a client holding many keys in flight, or probing for keys). Over either:
429 with Retry-After, nothing reserved, nothing forwarded. Replays and
duplicates in flight are never charged. --tenant-max-active is not for a
Redis store, which cannot count a tenant's records atomically (the proxy
refuses to start). --new-key-rate bounds the new keys the proxy takes from
all tenants together, a second: a client minting a fresh credential for
every request makes a new tenant each time, which the per-tenant limits
cannot see. --store-max-active bounds the records held in flight across the
whole store, whatever the tenant: 503 over-capacity with Retry-After,
nothing reserved. The store counts them at most once a second per proxy
and each proxy adds what it created since, so proxies together can pass
the bound briefly; it is not for a Redis store, which cannot count them
(the proxy refuses to start).

Store circuit breaker: after --breaker-failures failed reservations in a
row, requests get 503 with Retry-After at once, without waiting for the
store (up to its 5s timeout each), for --breaker-open; then one request at a
time probes the store: a success closes the breaker, a failure opens it
again for twice as long, up to --breaker-max-open. Logged and counted
(idem_breaker_opened_total, idem_breaker_closed_total).

Every stored answer and every replay carries Idempotency-Key-Expires, the
HTTP-date until which the key's answer is replayed (a --ttl after the
answer was stored).

Resource limits: --max-header-bytes (431 above it), --body-timeout (a
client that stalls while sending its body is cut off, its connection
closed), --max-buffered-bytes (keyed requests whose bodies would exceed it
are answered 503 with Retry-After at once). Methods that are not upper
case are refused with 400. If the store cannot be opened at start, the
proxy serves anyway: protected requests get 503 and /readyz is not ready
until the store opens (retried in the background, migrated with --migrate).

` + tenantSourcesHelp + `

` + configHelp + `

` + resolveProtocol + "\n\n" + webhookHelp

// defaultWait is --wait's default: most clients (Go's own transport,
// Stripe's SDKs) resend sooner than a slow upstream answers, and a
// duplicate that waits gets the answer instead of a refusal it must retry.
// It bounds what a duplicate storm holds: a connection and a store read
// every 250ms per waiting duplicate (docs/http-contract.md, "Duplicates in flight").
const defaultWait = 5 * time.Second

// proxyFlag is one setting of idem proxy. Its name is the flag (--name),
// and by the rules every command follows (flagsource.go) also its
// environment variable (env) and its member in the config file (member):
// one name for the three, so they cannot drift apart.
type proxyFlag struct {
	name string
	// def is the default, of the type target points to (a string, []string
	// or whole number for a flag.Value: its text); "" for none.
	def any
	// help is the flag's usage; a `word` in back quotes names its value.
	help string
	// target is the parser and where it puts the value: a *string, *bool,
	// *int, *float64 or *time.Duration, parsed as the flag package parses
	// them, or a flag.Value with a parser of its own.
	target func(*proxyArgs) any
}

// proxyArgs is what idem proxy's flags are parsed into: the
// configuration, and the values that take a step (checks, a file to read)
// before they become part of it.
type proxyArgs struct {
	cfg                                          ProxyConfig
	configFile                                   string
	store, cache                                 dsnFlag
	leasePolicy                                  choiceFlag
	keyRequired, echoKey                         optionalBool
	keyReused, inProgress                        statusFlag
	maxResponse, maxHeader, maxBuffered, maxBody byteSize
	replayCache                                  sizeOrOff
	gcHeadroom                                   sizeOrOff
	fields, methods, asyncKeep                   listFlag
	breakerFailures                              int
	tenantSecretFile, fpSecretFile               string
	maintenance                                  bool
	webhook                                      webhookFlags
	logFormat, logLevel                          string
}

func newProxyArgs() *proxyArgs {
	return &proxyArgs{
		store: dsnFlag{name: "store"}, cache: dsnFlag{name: "cache"},
		leasePolicy: choiceFlag{valid: func(v string) bool { return store.LeasePolicy(v).Valid() }, want: "unknown, retry or resume"},
		keyReused: statusFlag{zero: "profile", check: func(n int) error {
			if n < 400 || n > 499 {
				return errors.New("want a 4xx status")
			}
			return nil
		}},
		inProgress: statusFlag{zero: "profile", check: func(n int) error {
			if n != http.StatusConflict && n != http.StatusAccepted && n != http.StatusTooManyRequests {
				return errors.New("want 409, 202 (ietf only) or 429 (stripe only)")
			}
			return nil
		}},
	}
}

// funcFlag is a flag that hands each value to a function, as fs.Func's.
type funcFlag func(string) error

func (funcFlag) String() string       { return "" }
func (f funcFlag) Set(s string) error { return f(s) }

// proxyFlags is idem proxy's flag set: the help, the environment and the
// config file are all read from it.
var proxyFlags = []proxyFlag{
	{"listen", defaultListen, "`address` the proxy listens on", func(a *proxyArgs) any { return &a.cfg.Listen }},
	{"upstream", "", "base `URL` of the API behind the proxy (required)", func(a *proxyArgs) any { return &a.cfg.Upstream }},
	{"store", storeurl.Default, dsnHelp("store", storeHelp),
		func(a *proxyArgs) any { return &a.store.value }},
	{"store-file", "", dsnFileHelp("store"),
		func(a *proxyArgs) any { return &a.store.file }},
	{"migrate", true, "apply the store's pending migrations at start", func(a *proxyArgs) any { return &a.cfg.Migrate }},
	{"store-conns", 0, "connection pool `size` of a PostgreSQL or MySQL store; 0: the store's default (PostgreSQL 32 unless the URL sets pool_max_conns, MySQL no cap)",
		func(a *proxyArgs) any { return &a.cfg.StoreConns }},
	{"store-batches", 0, "group commits a PostgreSQL store may have in flight (`slots`); 0: the store's default (1), -1: no batching; more suit a database server with many cores",
		func(a *proxyArgs) any { return &a.cfg.StoreBatches }},
	{"store-replay-cache", "0", "memory `size` for completed records a PostgreSQL store replays without a round trip (e.g. 64MiB); deletes and settlements reach every proxy's memory before they return; 0: none",
		func(a *proxyArgs) any { return &a.replayCache }},
	{"store-listen", "", "direct PostgreSQL `URL` the replay cache LISTENs on, when --store goes through a pooler in transaction mode",
		func(a *proxyArgs) any { return &a.cfg.StoreListen }},
	{"store-partitions", time.Duration(0), "keep a new PostgreSQL store's records in a table partitioned by retention, one partition per this `duration` (e.g. 24h), which the maintenance drops whole once it has passed; 0: the plain table",
		func(a *proxyArgs) any { return &a.cfg.StorePartitions }},
	{"profile", string(idem.ProfileIETF), "HTTP dialect: ietf (key required, 422 on reuse, problem+json) or stripe",
		func(a *proxyArgs) any { return (*string)(&a.cfg.Profile) }},
	{"config", "", "JSON `file` of settings and per-route settings (see above)", func(a *proxyArgs) any { return &a.configFile }},
	{"ttl", idem.DefaultTTL, "how long a completed response is replayed", func(a *proxyArgs) any { return &a.cfg.TTL }},
	{"lease", idem.DefaultLease, "lease of an execution, renewed while the upstream works", func(a *proxyArgs) any { return &a.cfg.Lease }},
	{"lease-policy", string(store.LeaseUnknown), "`policy` for a retry that finds the holder of the key died: unknown (settled by the reconciler or an operator), retry (runs again) or resume (runs again, told it resumes)",
		func(a *proxyArgs) any { return &a.leasePolicy }},
	{"key-required", "profile", "refuse a protected request without a key (400): true, false (it passes through), or profile (true under ietf, false under stripe)",
		func(a *proxyArgs) any { return &a.keyRequired }},
	{"key-reused-status", "profile", "`status` of a key reused with another request: a 4xx, or profile (422 under ietf, 400 under stripe)",
		func(a *proxyArgs) any { return &a.keyReused }},
	{"in-progress-status", "profile", "`status` of a duplicate of an in-flight request that --wait did not settle, with Retry-After: 409 or 202 under ietf; 429 (lock_timeout) or 409 under stripe; or profile (409 under ietf, 429 under stripe)",
		func(a *proxyArgs) any { return &a.inProgress }},
	{"retry-after", idem.DefaultRetryAfter, "Retry-After of the in-flight, unknown-outcome and 503 answers (whole seconds)",
		func(a *proxyArgs) any { return &a.cfg.RetryAfter }},
	{"store-timeout", idem.DefaultStoreTimeout, "bound on every store call; over it the request is answered 503 before the upstream is called",
		func(a *proxyArgs) any { return &a.cfg.StoreTimeout }},
	{"store-server-errors", false, "keep 5xx and 408/425/429 answers as final and replay them (Stripe v1), instead of letting a retry run again",
		func(a *proxyArgs) any { return &a.cfg.StoreServerErrors }},
	{"max-response-bytes", idem.DefaultMaxResponseBytes, "largest response body `size` kept for replays; a larger answer is passed on, and its replays say the body was not kept",
		func(a *proxyArgs) any { return &a.maxResponse }},
	{"fields", "", "comma-separated JSON `members` that identify a request (payment.amount names a nested one); none: the whole body",
		func(a *proxyArgs) any { return &a.fields }},
	{"key-header", idem.DefaultKeyHeader, "`name` of the request header that carries the idempotency key",
		func(a *proxyArgs) any { return &a.cfg.KeyHeader }},
	{"echo-key", "profile", "send the key back, as sent, in --key-header on every answer to a keyed request (replays and problems too): true, false, or profile (true under stripe, where Stripe's SDKs read it, false under ietf)",
		func(a *proxyArgs) any { return &a.echoKey }},
	{"wait", defaultWait, "how long a duplicate of an in-flight request waits for the first to finish and gets its answer replayed; after it (or with 0, at once) it gets --in-progress-status",
		func(a *proxyArgs) any { return &a.cfg.Wait }},
	{"tenant-rate", 0.0, "new keys a `second` each tenant may send, per proxy (over it: 429 tenant-rate-limited; replays and duplicates are free); 0: no limit",
		func(a *proxyArgs) any { return &a.cfg.TenantRate }},
	{"tenant-burst", 0, "new keys a tenant may send at once under --tenant-rate; 0: one second's worth",
		func(a *proxyArgs) any { return &a.cfg.TenantBurst }},
	{"new-key-rate", 0.0, "new keys a `second` this proxy takes from all tenants together (over it: 429 new-keys-limited; replays and duplicates are free); 0: no limit",
		func(a *proxyArgs) any { return &a.cfg.NewKeyRate }},
	{"new-key-burst", 0, "new keys the proxy takes at once under --new-key-rate; 0: one second's worth",
		func(a *proxyArgs) any { return &a.cfg.NewKeyBurst }},
	{"tenant-max-active", 0, "`records` a tenant may hold waiting for a worker (--async), in progress or awaiting reconciliation, across every proxy on the store (over it: 429 tenant-over-cap); 0: no cap",
		func(a *proxyArgs) any { return &a.cfg.TenantMaxActive }},
	{"store-max-active", 0, "`records` held waiting for a worker, in progress or awaiting reconciliation across the whole store, whatever the tenant (over it: 503 over-capacity; counted every --store-active-recount, so proxies together may pass it briefly); 0: no bound",
		func(a *proxyArgs) any { return &a.cfg.StoreMaxActive }},
	{"store-active-recount", idem.DefaultStoreActiveRecount, "how old the count behind --store-max-active may be: shorter keeps proxies sharing a store closer to the bound, for one counting query per proxy that often",
		func(a *proxyArgs) any { return &a.cfg.StoreActiveRecount }},
	{"breaker-failures", idem.DefaultBreakerFailures, "store failures in a row that open the circuit breaker (503 at once, without waiting for the store); 0: no breaker",
		func(a *proxyArgs) any { return &a.breakerFailures }},
	{"breaker-open", idem.DefaultBreakerOpen, "first interval the circuit breaker stays open before one request probes the store; it doubles while probes fail",
		func(a *proxyArgs) any { return &a.cfg.BreakerOpen }},
	{"breaker-max-open", idem.DefaultBreakerMaxOpen, "bound on the circuit breaker's interval as it doubles",
		func(a *proxyArgs) any { return &a.cfg.BreakerMaxOpen }},
	{"tenant-from", "", "tenant `source`: authorization, header:NAME, cookie:NAME or trusted-header:NAME (repeatable or comma-separated; the first present wins; see above)",
		func(a *proxyArgs) any {
			return funcFlag(func(v string) error {
				if _, err := parseTenantSources([]string{v}); err != nil {
					return err
				}
				a.cfg.TenantFrom = append(a.cfg.TenantFrom, v)
				return nil
			})
		}},
	{"tenant-header", "", "deprecated: --tenant-from trusted-header:`NAME`", func(a *proxyArgs) any { return &a.cfg.TenantHeader }},
	{"single-tenant", false, "one trusted caller: every request shares one tenant (instead of --tenant-from)",
		func(a *proxyArgs) any { return &a.cfg.SingleTenant }},
	{"tenant-secret-file", "", "`file` holding the secret that keys the tenant hashes (else $" + tenantSecretEnv + ")",
		func(a *proxyArgs) any { return &a.tenantSecretFile }},
	{"fingerprint-secret-file", "", "`file` holding the secret that keys request fingerprints (else $" + fingerprintSecretEnv + "; none: plain SHA-256)",
		func(a *proxyArgs) any { return &a.fpSecretFile }},
	{"max-header-bytes", defaultMaxHeaderBytes, "largest request line and headers `size` (larger: 431)",
		func(a *proxyArgs) any { return &a.maxHeader }},
	{"body-timeout", defaultBodyTimeout, "time a client gets to send a request body; a stalled client is cut off (0: no limit)",
		func(a *proxyArgs) any { return &a.cfg.BodyTimeout }},
	{"max-buffered-bytes", defaultMaxBufferedBytes, "bound on the `size` of the request bodies held in memory at once (over it: 503 + Retry-After at once); at least --max-body",
		func(a *proxyArgs) any { return &a.maxBuffered }},
	{"methods", idem.DefaultMethods(), "comma-separated `methods` under idempotency keys; others pass through",
		func(a *proxyArgs) any { return &a.methods }},
	{"max-body", idem.DefaultMaxBodyBytes, "largest request `size` fingerprinted (larger: 413), e.g. 1MiB",
		func(a *proxyArgs) any { return &a.maxBody }},
	{"upstream-timeout", defaultUpstreamTimeout, "wait for the upstream's response headers (after it, the outcome is unknown); 0 for no limit",
		func(a *proxyArgs) any { return &a.cfg.UpstreamTimeout }},
	{"gc-headroom", defaultGCHeadroom, "heap `size` the proxy may allocate between garbage collections while what it keeps alive is smaller (Go's default collects each time the heap doubles, from 4 MiB on: every few dozen requests of a proxy whose store is a database); 0, or GOGC in the environment: Go's default",
		func(a *proxyArgs) any { return &a.gcHeadroom }},
	{"shutdown-timeout", defaultShutdownTimeout, "time in-flight requests get to finish at shutdown",
		func(a *proxyArgs) any { return &a.cfg.ShutdownTimeout }},
	{"admin", "", "`address` of the admin server (/healthz, /readyz, /metrics); off when empty", func(a *proxyArgs) any { return &a.cfg.Admin }},
	{"console", true, "serve the operations console at /console/ on --admin (credentials from $IDEM_CONSOLE_TOKEN or $IDEM_CONSOLE_USER/$IDEM_CONSOLE_PASSWORD; required unless --admin is loopback)",
		func(a *proxyArgs) any { return &a.cfg.Console }},
	{"cache", "", dsnHelp("cache", cacheHelp),
		func(a *proxyArgs) any { return &a.cache.value }},
	{"cache-file", "", dsnFileHelp("cache"),
		func(a *proxyArgs) any { return &a.cache.file }},
	{"maintenance", true, "run the background services: sweeper, reaper, and reconciler (with --resolve-url)",
		func(a *proxyArgs) any { return &a.maintenance }},
	{"sweep-interval", maintenance.DefaultSweepInterval, "how often expired leases are swept to unknown",
		func(a *proxyArgs) any { return &a.cfg.Maintenance.SweepInterval }},
	{"reap-interval", maintenance.DefaultReapInterval, "how often expired records are reaped",
		func(a *proxyArgs) any { return &a.cfg.Maintenance.ReapInterval }},
	{"reconcile-interval", maintenance.DefaultReconcileInterval, "how often due unknown records are sent to --resolve-url",
		func(a *proxyArgs) any { return &a.cfg.Maintenance.ReconcileInterval }},
	{"soft-expire", false, "keep expired records as state expired (audit) instead of deleting them",
		func(a *proxyArgs) any { return &a.cfg.Maintenance.SoftExpire }},
	{"resolve-url", "", "`URL` the reconciler asks about unknown outcomes (protocol above); no reconciler when empty",
		func(a *proxyArgs) any { return &a.cfg.ResolveURL }},
	{"webhook-secret-file", "", webhookSecretFileHelp, func(a *proxyArgs) any { return &a.webhook.secretFile }},
	{"webhook-tolerance", DefaultWebhookTolerance, webhookToleranceHelp, func(a *proxyArgs) any { return &a.webhook.tolerance }},
	{"async", "", "asynchronous `route`, as a method and a ServeMux path pattern, e.g. 'POST /v1/reports' (repeatable, or a comma list as from the environment or a config file's array): keyed requests get 202 + Location at once and the proxy's worker forwards them",
		func(a *proxyArgs) any {
			return funcFlag(func(v string) error {
				a.cfg.Async = append(a.cfg.Async, splitPatterns(v)...)
				return nil
			})
		}},
	{"async-wait", time.Duration(0), "how long an asynchronous request waits for a worker before it ends with 408 (0: 1h, or --ttl when shorter)",
		func(a *proxyArgs) any { return &a.cfg.AsyncWait }},
	{"async-workers", idem.DefaultWorkerConcurrency, "asynchronous requests this proxy forwards at once; 0: none (this proxy only accepts them, others on the store forward them)",
		func(a *proxyArgs) any { return &a.cfg.AsyncWorkers }},
	{"async-poll", idem.DefaultWorkerPoll, "how long an idle worker waits before it looks for new asynchronous requests again",
		func(a *proxyArgs) any { return &a.cfg.AsyncPoll }},
	{"async-keep-headers", "", "comma-separated sensitive `headers` (Authorization, Cookie) kept with asynchronous requests for the upstream; never stored otherwise",
		func(a *proxyArgs) any { return &a.asyncKeep }},
	{"require-synchronous-replication", false, "refuse protected requests (503 store-not-durable) while the store's check says acknowledged answers could be lost by a failover or restart: PostgreSQL standbys that commits do not wait for, Redis without appendonly or with replicas writes do not wait for, MySQL replicas without semi-sync",
		func(a *proxyArgs) any { return &a.cfg.RequireDurable }},
	{"durability-check-interval", idem.DefaultDurabilityInterval, "how often the store's durability (replication, persistence settings) is checked again; a change is logged, and --require-synchronous-replication follows it",
		func(a *proxyArgs) any { return &a.cfg.DurabilityInterval }},
	{"log-format", "text", "log format on stderr: text or json", func(a *proxyArgs) any { return &a.logFormat }},
	{"log-level", "info", "log level: debug, info, warn or error", func(a *proxyArgs) any { return &a.logLevel }},
}

// register defines f on fs, parsed into a.
func (f proxyFlag) register(fs *flag.FlagSet, a *proxyArgs) {
	switch p := f.target(a).(type) {
	case *string:
		fs.StringVar(p, f.name, f.def.(string), f.help)
	case *bool:
		fs.BoolVar(p, f.name, f.def.(bool), f.help)
	case *int:
		fs.IntVar(p, f.name, f.def.(int), f.help)
	case *float64:
		fs.Float64Var(p, f.name, f.def.(float64), f.help)
	case *time.Duration:
		fs.DurationVar(p, f.name, f.def.(time.Duration), f.help)
	case flag.Value:
		if def := defText(f.def); def != "" {
			if err := p.Set(def); err != nil {
				panic(fmt.Sprintf("--%s: default %q: %v", f.name, def, err))
			}
		}
		fs.Var(p, f.name, f.help)
	default:
		panic(fmt.Sprintf("--%s: no parser for %T", f.name, p))
	}
}

// defText is a default given to a flag.Value, as the text it parses.
func defText(def any) string {
	switch d := def.(type) {
	case []string:
		return strings.Join(d, ",")
	case string:
		return d
	}
	return fmt.Sprint(def)
}

// proxyFlagSet is idem proxy's flag set, made of proxyFlags, and what it
// parses into.
func proxyFlagSet(stderr io.Writer) (*flag.FlagSet, *proxyArgs) {
	fs := newFlags("proxy", proxySynopsis, stderr)
	a := newProxyArgs()
	for _, f := range proxyFlags {
		f.register(fs, a)
	}
	return fs, a
}

func parseProxyFlags(args []string, stderr io.Writer) (cfg ProxyConfig, logFormat, logLevel string, err error) {
	fs, a := proxyFlagSet(stderr)
	a.cfg.ConsoleCredentials = console.CredentialsFromEnv()
	pos, err := parse(fs, args)
	if err == nil && len(pos) > 0 {
		err = usageErr(fs, "unexpected argument %q", pos[0])
	}
	if err == nil {
		err = a.settle(fs)
	}
	return a.cfg, a.logFormat, a.logLevel, err
}

// settle checks what was parsed and completes the configuration, in the
// order the settings depend on each other.
func (a *proxyArgs) settle(fs *flag.FlagSet) error {
	for _, step := range []func(*flag.FlagSet) error{
		a.settleFile, a.settleStore, a.settleTenants, a.settleLimits, a.settleMaintenance, a.settleEngine, a.settleAsync,
	} {
		if err := step(fs); err != nil {
			return err
		}
	}
	if _, err := a.cfg.checkSettings(); err != nil {
		return usageErr(fs, "%v", err)
	}
	return nil
}

// settleFile reads the config file under the command line and the
// environment, and requires the upstream wherever it came from.
func (a *proxyArgs) settleFile(fs *flag.FlagSet) (err error) {
	if a.configFile != "" {
		if a.cfg.Routes, err = loadConfig(fs, a.configFile); err != nil {
			return usageErr(fs, "--config: %v", err)
		}
	}
	if a.cfg.Upstream == "" {
		return usageErr(fs, "--upstream is required")
	}
	return nil
}

func (a *proxyArgs) settleStore(fs *flag.FlagSet) error {
	cfg := &a.cfg
	switch {
	case cfg.StoreConns < 0:
		return usageErr(fs, "--store-conns must be 0 (the store's default) or a positive pool size")
	case cfg.StoreBatches < -1:
		return usageErr(fs, "--store-batches must be -1 (no batching), 0 (the store's default) or a number of store batches")
	case cfg.TenantRate < 0 || cfg.TenantBurst < 0 || cfg.TenantMaxActive < 0 || cfg.StoreMaxActive < 0:
		return usageErr(fs, "--tenant-rate, --tenant-burst, --tenant-max-active and --store-max-active must not be negative")
	case cfg.StoreActiveRecount <= 0:
		return usageErr(fs, "--store-active-recount must be positive")
	case cfg.NewKeyRate < 0 || cfg.NewKeyBurst < 0:
		return usageErr(fs, "--new-key-rate and --new-key-burst must not be negative")
	case a.breakerFailures < 0:
		return usageErr(fs, "--breaker-failures must not be negative (0 turns the breaker off)")
	case cfg.BreakerOpen <= 0 || cfg.BreakerMaxOpen < cfg.BreakerOpen:
		return usageErr(fs, "--breaker-open must be positive and --breaker-max-open at least as long")
	case a.breakerFailures == 0:
		cfg.BreakerFailures = -1
	default:
		cfg.BreakerFailures = a.breakerFailures
	}
	if err := a.store.resolve(fs); err != nil {
		return err
	}
	if err := a.cache.resolve(fs); err != nil {
		return err
	}
	cfg.Store, cfg.Cache = a.store.value, a.cache.value
	return nil
}

func (a *proxyArgs) settleTenants(fs *flag.FlagSet) (err error) {
	cfg := &a.cfg
	if cfg.SingleTenant && (len(cfg.TenantFrom) > 0 || cfg.TenantHeader != "") {
		return usageErr(fs, "--single-tenant and --tenant-from exclude each other")
	}
	if cfg.TenantSecret, err = readSecret(a.tenantSecretFile, tenantSecretEnv, "tenant"); err != nil {
		return usageErr(fs, "%v", err)
	}
	if cfg.Secret, err = readSecret(a.fpSecretFile, fingerprintSecretEnv, "fingerprint"); err != nil {
		return usageErr(fs, "%v", err)
	}
	return nil
}

func (a *proxyArgs) settleLimits(fs *flag.FlagSet) error {
	cfg := &a.cfg
	cfg.MaxHeaderBytes = int(min(a.maxHeader, 1<<30))
	cfg.MaxBufferedBytes = int64(a.maxBuffered)
	cfg.StoreReplayCache = int64(a.replayCache)
	cfg.GCHeadroom = int64(a.gcHeadroom)
	if cfg.BodyTimeout == 0 {
		cfg.BodyTimeout = -1 // the flag's 0 means no limit
	}
	if cfg.MaxBufferedBytes < int64(a.maxBody) {
		return usageErr(fs, "--max-buffered-bytes must be at least --max-body")
	}
	if cfg.UpstreamTimeout == 0 {
		cfg.UpstreamTimeout = -1 // the flag's 0 means no limit
	}
	return nil
}

func (a *proxyArgs) settleMaintenance(fs *flag.FlagSet) (err error) {
	cfg := &a.cfg
	for name, d := range map[string]time.Duration{
		"sweep-interval": cfg.Maintenance.SweepInterval, "reap-interval": cfg.Maintenance.ReapInterval,
		"reconcile-interval": cfg.Maintenance.ReconcileInterval,
	} {
		if d <= 0 {
			return usageErr(fs, "--%s must be positive", name)
		}
	}
	cfg.NoMaintenance = !a.maintenance
	if cfg.Webhook, err = a.webhook.config(fs, cfg.Admin); err != nil {
		return err
	}
	if cfg.NoMaintenance && cfg.ResolveURL != "" {
		return usageErr(fs, "--resolve-url needs the background services: drop --maintenance=false")
	}
	if cfg.ResolveURL != "" {
		if _, err := newHTTPResolver(cfg.ResolveURL); err != nil {
			return usageErr(fs, "%v", err)
		}
	}
	if cfg.Cache != "" {
		if _, err := storeurl.ParseCache(cfg.Cache); err != nil {
			return usageErr(fs, "--cache: %v", err)
		}
	}
	return nil
}

func (a *proxyArgs) settleEngine(fs *flag.FlagSet) error {
	cfg := &a.cfg
	for i, m := range a.methods {
		a.methods[i] = strings.ToUpper(m)
	}
	cfg.Methods = a.methods
	cfg.MaxBodyBytes = int64(a.maxBody)
	cfg.LeasePolicy = store.LeasePolicy(a.leasePolicy.value)
	cfg.KeyRequired = a.keyRequired.v
	cfg.EchoKey = cfg.Profile == idem.ProfileStripe
	if a.echoKey.v != nil {
		cfg.EchoKey = *a.echoKey.v
	}
	cfg.KeyReusedStatus = a.keyReused.n
	cfg.InProgressStatus = a.inProgress.n
	switch stripe := cfg.Profile == idem.ProfileStripe; {
	case stripe && cfg.InProgressStatus == http.StatusAccepted:
		return usageErr(fs, "--in-progress-status 202 cannot be used with --profile stripe: Stripe's SDKs "+
			"take any 2xx for the result of the call; use 429 (the stripe default, retried by every Stripe SDK) or 409")
	case !stripe && cfg.InProgressStatus == http.StatusTooManyRequests:
		return usageErr(fs, "--in-progress-status 429 is for --profile stripe (Stripe's lock_timeout); under ietf use 409 or 202")
	}
	cfg.MaxResponseBytes = int(min(a.maxResponse, 1<<31-1))
	cfg.Fields = a.fields
	return nil
}

func (a *proxyArgs) settleAsync(fs *flag.FlagSet) error {
	cfg := &a.cfg
	cfg.AsyncKeepHeaders = a.asyncKeep
	switch {
	case cfg.AsyncWorkers < 0:
		return usageErr(fs, "--async-workers must not be negative")
	case cfg.AsyncPoll <= 0:
		return usageErr(fs, "--async-poll must be positive")
	case cfg.DurabilityInterval <= 0:
		return usageErr(fs, "--durability-check-interval must be positive")
	}
	return nil
}
