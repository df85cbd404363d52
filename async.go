package idem

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/textproto"
	"strings"
	"time"

	"github.com/idem-go/idem/internal/httpfield"
	"github.com/idem-go/idem/store"
)

// Asynchronous acceptance (Config.Async). The first request with a key is
// recorded as pending together with the request itself and answered at
// once with 202 Accepted; a Worker claims it, runs the handler with the
// stored request under a fenced lease, and stores the answer through the
// ordinary completion path. Retries with the key and reads of the status
// resource answer 202 until that answer exists, then replay it.

// Defaults of the asynchronous mode.
const (
	// DefaultAsyncQueue is Config.AsyncQueue's default.
	DefaultAsyncQueue = "default"
	// DefaultStatusPath is Config.StatusPath's default.
	DefaultStatusPath = "/.idem/requests/"
	// DefaultAsyncWait is Config.AsyncWait's default (bounded by TTL).
	DefaultAsyncWait = time.Hour
)

var (
	probAccepted = &problemType{slug: SlugAccepted, status: http.StatusAccepted, retry: true,
		title:  "The request was accepted and will be processed; its answer will be at Location",
		stripe: "The request was accepted and will be processed; poll the Location for its result."}
	probRequestNotFound = &problemType{slug: SlugRequestNotFound, status: http.StatusNotFound,
		title:  "No request is known under this status resource",
		stripe: "No request is known under this status resource."}
	probRequestFailed = &problemType{slug: SlugRequestFailed, status: http.StatusConflict,
		title:  "The request failed without effect; send it again with the same Idempotency-Key to run it again",
		stripe: "The request failed without effect; retry it with the same Idempotent Key."}
	probInterrupted = &problemType{slug: SlugInterrupted, status: http.StatusConflict,
		title:  "The worker running the request stopped before recording its outcome; send it again with the same Idempotency-Key to run it again",
		stripe: "The request was interrupted before it finished; retry it with the same Idempotent Key."}
)

// sensitiveRequest are request headers an asynchronous request never keeps
// unless Config.AsyncKeepHeaders names them: credentials must not sit in
// the store.
var sensitiveRequest = []string{"Authorization", "Proxy-Authorization", "Cookie"}

func (c *Config) asyncDefaults(errs *[]error) {
	if c.AsyncQueue == "" {
		c.AsyncQueue = DefaultAsyncQueue
	}
	if err := (&store.ClaimParams{Queue: c.AsyncQueue, Limit: 1, Lease: 1}).Validate(); err != nil {
		*errs = append(*errs, fmt.Errorf("idem: AsyncQueue %q: %w", c.AsyncQueue, err))
	}
	switch {
	case c.AsyncWait < 0:
		*errs = append(*errs, errors.New("idem: AsyncWait must not be negative"))
	case c.AsyncWait == 0:
		c.AsyncWait = min(DefaultAsyncWait, c.TTL)
	case c.AsyncWait > c.TTL:
		*errs = append(*errs, fmt.Errorf("idem: AsyncWait (%v) is longer than TTL (%v): the record would expire before its deadline", c.AsyncWait, c.TTL))
	}
	c.AsyncKeepHeaders = headerNames("AsyncKeepHeaders", c.AsyncKeepHeaders, errs)
	c.AsyncDropHeaders = headerNames("AsyncDropHeaders", c.AsyncDropHeaders, errs)
	if c.StatusPath == "" {
		c.StatusPath = DefaultStatusPath
	}
	if !strings.HasPrefix(c.StatusPath, "/") || !strings.HasSuffix(c.StatusPath, "/") || strings.ContainsAny(c.StatusPath, "?#{} ") {
		*errs = append(*errs, fmt.Errorf("idem: StatusPath %q must be a path that starts and ends with /", c.StatusPath))
	}
}

// headerNames checks a list of header names and returns them canonical.
func headerNames(option string, names []string, errs *[]error) []string {
	out := make([]string, 0, len(names))
	for _, h := range names {
		if !httpfield.Valid(h, nil) {
			*errs = append(*errs, fmt.Errorf("idem: %s: %q is not a valid header name", option, h))
			continue
		}
		out = append(out, textproto.CanonicalMIMEHeaderKey(h))
	}
	return out
}

