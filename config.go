package idem

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/textproto"
	"slices"
	"strings"
	"time"

	"github.com/idem-go/idem/internal/fingerprint"
	"github.com/idem-go/idem/internal/httpfield"
	"github.com/idem-go/idem/store"
)

// Defaults of the Config fields that New applies to a zero field, for
// programs (such as the idem proxy) that show or compare them.
const (
	DefaultInProgressStatus = http.StatusConflict
	// DefaultStripeInProgressStatus is InProgressStatus's default under
	// ProfileStripe: 429 lock_timeout, which every official Stripe SDK
	// retries.
	DefaultStripeInProgressStatus = http.StatusTooManyRequests
	DefaultTTL                    = 24 * time.Hour
	DefaultLease                  = 30 * time.Second
	DefaultRetryAfter             = time.Second
	DefaultStoreTimeout           = 5 * time.Second
	DefaultMaxBodyBytes           = 1 << 20
	DefaultMaxResponseBytes       = 1 << 20
	DefaultKeyHeader              = "Idempotency-Key"
	DefaultBreakerFailures        = 5
	DefaultBreakerOpen            = time.Second
	DefaultBreakerMaxOpen         = 30 * time.Second
	// DefaultDurabilityInterval is Config.DurabilityInterval's default.
	DefaultDurabilityInterval = time.Minute
	// DefaultStoreActiveRecount is Config.StoreActiveRecount's default.
	DefaultStoreActiveRecount = time.Second
)

// Profile selects the HTTP dialect of the engine's own responses.
type Profile string

const (
	// ProfileIETF follows draft-ietf-httpapi-idempotency-key-header: a
	// missing key on a protected method is 400, a key reused with another
	// request is 422, errors are RFC 9457 problem details.
	ProfileIETF Profile = "ietf"
	// ProfileStripe follows Stripe's API: a missing key passes through, a
	// reused key is 400, errors use {"error":{"type":"idempotency_error"}}.
	ProfileStripe Profile = "stripe"
)

