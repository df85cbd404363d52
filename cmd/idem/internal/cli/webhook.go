package cli

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/header"
	"github.com/idem-go/idem/internal/httpfield"
	"github.com/idem-go/idem/maintenance"
	"github.com/idem-go/idem/store"
	"golang.org/x/sync/semaphore"
)

// WebhookPath is where the admin server takes settlement webhooks.
const WebhookPath = "/webhooks/settle"

// WebhookSignatureHeader carries a delivery's signature:
//
//	Idem-Signature: t=<unix seconds>,v1=<hex HMAC-SHA-256>[,v1=<hex>...]
const WebhookSignatureHeader = "Idem-Signature"

// webhookSecretEnv holds the webhook secrets when --webhook-secret-file is
// not given: a secret stays out of the process list.
const webhookSecretEnv = "IDEM_WEBHOOK_SECRET"

// DefaultWebhookTolerance is how far a delivery's timestamp may be from
// the proxy's clock.
const DefaultWebhookTolerance = 5 * time.Minute

// minWebhookSecret is the shortest secret accepted: a guessable key makes
// the signature worthless.
const minWebhookSecret = 16

// maxWebhookSecrets is how many secrets are accepted at once: the current
// one and, while a rotation is under way, the next (or the previous).
const maxWebhookSecrets = 2

// webhookHelp documents the endpoint in the proxy's help; docs/console-and-webhooks.md says
// the same under "Webhook settlement".
const webhookHelp = `Settlement webhook (--webhook-secret-file, or $` + webhookSecretEnv + `; needs --admin):
the admin server takes POST ` + WebhookPath + `, through which a payment
provider's webhook (or a relay) settles an unknown record. The request is
signed: header ` + WebhookSignatureHeader + `: t=<unix seconds>,v1=<hex>, where the hex
is HMAC-SHA-256 under the secret of t + "." + the body. Several v1 values may
be sent, and the secret file may hold two secrets (one a line) while a
secret is rotated. A timestamp further than --webhook-tolerance from the
proxy's clock is refused, and so is a signature already received (a
replay): sign every delivery anew. The body names the record, the
execution it is about (the record's fence, as the resolve URL, idem
reconcile list and the console show it) and says what became of it:
  {"key":"order-1","fence":1732500000000000,"method":"POST","route":"/v1/charges",
   "caller_headers":{"Authorization":"Bearer sk_1"},
   "outcome":"happened","status":201,"headers":{"Content-Type":"application/json"},
   "body":"{\"id\":\"ch_1\"}"}
caller_headers are the headers of the original request that name its caller:
the proxy derives the tenant from them as it did from the request. Or give
"tenant" (the tenant as stored, e.g. a trusted header's value), or the raw
"scope" instead of tenant, method and route. outcome is "happened" (status,
headers, "body" or "body_base64"), "not_happened" or "run_again" (both
release the key: the next retry runs the request). A settlement is about
that execution only: once the record ran again (a new fence), it is refused.
Answers (problem+json on failure): 200 settled, or already settled the same
way; 400 bad body; 401 bad or missing signature, or stale timestamp; 404
no such record; 409 the record is not unknown and not settled as asked, the
record ran again since (another fence), or the signature was already
received; 413 body over 16 MiB; 503 store unavailable, or too many
deliveries being checked at once.`

// WebhookConfig turns on the settlement webhook of the proxy's admin server.
type WebhookConfig struct {
	// Secrets key the deliveries' signatures; a delivery signed under any
	// of them is accepted. None: the endpoint is not served.
	Secrets [][]byte
	// Tolerance is how far a delivery's timestamp may be from now, either
	// way. Defaults to DefaultWebhookTolerance.
	Tolerance time.Duration
	// Now tells the time the timestamps are checked against (tests).
	// Defaults to time.Now.
	Now func() time.Time
}

// webhook is the handler of WebhookPath.
type webhook struct {
	p   *Proxy
	cfg WebhookConfig

	// unverified bounds the bytes held of bodies whose signature is not
	// checked yet, across every connection.
	unverified *semaphore.Weighted
	replays    replayCache

	mu      sync.Mutex
	settler *maintenance.Maintainer // built once the store is open
}