// checkAsync refuses an asynchronous engine over a store that keeps no
// pending requests (store.AsQueue).
func checkAsync(s store.Store, set *settings) error {
	if !set.Async {
		return nil
	}
	if _, why := store.AsQueue(s); why != "" {
		return fmt.Errorf("idem: Async needs a store that keeps pending requests: %s", why)
	}
	return nil
}

// pendingHeader is what an asynchronous request keeps of its header: what
// a stored answer may keep (no hop-by-hop headers), less the credentials
// (and Config.AsyncDropHeaders) Config.AsyncKeepHeaders does not name. Its
// names are made canonical first: a caller of Run may spell them as it
// likes ("authorization"), and a credential must be known in any spelling.
func (e *Engine) pendingHeader(h http.Header) http.Header {
	out := httpfield.Replayable(h)
	for k, v := range out {
		if ck := textproto.CanonicalMIMEHeaderKey(k); ck != k {
			delete(out, k)
			out[ck] = append(out[ck][:len(out[ck]):len(out[ck])], v...)
		}
	}
	for _, k := range sensitiveRequest {
		delete(out, k)
	}
	for _, k := range e.cfg.AsyncDropHeaders {
		delete(out, k)
	}
	for _, k := range e.cfg.AsyncKeepHeaders {
		if v := httpfield.Values(h, k); len(v) > 0 && httpfield.Valid(k, v) {
			if out == nil {
				out = http.Header{}
			}
			out[k] = v[:len(v):len(v)]
		}
	}
	return out
}

// accept records an asynchronous call as pending, or finds the record
// that holds its key. It counts against the tenant's cap as begin does:
// a pending record is active.
func (e *Engine) accept(ctx context.Context, c *Call, scope, key, fp string) (decision, error) {
	p := store.PendingParams{
		ReserveParams: store.ReserveParams{
			Scope: scope, Key: key, Fingerprint: fp,
			Lease: e.cfg.AsyncWait, TTL: e.cfg.TTL, LeasePolicy: e.cfg.LeasePolicy,
			Tenant: c.Tenant, MaxActive: e.cfg.TenantMaxActive,
		},
		Request: store.PendingRequest{
			Queue: e.cfg.AsyncQueue, Method: c.Method, Target: c.Target,
			Header: e.pendingHeader(c.Header), Body: c.Body,
		},
	}
	q := e.store.(store.Queue) // checked by New and With
	res, _, end, err := e.reserveStep(ctx, new(callCtx), scope, c.Route, func(ctx context.Context) (store.ReserveResult, error) {
		return q.ReservePending(ctx, p)
	})
	if err != nil {
		return decision{}, err
	}
	d := decide(fp, &res)
	outcome := reserveOutcome[d.verdict]
	switch {
	case d.verdict == Executed:
		d.verdict, outcome = Accepted, "accepted"
		d.created = res.Outcome != store.Reclaimed && res.Outcome != store.TakenOver
		e.log.Info("idem: asynchronous request accepted", "scope", scope, "key", key,
			"queue", e.cfg.AsyncQueue, "fence", res.Record.Fence, "outcome", res.Outcome.String())
	case d.verdict == InProgress:
		d.verdict = Accepted // pending or being run by a worker
	}
	e.reserveDone(ctx, end, c.Tenant, outcome, res.Record.Fence)
	return d, nil
}

// StatusLocation returns the status resource of the asynchronous request
// with key on the operation (method, route): Config.StatusPath followed by
// an opaque id that names the operation and the key. The tenant is not in
// it: StatusHandler takes it from the reading request, so a tenant can
// only ever read its own requests.
func (e *Engine) StatusLocation(method, route, key string) string {
	return e.cfg.StatusPath + base64.RawURLEncoding.EncodeToString([]byte(method+" "+route+"\x00"+key))
}

