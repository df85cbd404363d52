package idem

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// ProblemBase prefixes the type URI of every problem the engine answers
// with; the fragment after it is stable and documented in README.md.
const ProblemBase = "https://github.com/idem-go/idem/blob/main/docs/problems.md#"

// problem is one way the engine refuses or defers a request.
type problem struct {
	slug   string // stable part of the type URI
	status int
	title  string
	// stripe is the message of the Stripe-profile error object.
	stripe string
	// retry marks answers that come with Retry-After.
	retry bool
}

var (
	probKeyMissing = problem{slug: "key-missing", status: 400,
		title:  "Idempotency-Key header is required for this request",
		stripe: "This request requires an Idempotency-Key header."}
	probKeyMalformed = problem{slug: "key-malformed", status: 400,
		title:  "Idempotency-Key must be a structured-field string (or a bare token) of 1 to 255 visible ASCII characters",
		stripe: "The Idempotency-Key header is malformed."}
	probKeyRepeated = problem{slug: "key-repeated", status: 400,
		title:  "Idempotency-Key must appear once",
		stripe: "The Idempotency-Key header was sent more than once."}
	probBodyTooLarge = problem{slug: "body-too-large", status: 413,
		title:  "Request body is larger than the idempotency fingerprint limit",
		stripe: "The request body is too large for an idempotent request."}
	probBodyUnreadable = problem{slug: "body-unreadable", status: 400,
		title:  "Request body could not be read",
		stripe: "The request body could not be read."}
	probInvalidBody = problem{slug: "invalid-body", status: 400,
		title:  "Request body is not valid for its content type",
		stripe: "The request body is not valid for its content type."}
	probMismatch = problem{slug: "key-reused", status: 422,
		title:  "Idempotency-Key was already used with a different request",
		stripe: "Keys for idempotent requests can only be used with the same parameters they were first used with. Try using a key other than the one used on the original request."}
	probInProgress = problem{slug: "request-in-progress", status: 409, retry: true,
		title:  "A request with this Idempotency-Key is still being processed",
		stripe: "There is currently another in-progress request using this Idempotent Key (that probably means you submitted twice, and the other request is still going through): please try again later."}
	probUnknown = problem{slug: "outcome-unknown", status: 409, retry: true,
		title:  "The outcome of the request with this Idempotency-Key is not known yet; it is being reconciled and will not be executed again",
		stripe: "The outcome of the original request with this Idempotent Key is being verified; please try again later."}
	probStore = problem{slug: "store-unavailable", status: 503, retry: true,
		title:  "Idempotency store is unavailable; the request was not processed",
		stripe: "The request could not be processed safely right now and was not executed; please retry."}
)

// writeProblem answers with p in the engine's profile. detail may be empty.
func (e *Engine) writeProblem(w http.ResponseWriter, p problem, status int, detail string) {
	if status == 0 {
		status = p.status
	}
	h := w.Header()
	if p.retry {
		h.Set("Retry-After", strconv.Itoa(max(1, int(e.cfg.RetryAfter.Round(1e9).Seconds()))))
	}
	h.Del("Content-Length")
	var body []byte
	if e.cfg.Profile == ProfileStripe {
		h.Set("Content-Type", "application/json")
		msg := p.stripe
		if detail != "" {
			msg += " " + detail
		}
		body, _ = json.Marshal(map[string]any{"error": map[string]string{
			"type": "idempotency_error", "code": p.slug, "message": msg,
		}})
	} else {
		h.Set("Content-Type", "application/problem+json")
		doc := map[string]any{"type": ProblemBase + p.slug, "title": p.title, "status": status}
		if detail != "" {
			doc["detail"] = detail
		}
		body, _ = json.Marshal(doc)
	}
	w.WriteHeader(status)
	w.Write(body)
}
