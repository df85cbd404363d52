package idem

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"
)

// ProblemBase prefixes the type URI of every problem the engine answers
// with; the fragment after it is a stable slug, each documented in
// docs/problems.md.
const ProblemBase = "https://github.com/idem-go/idem/blob/main/docs/problems.md#"

// Problem is a refusal or deferral of a request: the engine's own (in
// Answer.Problem) or one an integration answers itself (a proxy refusing a
// request without a tenant), rendered by WriteProblem in the engine's
// profile.
type Problem struct {
	// Slug is the stable name of the problem: the fragment of its type URI
	// under ProfileIETF, the code of the error object under ProfileStripe.
	// Every slug is documented in docs/problems.md.
	Slug string
	// Status is the HTTP status.
	Status int
	// Title is a short, fixed summary of the problem.
	Title string
	// Detail, optional, explains this occurrence.
	Detail string
	// RetryAfter, when positive, is sent as Retry-After (whole seconds,
	// rounded, at least 1).
	RetryAfter time.Duration
}

// The engine's problem slugs.
const (
	SlugKeyMissing       = "key-missing"
	SlugKeyMalformed     = "key-malformed"
	SlugKeyRepeated      = "key-repeated"
	SlugKeyReused        = "key-reused"
	SlugBodyTooLarge     = "body-too-large"
	SlugBodyUnreadable   = "body-unreadable"
	SlugInvalidBody      = "invalid-body"
	SlugScopeTooLong     = "scope-too-long"
	SlugScopeInvalid     = "scope-invalid"
	SlugInProgress       = "request-in-progress"
	SlugOutcomeUnknown   = "outcome-unknown"
	SlugStoreUnavailable = "store-unavailable"
	SlugStoreNotDurable  = "store-not-durable"
	SlugAccepted         = "request-accepted"
	SlugRequestNotFound  = "request-not-found"
	SlugRequestFailed    = "request-failed"
	SlugInterrupted      = "request-interrupted"
	SlugPendingExpired   = "request-not-run-in-time"
	SlugRateLimited      = "tenant-rate-limited"
	SlugOverCap          = "tenant-over-cap"
	SlugNewKeysLimited   = "new-keys-limited"
	SlugOverCapacity     = "over-capacity"
)

// problemType is one of the engine's problems with its fixed texts.
type problemType struct {
	slug   string
	status int
	title  string
	// stripe is the message of the Stripe-profile error object.
	stripe string
	// retry marks answers that come with Retry-After.
	retry bool
	// shouldRetry is the Stripe-profile Stripe-Should-Retry header: "true"
	// for answers a retry resolves, "false" for answers a retry only
	// repeats, "" to leave the SDK's own rule (no retry of a 4xx).
	shouldRetry string
}

var (
	probKeyMissing = &problemType{slug: SlugKeyMissing, status: 400, shouldRetry: "false",
		title:  "Idempotency-Key header is required for this request",
		stripe: "This request requires an Idempotency-Key header."}
	probKeyMalformed = &problemType{slug: SlugKeyMalformed, status: 400, shouldRetry: "false",
		title:  "Idempotency-Key must be a structured-field string (or a bare token) of 1 to 255 visible ASCII characters",
		stripe: "The Idempotency-Key header is malformed."}
	probKeyRepeated = &problemType{slug: SlugKeyRepeated, status: 400, shouldRetry: "false",
		title:  "Idempotency-Key must appear once",
		stripe: "The Idempotency-Key header was sent more than once."}
	probBodyTooLarge = &problemType{slug: SlugBodyTooLarge, status: 413, shouldRetry: "false",
		title:  "Request body is larger than the idempotency fingerprint limit",
		stripe: "The request body is too large for an idempotent request."}
	probBodyUnreadable = &problemType{slug: SlugBodyUnreadable, status: 400, shouldRetry: "false",
		title:  "Request body could not be read",
		stripe: "The request body could not be read."}
	probInvalidBody = &problemType{slug: SlugInvalidBody, status: 400, shouldRetry: "false",
		title:  "Request body is not valid for its content type",
		stripe: "The request body is not valid for its content type."}
	probScopeTooLong = &problemType{slug: SlugScopeTooLong, status: 414, shouldRetry: "false",
		title:  "Request route is too long to keep an idempotency record for",
		stripe: "The request path is too long for an idempotent request."}
	probScopeInvalid = &problemType{slug: SlugScopeInvalid, status: 400, shouldRetry: "false",
		title:  "Request route is not valid UTF-8 (or holds NUL) and cannot name an idempotency record",
		stripe: "The request path is not valid for an idempotent request."}
	probKeyReused = &problemType{slug: SlugKeyReused, status: 422, shouldRetry: "false",
		title:  "Idempotency-Key was already used with a different request",
		stripe: "Keys for idempotent requests can only be used with the same parameters they were first used with. Try using a key other than the one used on the original request."}
	probInProgress = &problemType{slug: SlugInProgress, status: 409, retry: true, shouldRetry: "true",
		title:  "A request with this Idempotency-Key is still being processed",
		stripe: "There is currently another in-progress request using this Idempotent Key (that probably means you submitted twice, and the other request is still going through): please try again later."}
	probUnknown = &problemType{slug: SlugOutcomeUnknown, status: 409, retry: true, shouldRetry: "false",
		title:  "The outcome of the request with this Idempotency-Key is not known yet; it is being reconciled and will not be executed again",
		stripe: "The outcome of the original request with this Idempotent Key is being verified; please try again later."}
	probStore = &problemType{slug: SlugStoreUnavailable, status: 503, retry: true, shouldRetry: "true",
		title:  "Idempotency store is unavailable; the request was not processed",
		stripe: "The request could not be processed safely right now and was not executed; please retry."}
	probNotDurable = &problemType{slug: SlugStoreNotDurable, status: 503, retry: true, shouldRetry: "true",
		title:  "Idempotency store cannot confirm that answers survive a failover; the request was not processed",
		stripe: "The request could not be processed safely right now and was not executed; please retry."}
	probRateLimited = &problemType{slug: SlugRateLimited, status: 429, retry: true,
		title:  "Too many new Idempotency-Keys from this tenant; the request was not processed",
		stripe: "Too many new idempotent requests from this account; the request was not executed, please retry later."}
	probNewKeysLimited = &problemType{slug: SlugNewKeysLimited, status: 429, retry: true,
		title:  "Too many new Idempotency-Keys on this server; the request was not processed",
		stripe: "Too many new idempotent requests right now; the request was not executed, please retry later."}
	probOverCapacity = &problemType{slug: SlugOverCapacity, status: 503, retry: true, shouldRetry: "true",
		title:  "Too many requests are in progress across this service; the request was not processed",
		stripe: "Too many idempotent requests are in progress right now; the request was not executed, please retry later."}
	probOverCap = &problemType{slug: SlugOverCap, status: 429, retry: true,
		title:  "This tenant has too many requests waiting, in progress or awaiting reconciliation; the request was not processed",
		stripe: "Too many idempotent requests of this account are still in progress; the request was not executed, please retry later."}
)