// mountWebhook adds the settlement webhook to the admin handlers when the
// proxy has webhook secrets; without, it returns handlers unchanged.
func (p *Proxy) mountWebhook(handlers map[string]http.Handler) (map[string]http.Handler, error) {
	cfg := p.cfg.Webhook
	if len(cfg.Secrets) == 0 {
		return handlers, nil
	}
	if cfg.Tolerance == 0 {
		cfg.Tolerance = DefaultWebhookTolerance
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	out := maps.Clone(handlers)
	if out == nil {
		out = map[string]http.Handler{}
	}
	out["POST "+WebhookPath] = &webhook{p: p, cfg: cfg, unverified: semaphore.NewWeighted(maxUnverifiedBytes)}
	return out, nil
}

// callerTenant is the tenant the proxy gives a request: a delivery names
// the caller by the headers the original request carried, and this is the
// only place that turns them into a tenant.
func (p *Proxy) callerTenant(r *http.Request) (string, error) {
	return p.tenants.tenant(r)
}

// settle settles through the proxy's Maintainer, the one settling path. A
// proxy without background services settles through one it never starts.
// Before the store opened there is nothing to settle in: idem.ErrStore.
func (h *webhook) settle(ctx context.Context, scope, key string, fence int64, res maintenance.Resolution) (store.Store, error) {
	h.p.mu.Lock()
	s, m := h.p.store, h.p.maint
	h.p.mu.Unlock()
	if s == nil {
		return nil, fmt.Errorf("%w: the store is not open yet", idem.ErrStore)
	}
	if m == nil {
		h.mu.Lock()
		if h.settler == nil {
			var err error
			if h.settler, err = maintenance.New(s, h.p.maintenanceConfig()); err != nil {
				h.mu.Unlock()
				return nil, err
			}
		}
		m = h.settler
		h.mu.Unlock()
	}
	return s, m.Settle(ctx, scope, key, fence, res)
}

// checkWebhook refuses a webhook configuration no default can mend.
func checkWebhook(cfg WebhookConfig, admin string) error {
	if len(cfg.Secrets) == 0 {
		return nil
	}
	switch {
	case admin == "":
		return errors.New("the settlement webhook is served on the admin server: give --admin")
	case len(cfg.Secrets) > maxWebhookSecrets:
		return fmt.Errorf("webhook: %d secrets, want at most %d (the current one and the next)", len(cfg.Secrets), maxWebhookSecrets)
	case cfg.Tolerance < 0:
		return errors.New("webhook: the tolerance must not be negative")
	}
	for _, s := range cfg.Secrets {
		if len(s) < minWebhookSecret {
			return fmt.Errorf("webhook secret: %d bytes, want at least %d (e.g. head -c 32 /dev/urandom | base64)", len(s), minWebhookSecret)
		}
	}
	return nil
}

// webhookFlags are the proxy's webhook flags.
type webhookFlags struct {
	secretFile string
	tolerance  time.Duration
}

// Help of the webhook's flags (--webhook-secret-file, --webhook-tolerance).
const (
	webhookSecretFileHelp = "`file` holding the settlement webhook's secret (two lines while rotating; else $" + webhookSecretEnv + "); the webhook is off without one"
	webhookToleranceHelp  = "how far a webhook's signed timestamp may be from now"
)

// config reads the secrets of the file or, without one, of the
// environment: one or two secrets separated by white space.
func (f *webhookFlags) config(fs *flag.FlagSet, admin string) (WebhookConfig, error) {
	cfg := WebhookConfig{Tolerance: f.tolerance}
	if f.tolerance <= 0 {
		return cfg, usageErr(fs, "--webhook-tolerance must be positive")
	}
	raw := os.Getenv(webhookSecretEnv)
	if f.secretFile != "" {
		b, err := os.ReadFile(f.secretFile)
		if err != nil {
			return cfg, fmt.Errorf("--webhook-secret-file: %w", err)
		}
		if raw = string(b); strings.TrimSpace(raw) == "" {
			return cfg, usageErr(fs, "--webhook-secret-file %s holds no secret", f.secretFile)
		}
	}
	for _, s := range strings.Fields(raw) {
		cfg.Secrets = append(cfg.Secrets, []byte(s))
	}
	if err := checkWebhook(cfg, admin); err != nil {
		return cfg, usageErr(fs, "%v", err)
	}
	return cfg, nil
}

// Problems of the webhook; docs/console-and-webhooks.md and docs/problems.md list them.
var (
	probWebhookUnauthorized = webhookProblem{"webhook-unauthorized", http.StatusUnauthorized, "The webhook's signature is missing, wrong or too old"}
	probWebhookInvalid      = webhookProblem{"webhook-invalid", http.StatusBadRequest, "The webhook's body is not a valid settlement"}
	probWebhookTooLarge     = webhookProblem{"webhook-too-large", http.StatusRequestEntityTooLarge, "The webhook's body is too large"}
	probRecordNotFound      = webhookProblem{"record-not-found", http.StatusNotFound, "No record has this key in this scope"}
	probStateConflict       = webhookProblem{"state-conflict", http.StatusConflict, "The record's outcome is not unknown, and it is not settled as the webhook says"}
	probSettlementStale     = webhookProblem{"settlement-stale", http.StatusConflict, "The settlement is about another execution of the request than the record's"}
	probWebhookReplayed     = webhookProblem{"webhook-replayed", http.StatusConflict, "This signed delivery was already received"}
	probWebhookStore        = webhookProblem{"store-unavailable", http.StatusServiceUnavailable, "Idempotency store is unavailable; nothing was settled"}
	probWebhookBusy         = webhookProblem{"webhook-busy", http.StatusServiceUnavailable, "Too many deliveries are being checked at once; nothing was read"}
)

type webhookProblem struct {
	slug   string
	status int
	title  string
}

func (p webhookProblem) write(w http.ResponseWriter, detail string) {
	doc := map[string]any{"type": idem.ProblemBase + p.slug, "title": p.title, "status": p.status}
	if detail != "" {
		doc["detail"] = detail
	}
	if p.status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "1")
	}
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(p.status)
	json.NewEncoder(w).Encode(doc)
}

