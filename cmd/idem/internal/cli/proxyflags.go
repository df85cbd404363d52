package cli

import (
	"errors"
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
cannot see.

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
// every 250ms per waiting duplicate (README.md, "Duplicates in flight").
const defaultWait = 5 * time.Second

func parseProxyFlags(args []string, stderr io.Writer) (cfg ProxyConfig, logFormat, logLevel string, err error) {
	fs := newFlags("proxy", proxySynopsis, stderr)
	fs.StringVar(&cfg.Listen, "listen", "127.0.0.1:8080", "`address` the proxy listens on")
	fs.StringVar(&cfg.Upstream, "upstream", "", "base `URL` of the API behind the proxy (required)")
	storeDSN := storeFlag(fs)
	fs.BoolVar(&cfg.Migrate, "migrate", true, "apply the store's pending migrations at start")
	fs.IntVar(&cfg.StoreConns, "store-conns", 0, "connection pool `size` of a PostgreSQL or MySQL store; 0: the store's default (PostgreSQL 32 unless the URL sets pool_max_conns, MySQL no cap)")
	fs.IntVar(&cfg.StoreBatches, "store-batches", 0, "group commits a PostgreSQL store may have in flight (`slots`); 0: the store's default (1), -1: no batching; more suit a database server with many cores")
	fs.StringVar(&cfg.Profile, "profile", string(idem.ProfileIETF), "HTTP dialect: ietf (key required, 422 on reuse, problem+json) or stripe")
	configFile := fs.String("config", "", "JSON `file` of settings and per-route settings (see above)")
	fs.DurationVar(&cfg.TTL, "ttl", idem.DefaultTTL, "how long a completed response is replayed")
	fs.DurationVar(&cfg.Lease, "lease", idem.DefaultLease, "lease of an execution, renewed while the upstream works")
	leasePolicy := choiceFlag{value: string(store.LeaseUnknown), valid: func(v string) bool { return store.LeasePolicy(v).Valid() },
		want: "unknown, retry or resume"}
	fs.Var(&leasePolicy, "lease-policy", "`policy` for a retry that finds the holder of the key died: unknown (settled by the reconciler or an operator), retry (runs again) or resume (runs again, told it resumes)")
	keyRequired := optionalBool{}
	fs.Var(&keyRequired, "key-required", "refuse a protected request without a key (400): true, false (it passes through), or profile (true under ietf, false under stripe)")
	keyReused := statusFlag{zero: "profile", check: func(n int) error {
		if n < 400 || n > 499 {
			return errors.New("want a 4xx status")
		}
		return nil
	}}
	fs.Var(&keyReused, "key-reused-status", "`status` of a key reused with another request: a 4xx, or profile (422 under ietf, 400 under stripe)")
	inProgress := statusFlag{zero: "profile", check: func(n int) error {
		if n != http.StatusConflict && n != http.StatusAccepted && n != http.StatusTooManyRequests {
			return errors.New("want 409, 202 (ietf only) or 429 (stripe only)")
		}
		return nil
	}}
	fs.Var(&inProgress, "in-progress-status", "`status` of a duplicate of an in-flight request that --wait did not settle, with Retry-After: 409 or 202 under ietf; 429 (lock_timeout) or 409 under stripe; or profile (409 under ietf, 429 under stripe)")
	fs.DurationVar(&cfg.RetryAfter, "retry-after", idem.DefaultRetryAfter, "Retry-After of the in-flight, unknown-outcome and 503 answers (whole seconds)")
	fs.DurationVar(&cfg.StoreTimeout, "store-timeout", idem.DefaultStoreTimeout, "bound on every store call; over it the request is answered 503 before the upstream is called")
	fs.BoolVar(&cfg.StoreServerErrors, "store-server-errors", false, "keep 5xx and 408/425/429 answers as final and replay them (Stripe v1), instead of letting a retry run again")
	maxResponse := byteSize(idem.DefaultMaxResponseBytes)
	fs.Var(&maxResponse, "max-response-bytes", "largest response body `size` kept for replays; a larger answer is passed on, and its replays say the body was not kept")
	var fields listFlag
	fs.Var(&fields, "fields", "comma-separated JSON `members` that identify a request (payment.amount names a nested one); none: the whole body")
	fs.StringVar(&cfg.KeyHeader, "key-header", idem.DefaultKeyHeader, "`name` of the request header that carries the idempotency key")
	echoKey := optionalBool{}
	fs.Var(&echoKey, "echo-key", "send the key back, as sent, in --key-header on every answer to a keyed request (replays and problems too): true, false, or profile (true under stripe, where Stripe's SDKs read it, false under ietf)")
	fs.DurationVar(&cfg.Wait, "wait", defaultWait, "how long a duplicate of an in-flight request waits for the first to finish and gets its answer replayed; after it (or with 0, at once) it gets --in-progress-status")
	fs.Float64Var(&cfg.TenantRate, "tenant-rate", 0, "new keys a `second` each tenant may send, per proxy (over it: 429 tenant-rate-limited; replays and duplicates are free); 0: no limit")
	fs.IntVar(&cfg.TenantBurst, "tenant-burst", 0, "new keys a tenant may send at once under --tenant-rate; 0: one second's worth")
	fs.Float64Var(&cfg.NewKeyRate, "new-key-rate", 0, "new keys a `second` this proxy takes from all tenants together (over it: 429 new-keys-limited; replays and duplicates are free); 0: no limit")
	fs.IntVar(&cfg.NewKeyBurst, "new-key-burst", 0, "new keys the proxy takes at once under --new-key-rate; 0: one second's worth")
	fs.IntVar(&cfg.TenantMaxActive, "tenant-max-active", 0, "`records` a tenant may hold waiting for a worker (--async), in progress or awaiting reconciliation, across every proxy on the store (over it: 429 tenant-over-cap); 0: no cap")
	breakerFailures := fs.Int("breaker-failures", idem.DefaultBreakerFailures, "store failures in a row that open the circuit breaker (503 at once, without waiting for the store); 0: no breaker")
	fs.DurationVar(&cfg.BreakerOpen, "breaker-open", idem.DefaultBreakerOpen, "first interval the circuit breaker stays open before one request probes the store; it doubles while probes fail")
	fs.DurationVar(&cfg.BreakerMaxOpen, "breaker-max-open", idem.DefaultBreakerMaxOpen, "bound on the circuit breaker's interval as it doubles")
	var tenantFrom listFlag
	fs.Func("tenant-from", "tenant `source`: authorization, header:NAME, cookie:NAME or trusted-header:NAME (repeatable or comma-separated; the first present wins; see above)", func(v string) error {
		if _, err := parseTenantSources([]string{v}); err != nil {
			return err
		}
		tenantFrom = append(tenantFrom, v)
		return nil
	})
	fs.StringVar(&cfg.TenantHeader, "tenant-header", "", "deprecated: --tenant-from trusted-header:`NAME`")
	fs.BoolVar(&cfg.SingleTenant, "single-tenant", false, "one trusted caller: every request shares one tenant (instead of --tenant-from)")
	tenantSecretFile := fs.String("tenant-secret-file", "", "`file` holding the secret that keys the tenant hashes (else $"+tenantSecretEnv+")")
	fpSecretFile := fs.String("fingerprint-secret-file", "", "`file` holding the secret that keys request fingerprints (else $"+fingerprintSecretEnv+"; none: plain SHA-256)")
	maxHeader := byteSize(defaultMaxHeaderBytes)
	fs.Var(&maxHeader, "max-header-bytes", "largest request line and headers `size` (larger: 431)")
	fs.DurationVar(&cfg.BodyTimeout, "body-timeout", defaultBodyTimeout, "time a client gets to send a request body; a stalled client is cut off (0: no limit)")
	maxBuffered := byteSize(defaultMaxBufferedBytes)
	fs.Var(&maxBuffered, "max-buffered-bytes", "bound on the `size` of the request bodies held in memory at once (over it: 503 + Retry-After at once); at least --max-body")
	methods := listFlag{http.MethodPost, http.MethodPatch}
	fs.Var(&methods, "methods", "comma-separated `methods` under idempotency keys; others pass through")
	maxBody := byteSize(idem.DefaultMaxBodyBytes)
	fs.Var(&maxBody, "max-body", "largest request `size` fingerprinted (larger: 413), e.g. 1MiB")
	fs.DurationVar(&cfg.UpstreamTimeout, "upstream-timeout", 60*time.Second, "wait for the upstream's response headers (after it, the outcome is unknown); 0 for no limit")
	fs.DurationVar(&cfg.ShutdownTimeout, "shutdown-timeout", 20*time.Second, "time in-flight requests get to finish at shutdown")
	fs.StringVar(&cfg.Admin, "admin", "", "`address` of the admin server (/healthz, /readyz, /metrics); off when empty")
	fs.BoolVar(&cfg.Console, "console", true, "serve the operations console at /console/ on --admin (credentials from $IDEM_CONSOLE_TOKEN or $IDEM_CONSOLE_USER/$IDEM_CONSOLE_PASSWORD; required unless --admin is loopback)")
	cfg.ConsoleCredentials = console.CredentialsFromEnv()
	cacheDSN := cacheFlag(fs, "Redis `URL` of a replay cache in front of the store: "+storeurl.CacheSupported)
	runMaintenance := fs.Bool("maintenance", true, "run the background services: sweeper, reaper, and reconciler (with --resolve-url)")
	fs.DurationVar(&cfg.Maintenance.SweepInterval, "sweep-interval", maintenance.DefaultSweepInterval, "how often expired leases are swept to unknown")
	fs.DurationVar(&cfg.Maintenance.ReapInterval, "reap-interval", maintenance.DefaultReapInterval, "how often expired records are reaped")
	fs.DurationVar(&cfg.Maintenance.ReconcileInterval, "reconcile-interval", maintenance.DefaultReconcileInterval, "how often due unknown records are sent to --resolve-url")
	fs.BoolVar(&cfg.Maintenance.SoftExpire, "soft-expire", false, "keep expired records as state expired (audit) instead of deleting them")
	fs.StringVar(&cfg.ResolveURL, "resolve-url", "", "`URL` the reconciler asks about unknown outcomes (protocol above); no reconciler when empty")
	webhook := registerWebhookFlags(fs)
	fs.Func("async", "asynchronous `route`, as a method and a ServeMux path pattern, e.g. 'POST /v1/reports' (repeatable, or a comma list as from the environment or a config file's array): keyed requests get 202 + Location at once and the proxy's worker forwards them", func(v string) error {
		cfg.Async = append(cfg.Async, splitPatterns(v)...)
		return nil
	})
	fs.DurationVar(&cfg.AsyncWait, "async-wait", 0, "how long an asynchronous request waits for a worker before it ends with 408 (0: 1h, or --ttl when shorter)")
	fs.IntVar(&cfg.AsyncWorkers, "async-workers", idem.DefaultWorkerConcurrency, "asynchronous requests this proxy forwards at once; 0: none (this proxy only accepts them, others on the store forward them)")
	fs.DurationVar(&cfg.AsyncPoll, "async-poll", idem.DefaultWorkerPoll, "how long an idle worker waits before it looks for new asynchronous requests again")
	var asyncKeep listFlag
	fs.Var(&asyncKeep, "async-keep-headers", "comma-separated sensitive `headers` (Authorization, Cookie) kept with asynchronous requests for the upstream; never stored otherwise")
	fs.BoolVar(&cfg.RequireSynchronousReplication, "require-synchronous-replication", false, "refuse protected requests (503 store-not-durable) while the store's check says acknowledged answers could be lost by a failover or restart: PostgreSQL standbys that commits do not wait for, Redis without appendonly or with replicas writes do not wait for, MySQL replicas without semi-sync")
	fs.DurationVar(&cfg.DurabilityInterval, "durability-check-interval", idem.DefaultDurabilityInterval, "how often the store's durability (replication, persistence settings) is checked again; a change is logged, and --require-synchronous-replication follows it")
	fs.StringVar(&logFormat, "log-format", "text", "log format on stderr: text or json")
	fs.StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn or error")
	pos, err := parse(fs, args)
	if err != nil {
		return cfg, "", "", err
	}
	if len(pos) > 0 {
		return cfg, "", "", usageErr(fs, "unexpected argument %q", pos[0])
	}
	if *configFile != "" {
		if cfg.Routes, err = loadConfig(fs, *configFile); err != nil {
			return cfg, "", "", usageErr(fs, "--config: %v", err)
		}
	}
	if cfg.Upstream == "" {
		return cfg, "", "", usageErr(fs, "--upstream is required")
	}
	switch {
	case cfg.StoreConns < 0:
		return cfg, "", "", usageErr(fs, "--store-conns must be 0 (the store's default) or a positive pool size")
	case cfg.StoreBatches < -1:
		return cfg, "", "", usageErr(fs, "--store-batches must be -1 (no batching), 0 (the store's default) or a number of store batches")
	case cfg.TenantRate < 0 || cfg.TenantBurst < 0 || cfg.TenantMaxActive < 0:
		return cfg, "", "", usageErr(fs, "--tenant-rate, --tenant-burst and --tenant-max-active must not be negative")
	case cfg.NewKeyRate < 0 || cfg.NewKeyBurst < 0:
		return cfg, "", "", usageErr(fs, "--new-key-rate and --new-key-burst must not be negative")
	case *breakerFailures < 0:
		return cfg, "", "", usageErr(fs, "--breaker-failures must not be negative (0 turns the breaker off)")
	case cfg.BreakerOpen <= 0 || cfg.BreakerMaxOpen < cfg.BreakerOpen:
		return cfg, "", "", usageErr(fs, "--breaker-open must be positive and --breaker-max-open at least as long")
	case *breakerFailures == 0:
		cfg.BreakerFailures = -1
	default:
		cfg.BreakerFailures = *breakerFailures
	}
	if err := storeDSN.resolve(fs); err != nil {
		return cfg, "", "", err
	}
	if err := cacheDSN.resolve(fs); err != nil {
		return cfg, "", "", err
	}
	cfg.Store, cfg.Cache = storeDSN.value, cacheDSN.value
	cfg.TenantFrom = tenantFrom
	if cfg.SingleTenant && (len(tenantFrom) > 0 || cfg.TenantHeader != "") {
		return cfg, "", "", usageErr(fs, "--single-tenant and --tenant-from exclude each other")
	}
	if cfg.TenantSecret, err = readSecret(*tenantSecretFile, tenantSecretEnv, "tenant"); err != nil {
		return cfg, "", "", usageErr(fs, "%v", err)
	}
	if cfg.FingerprintSecret, err = readSecret(*fpSecretFile, fingerprintSecretEnv, "fingerprint"); err != nil {
		return cfg, "", "", usageErr(fs, "%v", err)
	}
	cfg.MaxHeaderBytes = int(min(maxHeader, 1<<30))
	cfg.MaxBufferedBytes = int64(maxBuffered)
	if cfg.BodyTimeout == 0 {
		cfg.BodyTimeout = -1 // the flag's 0 means no limit
	}
	if cfg.MaxBufferedBytes < int64(maxBody) {
		return cfg, "", "", usageErr(fs, "--max-buffered-bytes must be at least --max-body")
	}
	if cfg.UpstreamTimeout == 0 {
		cfg.UpstreamTimeout = -1 // the flag's 0 means no limit
	}
	for name, d := range map[string]time.Duration{
		"sweep-interval": cfg.Maintenance.SweepInterval, "reap-interval": cfg.Maintenance.ReapInterval,
		"reconcile-interval": cfg.Maintenance.ReconcileInterval,
	} {
		if d <= 0 {
			return cfg, "", "", usageErr(fs, "--%s must be positive", name)
		}
	}
	cfg.NoMaintenance = !*runMaintenance
	if cfg.Webhook, err = webhook.config(fs, cfg.Admin); err != nil {
		return cfg, "", "", err
	}
	if cfg.NoMaintenance && cfg.ResolveURL != "" {
		return cfg, "", "", usageErr(fs, "--resolve-url needs the background services: drop --maintenance=false")
	}
	if cfg.ResolveURL != "" {
		if _, err := newHTTPResolver(cfg.ResolveURL); err != nil {
			return cfg, "", "", usageErr(fs, "%v", err)
		}
	}
	if cfg.Cache != "" {
		if _, err := storeurl.ParseCache(cfg.Cache); err != nil {
			return cfg, "", "", usageErr(fs, "--cache: %v", err)
		}
	}
	for i, m := range methods {
		methods[i] = strings.ToUpper(m)
	}
	cfg.Methods = methods
	cfg.MaxBody = int64(maxBody)
	cfg.LeasePolicy = leasePolicy.value
	cfg.KeyRequired = keyRequired.v
	cfg.EchoKey = cfg.Profile == string(idem.ProfileStripe)
	if echoKey.v != nil {
		cfg.EchoKey = *echoKey.v
	}
	cfg.KeyReusedStatus = keyReused.n
	cfg.InProgressStatus = inProgress.n
	switch stripe := cfg.Profile == string(idem.ProfileStripe); {
	case stripe && cfg.InProgressStatus == http.StatusAccepted:
		return cfg, "", "", usageErr(fs, "--in-progress-status 202 cannot be used with --profile stripe: Stripe's SDKs "+
			"take any 2xx for the result of the call; use 429 (the stripe default, retried by every Stripe SDK) or 409")
	case !stripe && cfg.InProgressStatus == http.StatusTooManyRequests:
		return cfg, "", "", usageErr(fs, "--in-progress-status 429 is for --profile stripe (Stripe's lock_timeout); under ietf use 409 or 202")
	}
	cfg.MaxResponseBytes = int(min(maxResponse, 1<<31-1))
	cfg.Fields = fields
	cfg.AsyncKeepHeaders = asyncKeep
	if cfg.AsyncWorkers < 0 {
		return cfg, "", "", usageErr(fs, "--async-workers must not be negative")
	}
	if cfg.AsyncPoll <= 0 {
		return cfg, "", "", usageErr(fs, "--async-poll must be positive")
	}
	if cfg.DurabilityInterval <= 0 {
		return cfg, "", "", usageErr(fs, "--durability-check-interval must be positive")
	}
	if _, err := cfg.checkSettings(); err != nil {
		return cfg, "", "", usageErr(fs, "%v", err)
	}
	return cfg, logFormat, logLevel, nil
}