// stripeTypes are the engine's problems by slug, for the Stripe-profile
// message and Stripe-Should-Retry.
var stripeTypes = map[string]*problemType{}

func init() {
	for _, p := range []*problemType{probKeyMissing, probKeyMalformed, probKeyRepeated, probBodyTooLarge,
		probBodyUnreadable, probInvalidBody, probScopeTooLong, probScopeInvalid, probKeyReused,
		probInProgress, probUnknown, probStore, probNotDurable, probAccepted, probRequestNotFound, probRequestFailed, probInterrupted, probRateLimited, probOverCap, probNewKeysLimited, probOverCapacity} {
		stripeTypes[p.slug] = p
	}
}

// problem returns p as this engine answers it; status 0 keeps p's own.
func (e *Engine) problem(p *problemType, status int) Problem {
	if status == 0 {
		status = p.status
	}
	pr := Problem{Slug: p.slug, Status: status, Title: p.title}
	if p.retry {
		pr.RetryAfter = e.cfg.RetryAfter
	}
	return pr
}

// Stripe's error codes for a key in use: with 429, the code Stripe's SDKs
// retry (stripe-go retries no other Stripe-shaped error); with 409,
// Stripe's own code for a duplicate in flight.
const (
	stripeLockTimeout = "lock_timeout"
	stripeKeyInUse    = "idempotency_key_in_use"
)

// stripeCode is the code of p's Stripe error object: the slug, except for
// a key in use, which gets Stripe's code for its status.
func stripeCode(p Problem) string {
	if p.Slug != SlugInProgress {
		return p.Slug
	}
	if p.Status == http.StatusTooManyRequests {
		return stripeLockTimeout
	}
	return stripeKeyInUse
}

// WriteProblem answers with p in the engine's profile: an RFC 9457 problem
// document (application/problem+json, type ProblemBase+Slug) under
// ProfileIETF, Stripe's error object ({"error":{"type":"idempotency_error",
// "code":...,"message":...}}) under ProfileStripe; with Retry-After when
// p.RetryAfter is positive. Under ProfileStripe the code is the slug, but
// for a key in use (lock_timeout with 429, idempotency_key_in_use with
// 409), and the engine's own problems carry Stripe-Should-Retry: true
// where a retry resolves them (a key in use, the store unavailable), false
// where it cannot (the SDKs would otherwise retry a 409 outcome-unknown).
func (e *Engine) WriteProblem(w http.ResponseWriter, p Problem) {
	h := w.Header()
	if p.RetryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(max(1, int(p.RetryAfter.Round(time.Second)/time.Second))))
	}
	h.Del("Content-Length")
	var body []byte
	if e.cfg.Profile == ProfileStripe {
		h.Set("Content-Type", "application/json")
		msg := p.Title
		if t, ok := stripeTypes[p.Slug]; ok {
			msg = t.stripe
			if t.shouldRetry != "" {
				h.Set("Stripe-Should-Retry", t.shouldRetry)
			}
		}
		if p.Detail != "" {
			msg += " " + p.Detail
		}
		body, _ = json.Marshal(map[string]any{"error": map[string]string{
			"type": "idempotency_error", "code": stripeCode(p), "message": msg,
		}})
	} else {
		h.Set("Content-Type", "application/problem+json")
		doc := map[string]any{"type": ProblemBase + p.Slug, "title": p.Title, "status": p.Status}
		if p.Detail != "" {
			doc["detail"] = p.Detail
		}
		body, _ = json.Marshal(doc)
	}
	w.WriteHeader(p.Status)
	w.Write(body)
}