// maxWebhookBody bounds a delivery, as the resolve URL's answer is bounded.
const maxWebhookBody = maxResolveAnswer

// maxUnverifiedBytes bounds what the webhook holds, across connections, of
// bodies whose signature is not checked yet: two deliveries of the
// largest size, or many small ones.
const maxUnverifiedBytes = 2 * maxWebhookBody

// settleDelivery is the body of a delivery: the record, then its outcome
// in the resolve URL protocol's words (plus run_again).
type settleDelivery struct {
	Key           string                  `json:"key"`
	Fence         int64                   `json:"fence"`
	Scope         *string                 `json:"scope"`
	Tenant        *string                 `json:"tenant"`
	CallerHeaders map[string]headerValues `json:"caller_headers"`
	Method        string                  `json:"method"`
	Route         string                  `json:"route"`
	resolveAnswer
}

// settledAnswer is the 200 answer.
type settledAnswer struct {
	Scope string      `json:"scope"`
	Key   string      `json:"key"`
	State store.State `json:"state"`
	// Repeated: the record was already settled so; nothing changed.
	Repeated bool `json:"repeated"`
}

func (h *webhook) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// Nothing of the body is read before the signature header is well
	// formed and its timestamp fresh: a post without one costs nothing.
	sig, err := h.signature(r.Header.Values(WebhookSignatureHeader))
	if err != nil {
		h.refuse(w, r, probWebhookUnauthorized, err)
		return
	}
	if r.ContentLength > maxWebhookBody {
		h.refuse(w, r, probWebhookTooLarge, fmt.Errorf("the limit is %d bytes", maxWebhookBody))
		return
	}
	// The body must be read to check its signature. What is held of
	// bodies not checked yet is bounded for the whole process, whatever
	// the number of connections.
	weight := r.ContentLength
	if weight < 0 {
		weight = maxWebhookBody
	}
	if !h.unverified.TryAcquire(weight) {
		h.refuse(w, r, probWebhookBusy, nil)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxWebhookBody+1))
	h.unverified.Release(weight)
	if err != nil {
		probWebhookInvalid.write(w, "reading the body: "+err.Error())
		return
	}
	if len(body) > maxWebhookBody {
		h.refuse(w, r, probWebhookTooLarge, fmt.Errorf("the limit is %d bytes", maxWebhookBody))
		return
	}
	// Nothing of an unsigned body is read: it might be anyone's.
	if err := h.verify(sig, body); err != nil {
		h.refuse(w, r, probWebhookUnauthorized, err)
		return
	}
	// A delivery (its timestamp and body, under whichever signature it
	// came: a sender rotating secrets signs each under both) is taken
	// once: sent again within the tolerance it is refused (past it, its
	// timestamp is). Forgotten again when nothing was decided, so the
	// sender's retry of the same delivery is taken.
	sum := sha256.Sum256(body)
	seen := sig.ts + "." + hex.EncodeToString(sum[:])
	if !h.replays.add(seen, time.Unix(sig.sec, 0).Add(h.cfg.Tolerance), h.cfg.Now()) {
		h.p.log.Warn("idem webhook: delivery replayed; refused", "remote", r.RemoteAddr, "t", sig.ts)
		probWebhookReplayed.write(w, "sign every delivery anew (a new timestamp)")
		return
	}
	if !h.serveSigned(w, r, body) {
		h.replays.forget(seen)
	}
}