// Config configures an Engine. The zero value is valid: every field has a
// documented default, applied by New. Fields the profile decides
// (KeyRequired, KeyReusedStatus) are pointers so that an explicit choice
// overrides the profile.
type Config struct {
	// Profile is the HTTP dialect. Defaults to ProfileIETF.
	Profile Profile

	// Methods are the protected methods, matched without regard to case;
	// other methods pass through untouched, with or without a key.
	// Defaults to DefaultMethods(): POST and PATCH.
	Methods []string

	// KeyRequired: a protected request without Idempotency-Key is refused
	// with 400 instead of passing through. Defaults to true under
	// ProfileIETF and false under ProfileStripe.
	KeyRequired *bool

	// KeyReusedStatus is the status for a key reused with a different
	// request. Defaults to 422 under ProfileIETF and 400 under
	// ProfileStripe.
	KeyReusedStatus int

	// InProgressStatus is the status for a request whose key another
	// execution holds (and that Wait did not settle), always with
	// Retry-After. Under ProfileIETF: 409 Conflict or 202 Accepted (202
	// suits only clients that read the problem type of a 2xx; see
	// docs/http-contract.md). Under ProfileStripe: 429 with the error code lock_timeout
	// and Stripe-Should-Retry: true, the one refusal every official Stripe
	// SDK retries, or 409 with idempotency_key_in_use, Stripe's own answer,
	// which stripe-go does not retry; 202 is refused, since Stripe's SDKs
	// take any 2xx for the result. Defaults to 409 under ProfileIETF and
	// 429 under ProfileStripe.
	InProgressStatus int

	// TTL is how long a completed response is replayed. Defaults to 24h.
	TTL time.Duration

	// Lease is how long an execution holds its key before it must renew;
	// the engine renews it every Lease/3 while the handler runs, so only a
	// dead or cut-off holder loses it. Defaults to 30s.
	Lease time.Duration

	// LeasePolicy decides what a retry finds after the holder died.
	// Defaults to store.LeaseUnknown.
	LeasePolicy store.LeasePolicy

	// MaxBodyBytes bounds the request body read for the fingerprint;
	// larger bodies get 413. Defaults to 1 MiB.
	MaxBodyBytes int64

	// MaxResponseBytes bounds the response body kept for replay. An answer
	// within it is buffered and sent once stored; a larger one is sent as
	// it is written, and the record keeps only its status and headers
	// (replays say the body was not kept). Defaults to 1 MiB.
	MaxResponseBytes int

	// StoreServerErrors keeps 5xx and the transient 4xx (408, 425, 429) as
	// the final answer (Stripe v1 behaviour) instead of releasing the key
	// for another attempt. Defaults to false.
	StoreServerErrors bool

	// Wait, when positive, makes a duplicate of an in-flight request wait up
	// to Wait for the original to finish and then replay its response,
	// instead of answering InProgressStatus at once: clients (Go's
	// transport among them) often resend sooner than a slow handler
	// answers. A waiting duplicate holds its request and reads the store
	// every 5ms, doubling to 250ms; duplicates of one key waiting in one
	// engine share the read under way. Defaults to 0 (answer at once); the
	// idem proxy's --wait defaults to 5s (docs/http-contract.md, "Duplicates in
	// flight").
	Wait time.Duration

	// RetryAfter is the Retry-After sent with the in-flight and unknown
	// answers and 503. Defaults to 1s.
	RetryAfter time.Duration

	// StoreTimeout bounds every store call; a call that takes longer fails
	// closed with 503 before the handler runs. Defaults to 5s.
	StoreTimeout time.Duration

	// Fields, when set, fingerprints only these JSON members (or form
	// keys) instead of the whole body. A field is a path of member names
	// separated by '.' (payment.amount), with '~' written ~0 and '.' in a
	// name written ~1; New refuses a field that is not such a path.
	// Defaults to the whole body.
	Fields []string

	// KeyHeader names the request header that carries the idempotency key.
	// It must be an HTTP token and is matched case-insensitively (it is
	// canonicalised). Defaults to Idempotency-Key.
	KeyHeader string

	// EchoKey sends the key back, as the client sent it, in KeyHeader on
	// every answer to a keyed request: executed answers, replays and
	// problems alike, so a client (or a log of answers) can tell which key
	// an answer belongs to. Defaults to false.
	EchoKey bool

	// TenantRate, when positive, limits each tenant to TenantRate new keys
	// a second, a token bucket holding TenantBurst: a call whose key has no
	// record yet and finds the bucket empty gets 429 (tenant-rate-limited)
	// with Retry-After, nothing reserved. Replays, duplicates in flight and
	// retries of a released key are not charged. The buckets live in the
	// Engine (and in those derived with With, unless they set another rate
	// or burst): N instances admit up to N times the rate. Defaults to 0
	// (no limit).
	TenantRate float64

	// TenantBurst is how many new keys a tenant may send at once under
	// TenantRate. Defaults to one second's worth (TenantRate rounded up).
	TenantBurst int

	// NewKeyRate, when positive, limits the whole Engine, whatever the
	// tenant, to NewKeyRate new keys a second, a token bucket holding
	// NewKeyBurst: a bound that needs no tenant, so callers that mint
	// tenants for free (a fresh credential each time) cannot spray records
	// past it. A call whose key has no record yet and finds the bucket
	// empty gets 429 (new-keys-limited) with Retry-After, nothing reserved;
	// replays, duplicates in flight and retries of a released key are not
	// charged. Per Engine: N instances admit up to N times the rate.
	// Defaults to 0 (no limit).
	NewKeyRate float64

	// NewKeyBurst is how many new keys the Engine admits at once under
	// NewKeyRate. Defaults to one second's worth (NewKeyRate rounded up).
	NewKeyBurst int

	// TenantMaxActive, when positive, caps the records a tenant holds in
	// progress or awaiting reconciliation: a call that would start one more
	// gets 429 (tenant-over-cap) with Retry-After, nothing reserved. The
	// store counts them atomically with the reservation, so the cap holds
	// across every instance sharing the store. Defaults to 0 (no cap).
	TenantMaxActive int

	// StoreMaxActive, when positive, bounds the records held active
	// (waiting for a worker, in progress or awaiting reconciliation) across
	// the whole store, whatever the tenant: a bound that needs no tenant,
	// so callers that mint tenants for free cannot hold more than it in
	// flight however they spread over tenants. A call whose key has no
	// record yet while the store is at the bound gets 503 (over-capacity)
	// with Retry-After, nothing reserved; replays and duplicates pass.
	//
	// The bound is approximate, not atomic: the engine counts the store's
	// active records (one query that stops at StoreMaxActive, through
	// store.ActiveCounter) at most every StoreActiveRecount, and adds the
	// records it created since. One instance stays within the bound;
	// several instances sharing the store can together pass it by what
	// the others created within one recount interval, and a record
	// settled meanwhile frees its place only at the next count. Needs a
	// store that counts (New refuses the Redis store, and PostgreSQL
	// without postgres.Config.TenantCap). Defaults to 0 (no bound).
	StoreMaxActive int

	// StoreActiveRecount is how old the count behind StoreMaxActive may
	// be. Defaults to DefaultStoreActiveRecount (1s).
	StoreActiveRecount time.Duration

	// BreakerFailures is how many failures in a row of the store calls that
	// start a request (errors and timeouts of reservations, not definite
	// answers) open the store's circuit breaker:
	// requests then get 503 with Retry-After at once, without calling the
	// store, for BreakerOpen; then one request at a time probes the store,
	// and a success closes the breaker while a failure opens it again for
	// twice as long, up to BreakerMaxOpen. Executions already running keep
	// calling the store. The breaker belongs to the engine made by New and
	// is shared by those derived with With (their breaker settings are
	// ignored). Defaults to 5; negative disables the breaker.
	BreakerFailures int

	// BreakerOpen is the first interval the breaker stays open. Defaults
	// to 1s.
	BreakerOpen time.Duration

	// BreakerMaxOpen bounds the interval as it doubles. Defaults to 30s.
	BreakerMaxOpen time.Duration

	// RequireDurable refuses protected requests (503 store-not-durable,
	// with Retry-After; the handler does not run) while the store's
	// durability check (store.DurabilityChecker) says acknowledged answers
	// could be lost by a restart or a failover (PostgreSQL: standbys
	// attached but commits do not wait for them), or cannot tell. New
	// fails when the store has no such check. Defaults to false: the
	// engine only logs what the check finds (at New, and when it changes).
	RequireDurable bool

	// DurabilityInterval is how often the engine checks the store's
	// durability again (when the store implements
	// store.DurabilityChecker); the check runs in the background of a
	// request or a readiness check that finds the last one older.
	// Defaults to 1m.
	DurabilityInterval time.Duration

	// Secret keys the fingerprint (HMAC-SHA-256) so stored fingerprints do
	// not reveal request contents. Defaults to plain SHA-256.
	Secret []byte

	// Tenant returns the caller's tenant, taken from authentication (never
	// from the body); keys of two tenants never meet. Defaults to one
	// shared tenant "".
	Tenant func(*http.Request) string

	// Route returns the route of a request for the scope and fingerprint.
	// Defaults to r.Pattern when the mux set it (the middleware sits inside
	// the mux), else the URL path.
	Route func(*http.Request) string

	// Logger receives state-change events. Defaults to slog.Default().
	Logger *slog.Logger

	// Observer receives the engine's metrics and the steps of each call,
	// for traces (package otelidem reports them to OpenTelemetry).
	// Defaults to none.
	Observer Observer

	// Async accepts the requests of the route asynchronously: the first
	// request with a key is recorded as pending, with what is needed to run
	// it later, and answered at once with 202 Accepted, Retry-After and a
	// Location naming its status resource (see StatusHandler); a Worker
	// claims and runs it. Retries with the key, and reads of the status
	// resource, get 202 until the stored answer exists, then that answer.
	// The store must implement store.Queue. Defaults to false.
	Async bool

	// AsyncQueue names the queue an asynchronous request waits in: the
	// Worker serving it must claim from the same queue. Defaults to
	// "default".
	AsyncQueue string

	// AsyncWait bounds how long an accepted request waits for a worker;
	// a request no worker claimed in time ends with a stored 408 answer
	// (the maintenance services end it). It must not exceed TTL.
	// Defaults to 1h, or TTL when that is shorter.
	AsyncWait time.Duration

	// AsyncKeepHeaders names sensitive request headers that are kept with
	// an asynchronous request all the same, for a worker that needs them
	// (a worker that must authenticate as the client). Authorization,
	// Proxy-Authorization and Cookie are otherwise never stored, nor are
	// hop-by-hop headers. Defaults to none.
	AsyncKeepHeaders []string

	// AsyncDropHeaders names more request headers an asynchronous request
	// never keeps unless AsyncKeepHeaders names them: the credentials a
	// tenant is taken from (an API key header). Defaults to none.
	AsyncDropHeaders []string

	// StatusPath is the path prefix of the status resources of
	// asynchronous requests: Location is StatusPath followed by the
	// request's id. Its leading segment starts with a dot, which no route
	// of an API uses. Defaults to "/.idem/requests/".
	StatusPath string
}