// ParseStatusID reads what StatusLocation wrote after the status path:
// the request's method, route and key. A server that serves the status
// resources of some routes only (the proxy's asynchronous ones) checks
// the route before answering.
func ParseStatusID(id string) (method, route, key string, ok bool) {
	b, err := base64.RawURLEncoding.DecodeString(id)
	if err != nil {
		return "", "", "", false
	}
	op, key, found := strings.Cut(string(b), "\x00")
	if !found || key == "" {
		return "", "", "", false
	}
	method, route, found = strings.Cut(op, " ")
	if !found || method == "" {
		return "", "", "", false
	}
	return method, route, key, true
}

// StatusHandler serves the status resources of asynchronous requests
// (GET or HEAD on Config.StatusPath + id, the Location of a 202): 202
// Accepted with Retry-After while the request waits for a worker or runs,
// the stored answer once it is complete (as a replay), 409 while its
// outcome is being reconciled or after it failed without effect, and 404
// for an id that names no request of the reading tenant (Config.Tenant):
// a tenant never learns whether another tenant's request exists.
//
// Mount it on the mux beside the routes, with the engine whose Tenant
// function the routes use:
//
//	mux.Handle("GET "+idem.DefaultStatusPath, eng.StatusHandler())
func (e *Engine) StatusHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		id, ok := strings.CutPrefix(r.URL.Path, e.cfg.StatusPath)
		method, route, key, valid := ParseStatusID(id)
		req := Request{Tenant: e.cfg.Tenant(r), Method: method, Route: route}
		scope := req.Scope()
		if !ok || !valid || store.CheckID(scope, key) != nil {
			e.WriteProblem(w, e.problem(probRequestNotFound, 0))
			return
		}
		var rec store.Record
		err := e.call(r.Context(), opGet, false, func(ctx context.Context) (err error) {
			rec, err = e.store.Get(ctx, scope, key)
			return err
		})
		switch {
		case errors.Is(err, store.ErrNotFound):
			e.WriteProblem(w, e.problem(probRequestNotFound, 0))
			return
		case err != nil:
			e.log.Error("idem: store failed reading a request's status", "scope", scope, "key", key, "err", err)
			e.WriteProblem(w, e.problem(probStore, 0))
			return
		}
		switch rec.State {
		case store.StateCompleted:
			if rec.Response != nil {
				replay(w, rec.Response, rec.ExpiresAt, e.cfg.Profile == ProfileStripe, "")
				return
			}
			e.WriteProblem(w, e.problem(probStore, 0))
		case store.StatePending, store.StateInProgress:
			if rec.LeaseExpired(e.clk.Now()) {
				// Its worker died. Under policy unknown the sweeper moves
				// it to unknown; under retry or resume no worker claims it
				// again, but a retry of the request takes it over.
				if rec.LeasePolicy == store.LeaseUnknown {
					e.WriteProblem(w, e.problem(probUnknown, 0))
				} else {
					e.WriteProblem(w, e.problem(probInterrupted, 0))
				}
				return
			}
			w.Header().Set("Location", e.StatusLocation(method, route, key))
			e.WriteProblem(w, e.problem(probAccepted, 0))
		case store.StateUnknown:
			e.WriteProblem(w, e.problem(probUnknown, 0))
		case store.StateFailedRetryable:
			e.WriteProblem(w, e.problem(probRequestFailed, 0))
		default: // expired
			e.WriteProblem(w, e.problem(probRequestNotFound, 0))
		}
	})
}

// PendingTimeout is the answer stored on an asynchronous request that no
// worker claimed before Config.AsyncWait passed (the maintenance services
// store it): 408 Request Timeout, a problem document. The request never
// ran; a client that still wants it sends it again with a new key.
func PendingTimeout() store.Response {
	return store.Response{
		Status: http.StatusRequestTimeout,
		Header: http.Header{"Content-Type": {"application/problem+json"}},
		Body:   []byte(`{"type":"` + ProblemBase + SlugPendingExpired + `","title":"The request was accepted but no worker ran it in time; it was not executed","status":408}`),
	}
}