// refuse answers prob before the body was read (or without reading what is
// left of it): the connection is closed, so net/http does not wait on a
// body the sender may never finish.
func (h *webhook) refuse(w http.ResponseWriter, r *http.Request, prob webhookProblem, err error) {
	if prob == probWebhookUnauthorized {
		h.p.log.Warn("idem webhook: delivery refused", "remote", r.RemoteAddr, "err", err)
	}
	w.Header().Set("Connection", "close")
	detail := ""
	if err != nil {
		detail = err.Error()
	}
	prob.write(w, detail)
}

// serveSigned settles an authenticated delivery and reports whether the
// answer decided it (false: nothing was settled for a reason of the
// proxy's own, the store or a fault, and the same delivery may come again).
func (h *webhook) serveSigned(w http.ResponseWriter, r *http.Request, body []byte) bool {
	scope, key, fence, res, err := h.parse(body)
	if err != nil {
		probWebhookInvalid.write(w, err.Error())
		return true
	}
	st, err := h.settle(r.Context(), scope, key, fence, res)
	repeated := false
	if errors.Is(err, store.ErrStateConflict) {
		repeated, err = alreadySettled(r.Context(), st, scope, key, res)
	}
	switch {
	case errors.Is(err, store.ErrNotFound):
		probRecordNotFound.write(w, fmt.Sprintf("no record for key %q in scope %q", key, scope))
		return true
	case errors.Is(err, store.ErrLeaseLost):
		h.p.log.Warn("idem webhook: settlement about another execution refused", "scope", scope, "key", key, "fence", fence)
		probSettlementStale.write(w, staleDetail(r.Context(), st, scope, key, fence))
		return true
	case errors.Is(err, errSettledOtherwise):
		probStateConflict.write(w, err.Error())
		return true
	case errors.Is(err, idem.ErrStore):
		h.p.log.Error("idem webhook: store failed; nothing settled", "scope", scope, "key", key, "err", err)
		probWebhookStore.write(w, "")
		return false
	case err != nil:
		// Settle refused the settlement itself: parse lets none through,
		// so this is a fault of the proxy, not of the sender.
		h.p.log.Error("idem webhook: settlement failed", "scope", scope, "key", key, "err", err)
		http.Error(w, "settlement failed", http.StatusInternalServerError)
		return false
	}
	state := store.StateFailedRetryable
	if res.Outcome == maintenance.Happened {
		state = store.StateCompleted
	}
	h.p.log.Info("idem webhook: unknown outcome settled", "scope", scope, "key", key, "fence", fence, "outcome", res.Outcome, "repeated", repeated)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	json.NewEncoder(w).Encode(settledAnswer{Scope: scope, Key: key, State: state, Repeated: repeated})
	return true
}

// staleDetail says which execution the record is at, when the store tells.
func staleDetail(ctx context.Context, s store.Store, scope, key string, fence int64) string {
	d := fmt.Sprintf("the settlement is about fence %d", fence)
	if s == nil {
		return d
	}
	if rec, err := s.Get(ctx, scope, key); err == nil {
		d += fmt.Sprintf("; the record ran again since and is %s with fence %d", rec.State, rec.Fence)
	}
	return d
}

// webhookSig is a signature header, read.
type webhookSig struct {
	ts   string // as signed
	sec  int64
	sigs [][]byte
}