// settings is a Config with every default applied.
type settings struct {
	Config
	keyRequired bool
	methods     map[string]bool // upper case
}

// protected reports whether requests with method m go through the
// protocol, and returns the method as configured (upper case). The common
// upper-case spelling costs one map lookup and no allocation.
func (s *settings) protected(m string) (string, bool) {
	if s.methods[m] {
		return m, true
	}
	for _, p := range s.Methods {
		if strings.EqualFold(p, m) {
			return p, true
		}
	}
	return "", false
}

// DefaultMethods returns the methods Config.Methods defaults to, POST and
// PATCH (the methods that are neither safe nor idempotent by definition),
// in a slice of the caller's own.
func DefaultMethods() []string { return []string{http.MethodPost, http.MethodPatch} }

// WithDefaults returns c as New applies it: every zero field set to its
// default and KeyHeader canonicalised, with the errors New returns for c.
// A front end that reads some settings before it builds an engine (the
// proxy's guard reads the key header and the body bound) takes them from
// here rather than repeating the defaults.
func (c Config) WithDefaults() (Config, error) {
	s, err := c.withDefaults()
	return s.Config, err
}

func (c Config) withDefaults() (settings, error) {
	if c.Profile == "" {
		c.Profile = ProfileIETF
	}
	var errs []error
	if c.Profile != ProfileIETF && c.Profile != ProfileStripe {
		errs = append(errs, fmt.Errorf("idem: unknown profile %q (want ietf or stripe)", c.Profile))
	}
	if len(c.Methods) == 0 {
		c.Methods = DefaultMethods()
	}
	s := settings{methods: map[string]bool{}}
	methods := make([]string, 0, len(c.Methods))
	for _, m := range c.Methods {
		m = strings.ToUpper(m)
		if !s.methods[m] {
			methods = append(methods, m)
		}
		s.methods[m] = true
	}
	c.Methods = methods
	s.keyRequired = c.Profile == ProfileIETF
	if c.KeyRequired != nil {
		s.keyRequired = *c.KeyRequired
	}
	c.statusDefaults(&errs)
	c.durationDefaults(&errs)
	c.admissionDefaults(&errs)
	c.requestDefaults(&errs)
	c.asyncDefaults(&errs)
	s.Config = c
	return s, errors.Join(errs...)
}