// signature reads the delivery's signature header and checks its
// timestamp, before the body is read.
func (h *webhook) signature(headers []string) (webhookSig, error) {
	var sig webhookSig
	if len(headers) == 0 {
		return sig, fmt.Errorf("no %s header", WebhookSignatureHeader)
	}
	if len(headers) > 1 {
		return sig, fmt.Errorf("%s header sent more than once", WebhookSignatureHeader)
	}
	if len(headers[0]) > maxSignatureHeader {
		return sig, fmt.Errorf("%s header longer than %d bytes", WebhookSignatureHeader, maxSignatureHeader)
	}
	for part := range strings.SplitSeq(headers[0], ",") {
		name, value, _ := strings.Cut(strings.TrimSpace(part), "=")
		switch name {
		case "t":
			if sig.ts != "" {
				return sig, errors.New("the signature has more than one timestamp")
			}
			sig.ts = value
		case "v1":
			if b, err := hex.DecodeString(value); err == nil && len(b) == sha256.Size {
				sig.sigs = append(sig.sigs, b)
			}
		}
		// Other schemes are skipped, so a sender may add a newer one
		// beside v1.
	}
	var err error
	if sig.sec, err = strconv.ParseInt(sig.ts, 10, 64); err != nil {
		return sig, errors.New("the signature has no timestamp t=<unix seconds>")
	}
	if len(sig.sigs) == 0 {
		return sig, errors.New("the signature has no v1=<64 hex digits>")
	}
	// Compared in seconds: a duration of far-off seconds would overflow.
	now := h.cfg.Now().Unix()
	if diff := now - sig.sec; diff > int64(h.cfg.Tolerance/time.Second) || -diff > int64(h.cfg.Tolerance/time.Second) {
		return sig, fmt.Errorf("the timestamp is %ds from now, beyond the tolerance of %v", diff, h.cfg.Tolerance)
	}
	return sig, nil
}

// verify checks the body against the signature under the secrets.
func (h *webhook) verify(sig webhookSig, body []byte) error {
	for _, secret := range h.cfg.Secrets {
		want := webhookSignature(secret, sig.ts, body)
		for _, v := range sig.sigs {
			if hmac.Equal(v, want) {
				return nil
			}
		}
	}
	return errors.New("no v1 signature matches")
}

// maxSignatureHeader bounds the signature header: a timestamp and a few
// signatures.
const maxSignatureHeader = 1024

// replayCache remembers the signatures taken, each until its timestamp
// leaves the tolerance (from then on the timestamp check refuses it).
// Only authenticated deliveries enter it, so it grows with the sender's
// traffic, not with an attacker's.
type replayCache struct {
	mu    sync.Mutex
	until map[string]time.Time
	prune int // size at which expired entries are dropped next
}

// add records sig until the given time and reports whether it is new.
func (c *replayCache) add(sig string, until, now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.until == nil {
		c.until = map[string]time.Time{}
	}
	if t, ok := c.until[sig]; ok && now.Before(t) {
		return false
	}
	if len(c.until) >= c.prune {
		maps.DeleteFunc(c.until, func(_ string, t time.Time) bool { return !now.Before(t) })
		c.prune = max(64, 2*len(c.until))
	}
	c.until[sig] = until
	return true
}

func (c *replayCache) forget(sig string) {
	c.mu.Lock()
	delete(c.until, sig)
	c.mu.Unlock()
}

// webhookSignature is HMAC-SHA-256 under secret of ts "." body.
func webhookSignature(secret []byte, ts string, body []byte) []byte {
	m := hmac.New(sha256.New, secret)
	io.WriteString(m, ts)
	m.Write([]byte{'.'})
	m.Write(body)
	return m.Sum(nil)
}

// parse reads a delivery: the scope and key of its record, and the
// settlement, whose answer keeps what a live answer would (the headers
// httpfield.Replayable lets through, and a body of at most the engine's
// MaxResponseBytes: a larger one is left out and replays say so).
func (h *webhook) parse(body []byte) (scope, key string, fence int64, res maintenance.Resolution, err error) {
	var d settleDelivery
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&d); err != nil {
		return "", "", 0, res, fmt.Errorf("unreadable body: %w", err)
	}
	if dec.More() {
		return "", "", 0, res, errors.New("unreadable body: more than one JSON value")
	}
	if scope, err = h.scope(&d); err != nil {
		return "", "", 0, res, err
	}
	if d.Fence <= 0 {
		return "", "", 0, res, errors.New(`"fence" is required: the record's fence, which names the execution the settlement is about`)
	}
	// As the client sent it: quoted ("w1", the IETF header's form) or
	// bare; both name the same record, as everywhere else.
	if d.Key, err = header.Parse([]string{d.Key}); err != nil {
		return "", "", 0, res, fmt.Errorf("key: %w", err)
	}
	switch d.Outcome {
	case "happened":
		if res, err = d.resolution(h.p.cfg.MaxResponseBytes); err != nil {
			return "", "", 0, res, err
		}
	case "not_happened", "run_again":
		if d.Status != 0 || d.Headers != nil || d.Body != nil || d.BodyBase64 != nil {
			return "", "", 0, res, errors.New(`status, headers and body go with "happened"`)
		}
		res.Outcome = maintenance.DidNotHappen
		if d.Outcome == "run_again" {
			res.Outcome = maintenance.RunAgain
		}
		return scope, d.Key, d.Fence, res, nil
	default:
		return "", "", 0, res, fmt.Errorf(`outcome %q: want "happened", "not_happened" or "run_again"`, d.Outcome)
	}
	if resp := res.Response; resp.Body == nil && !resp.BodyOmitted {
		resp.Body = []byte{} // an empty answer, as the engine stores one
	}
	return scope, d.Key, d.Fence, res, nil
}