// statusDefaults applies the profile's statuses and checks them.
func (c *Config) statusDefaults(errs *[]error) {
	if c.KeyReusedStatus == 0 {
		c.KeyReusedStatus = http.StatusUnprocessableEntity
		if c.Profile == ProfileStripe {
			c.KeyReusedStatus = http.StatusBadRequest
		}
	}
	if c.KeyReusedStatus < 400 || c.KeyReusedStatus > 499 {
		*errs = append(*errs, fmt.Errorf("idem: KeyReusedStatus %d is not a 4xx status", c.KeyReusedStatus))
	}
	if c.InProgressStatus == 0 {
		c.InProgressStatus = DefaultInProgressStatus
		if c.Profile == ProfileStripe {
			c.InProgressStatus = DefaultStripeInProgressStatus
		}
	}
	switch {
	case c.Profile == ProfileStripe && c.InProgressStatus == http.StatusAccepted:
		*errs = append(*errs, errors.New("idem: an in-progress status of 202 cannot be used with the stripe profile: "+
			"Stripe's SDKs take any 2xx for the call's result; use 429 (the stripe default) or 409"))
	case c.Profile == ProfileStripe && c.InProgressStatus != http.StatusConflict && c.InProgressStatus != http.StatusTooManyRequests:
		*errs = append(*errs, fmt.Errorf("idem: InProgressStatus %d is neither 429 nor 409 (the stripe profile's choices)", c.InProgressStatus))
	case c.Profile != ProfileStripe && c.InProgressStatus != http.StatusConflict && c.InProgressStatus != http.StatusAccepted:
		*errs = append(*errs, fmt.Errorf("idem: InProgressStatus %d is neither 409 nor 202 (429 is for the stripe profile only)", c.InProgressStatus))
	}
}