// scope names the delivery's record as the proxy named the request: the
// tenant from the caller's headers through the proxy's tenant rule (or as
// given), and the route from the path and query as sent.
func (h *webhook) scope(d *settleDelivery) (string, error) {
	if d.Key == "" {
		return "", errors.New(`"key" is required`)
	}
	named := d.Tenant != nil || d.CallerHeaders != nil || d.Method != "" || d.Route != ""
	if d.Scope != nil {
		if named {
			return "", errors.New(`give "scope", or "method", "route" and "tenant" or "caller_headers", not both`)
		}
		if _, _, _, ok := idem.ParseScope(*d.Scope); !ok {
			return "", fmt.Errorf("scope %q is not a record scope (len(tenant):tenant METHOD route)", *d.Scope)
		}
		return *d.Scope, nil
	}
	if d.Tenant != nil && d.CallerHeaders != nil {
		return "", errors.New(`give "tenant" or "caller_headers", not both`)
	}
	if d.Route == "" {
		return "", errors.New(`name the record with "route" (the path and query as sent) and "method", or with "scope"`)
	}
	method := d.Method
	if method == "" {
		method = http.MethodPost
	}
	if !validToken(method) {
		return "", fmt.Errorf("method %q is not an HTTP method", method)
	}
	u, err := url.ParseRequestURI(d.Route)
	if err != nil || !strings.HasPrefix(d.Route, "/") {
		return "", fmt.Errorf("route %q: want the request's path and query as sent, e.g. /v1/charges?x=1", d.Route)
	}
	req := &http.Request{Method: strings.ToUpper(method), URL: u, RequestURI: d.Route, Header: http.Header{}, Host: "idem.invalid"}
	for name, values := range d.CallerHeaders {
		if !validToken(name) || !httpfield.Valid(name, values) {
			return "", fmt.Errorf("caller header %q is not a valid header", name)
		}
		for _, v := range values {
			req.Header.Add(name, v)
		}
	}
	tenant := ""
	if d.Tenant != nil {
		tenant = *d.Tenant
	} else if tenant, err = h.p.callerTenant(req); err != nil {
		return "", fmt.Errorf("caller_headers: %w", err)
	}
	r := idem.Request{Tenant: tenant, Method: req.Method, Route: proxyRoute(req)}
	return r.Scope(), nil
}

// errSettledOtherwise: the record is not unknown, and not in the state the
// delivery would have settled it to.
var errSettledOtherwise = errors.New("settled otherwise")

// alreadySettled decides a delivery for a record that is no longer
// unknown: true when the record already is what the delivery asks for (a
// repeated delivery, harmless), errSettledOtherwise when it is not.
func alreadySettled(ctx context.Context, s store.Store, scope, key string, res maintenance.Resolution) (bool, error) {
	rec, err := s.Get(ctx, scope, key)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return false, err
	case err != nil:
		return false, fmt.Errorf("%w: get: %w", idem.ErrStore, err)
	}
	if sameSettlement(rec, res) {
		return true, nil
	}
	detail := "it is " + string(rec.State)
	switch {
	case rec.State == store.StateCompleted && res.Outcome == maintenance.Happened:
		detail += " with another answer"
	case rec.State == store.StateInProgress:
		detail += ": it can be settled once its lease expires and it becomes unknown"
	}
	return false, fmt.Errorf("%w: key %q in scope %q: %s", errSettledOtherwise, key, scope, detail)
}

// sameSettlement reports whether rec already is what res settles to: the
// same answer for Happened, released for the others.
func sameSettlement(rec store.Record, res maintenance.Resolution) bool {
	if res.Outcome != maintenance.Happened {
		return rec.State == store.StateFailedRetryable
	}
	got, want := rec.Response, res.Response
	return rec.State == store.StateCompleted && got != nil &&
		got.Status == want.Status && got.BodyOmitted == want.BodyOmitted && bytes.Equal(got.Body, want.Body) &&
		maps.EqualFunc(httpfield.Replayable(got.Header), want.Header, slices.Equal)
}