// durationDefaults applies the default of every duration left zero and
// refuses negative ones.
func (c *Config) durationDefaults(errs *[]error) {
	def := func(d *time.Duration, v time.Duration, name string) {
		if *d == 0 {
			*d = v
		}
		if *d < 0 {
			*errs = append(*errs, fmt.Errorf("idem: %s must not be negative", name))
		}
	}
	def(&c.TTL, DefaultTTL, "TTL")
	def(&c.Lease, DefaultLease, "Lease")
	def(&c.RetryAfter, DefaultRetryAfter, "RetryAfter")
	def(&c.StoreTimeout, DefaultStoreTimeout, "StoreTimeout")
	def(&c.BreakerOpen, DefaultBreakerOpen, "BreakerOpen")
	def(&c.BreakerMaxOpen, DefaultBreakerMaxOpen, "BreakerMaxOpen")
	def(&c.DurabilityInterval, DefaultDurabilityInterval, "DurabilityInterval")
	def(&c.StoreActiveRecount, DefaultStoreActiveRecount, "StoreActiveRecount")
	if c.BreakerMaxOpen < c.BreakerOpen {
		*errs = append(*errs, errors.New("idem: BreakerMaxOpen must not be shorter than BreakerOpen"))
	}
}

// admissionDefaults applies the defaults of the breaker and the rate
// limits and checks them.
func (c *Config) admissionDefaults(errs *[]error) {
	if c.BreakerFailures == 0 {
		c.BreakerFailures = DefaultBreakerFailures
	}
	if c.TenantRate < 0 || c.TenantRate != c.TenantRate || c.TenantBurst < 0 || c.TenantMaxActive < 0 || c.StoreMaxActive < 0 {
		*errs = append(*errs, errors.New("idem: TenantRate, TenantBurst, TenantMaxActive and StoreMaxActive must not be negative"))
	}
	if c.TenantBurst == 0 && c.TenantRate > 0 {
		c.TenantBurst = burstFor(c.TenantRate)
	}
	if c.NewKeyRate < 0 || c.NewKeyRate != c.NewKeyRate || c.NewKeyBurst < 0 {
		*errs = append(*errs, errors.New("idem: NewKeyRate and NewKeyBurst must not be negative"))
	}
	if c.NewKeyBurst == 0 && c.NewKeyRate > 0 {
		c.NewKeyBurst = burstFor(c.NewKeyRate)
	}
}

// requestDefaults applies the defaults of how a request is read,
// fingerprinted and named, and of how it runs, and checks them.
func (c *Config) requestDefaults(errs *[]error) {
	if c.Wait < 0 {
		*errs = append(*errs, errors.New("idem: Wait must not be negative"))
	}
	if c.LeasePolicy == "" {
		c.LeasePolicy = store.LeaseUnknown
	}
	if !c.LeasePolicy.Valid() {
		*errs = append(*errs, fmt.Errorf("idem: unknown LeasePolicy %q (want unknown, retry or resume)", c.LeasePolicy))
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.MaxResponseBytes == 0 {
		c.MaxResponseBytes = DefaultMaxResponseBytes
	}
	if c.MaxBodyBytes < 0 || c.MaxResponseBytes < 0 {
		*errs = append(*errs, errors.New("idem: MaxBodyBytes and MaxResponseBytes must not be negative"))
	}
	// The order in which fields are listed is not part of the request.
	c.Fields = slices.Clone(c.Fields)
	slices.Sort(c.Fields)
	c.Fields = slices.Compact(c.Fields)
	if err := fingerprint.ValidateFields(c.Fields); err != nil {
		*errs = append(*errs, fmt.Errorf("idem: Fields: %w", err))
	}
	if c.KeyHeader == "" {
		c.KeyHeader = DefaultKeyHeader
	}
	if !httpfield.Valid(c.KeyHeader, nil) {
		*errs = append(*errs, fmt.Errorf("idem: KeyHeader %q is not a valid header name", c.KeyHeader))
	}
	c.KeyHeader = textproto.CanonicalMIMEHeaderKey(c.KeyHeader)
	if c.Tenant == nil {
		c.Tenant = func(*http.Request) string { return "" }
	}
	if c.Route == nil {
		c.Route = defaultRoute
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

func defaultRoute(r *http.Request) string {
	if r.Pattern != "" {
		// "POST /v1/charges" names the method too; the scope already has it.
		if p, ok := strings.CutPrefix(r.Pattern, r.Method+" "); ok {
			return strings.TrimLeft(p, " ")
		}
		return r.Pattern
	}
	return r.URL.Path
}

// Bool returns a pointer to v, for the optional fields of Config.
func Bool(v bool) *bool { return &v }
