package cli

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/httpfield"
	"github.com/idem-go/idem/maintenance"
	"github.com/idem-go/idem/store"
)

// resolveProtocol documents --resolve-url for the help of the commands that
// take it; docs/operating.md says the same.
const resolveProtocol = `Resolve URL protocol (--resolve-url): for each unknown record that is due,
idem POSTs JSON to the URL, an endpoint of the upstream's operators:
  {"scope":"0:POST /v1/charges","key":"order-1","fence":1,
   "fingerprint":"...","created_at":"2025-01-02T03:04:05.123456Z",
   "last_error":"lease_expired","tenant":"","method":"POST","route":"/v1/charges"}
(tenant, method and route are read from the scope). The endpoint answers
200 with one of:
  {"outcome":"happened","status":201,"headers":{"Content-Type":"application/json"},"body":"{\"id\":\"ch_1\"}"}
      the request took effect: every retry replays this response
      ("body_base64" instead of "body" for binary bodies; a header value
      may be a string or a list of strings)
  {"outcome":"not_happened"}
      it certainly had no effect: the key is released and the next retry runs it
  {"outcome":"unknown"}
      cannot tell yet: asked again later, with backoff (30s doubling to 1h);
      after 10 attempts the record is dead-lettered for an operator
                       (idem reconcile list --all; idem reconcile resolve)
Any other status or an unreadable answer counts as a failed attempt.`

// resolveTimeout bounds one call to the resolve URL.
const resolveTimeout = 10 * time.Second

// maxResolveAnswer bounds the answer read from the resolve URL: a stored
// body is at most a few MiB, and base64 or JSON escaping grows it.
const maxResolveAnswer = 16 << 20

// httpResolver is a maintenance.Resolver that asks the upstream's operators, over
// HTTP, whether an unknown request took effect.
type httpResolver struct {
	url    string
	client *http.Client
	// maxBody bounds the body a settled answer keeps, as the engine's
	// MaxResponseBytes bounds a live one.
	maxBody int
}

var _ maintenance.Resolver = (*httpResolver)(nil)

func newHTTPResolver(raw string) (*httpResolver, error) {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("--resolve-url %q: want an http:// or https:// URL with a host", raw)
	}
	return &httpResolver{url: raw, client: &http.Client{Timeout: resolveTimeout}, maxBody: idem.DefaultMaxResponseBytes}, nil
}

// resolveQuestion is the JSON posted to the resolve URL.
type resolveQuestion struct {
	Scope       string    `json:"scope"`
	Key         string    `json:"key"`
	Fence       int64     `json:"fence"`
	Fingerprint string    `json:"fingerprint"`
	CreatedAt   time.Time `json:"created_at"`
	LastError   string    `json:"last_error"`
	Tenant      *string   `json:"tenant,omitempty"`
	Method      string    `json:"method,omitempty"`
	Route       string    `json:"route,omitempty"`
}

// resolveAnswer is the resolve URL's answer.
type resolveAnswer struct {
	Outcome    string                  `json:"outcome"`
	Status     int                     `json:"status"`
	Headers    map[string]headerValues `json:"headers"`
	Body       *string                 `json:"body"`
	BodyBase64 *string                 `json:"body_base64"`
}

// headerValues reads a header's value as a string or a list of strings.
type headerValues []string

func (h *headerValues) UnmarshalJSON(b []byte) error {
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		*h = headerValues{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return errors.New("a header value must be a string or a list of strings")
	}
	*h = many
	return nil
}

// Resolve implements maintenance.Resolver.
func (h *httpResolver) Resolve(ctx context.Context, rec store.Record) (maintenance.Resolution, error) {
	q := resolveQuestion{
		Scope: rec.Scope, Key: rec.Key, Fence: rec.Fence, Fingerprint: rec.Fingerprint,
		CreatedAt: rec.CreatedAt.UTC(), LastError: rec.LastError,
	}
	if tenant, method, route, ok := idem.ParseScope(rec.Scope); ok {
		q.Tenant, q.Method, q.Route = &tenant, method, route
	}
	body, err := json.Marshal(q)
	if err != nil {
		return maintenance.Resolution{}, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.url, bytes.NewReader(body))
	if err != nil {
		return maintenance.Resolution{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	resp, err := h.client.Do(req)
	if err != nil {
		return maintenance.Resolution{}, fmt.Errorf("resolve URL: %w", redactedURLError(err))
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxResolveAnswer+1))
	if err != nil {
		return maintenance.Resolution{}, fmt.Errorf("resolve URL: reading the answer: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return maintenance.Resolution{}, fmt.Errorf("resolve URL answered %d, want 200", resp.StatusCode)
	}
	if len(raw) > maxResolveAnswer {
		return maintenance.Resolution{}, fmt.Errorf("resolve URL: answer larger than %d bytes", maxResolveAnswer)
	}
	return parseResolveAnswer(raw, h.maxBody)
}

// redactedURLError drops the URL from a client error: it may carry
// credentials in its userinfo or query.
func redactedURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// parseResolveAnswer reads the resolve URL's answer. A settled response
// keeps what a live one would: the headers httpfield.Replayable lets
// through, and a body of at most maxBody bytes (a larger one is left out
// and the replay says so, as the middleware does).
func parseResolveAnswer(raw []byte, maxBody int) (maintenance.Resolution, error) {
	var a resolveAnswer
	dec := json.NewDecoder(bytes.NewReader(raw))
	if err := dec.Decode(&a); err != nil {
		return maintenance.Resolution{}, fmt.Errorf("resolve URL: unreadable answer: %w", err)
	}
	res, err := a.resolution(maxBody)
	if err != nil {
		return maintenance.Resolution{}, fmt.Errorf("resolve URL: %w", err)
	}
	return res, nil
}

// resolution reads the verdict of an answer, keeping at most maxBody bytes
// of a settled body; the settlement webhook shares it, so both spell an
// outcome and its response alike.
func (a *resolveAnswer) resolution(maxBody int) (maintenance.Resolution, error) {
	switch a.Outcome {
	case "unknown":
		return maintenance.Resolution{Outcome: maintenance.StillUnknown}, nil
	case "not_happened":
		return maintenance.Resolution{Outcome: maintenance.DidNotHappen}, nil
	case "happened":
	default:
		return maintenance.Resolution{}, fmt.Errorf(`outcome %q: want "happened", "not_happened" or "unknown"`, a.Outcome)
	}
	if err := checkStatus(a.Status); err != nil {
		return maintenance.Resolution{}, err
	}
	resp := &store.Response{Status: a.Status, Header: http.Header{}}
	for name, values := range a.Headers {
		if err := addHeader(resp.Header, name, values...); err != nil {
			return maintenance.Resolution{}, err
		}
	}
	resp.Header = replayable(resp.Header)
	switch {
	case a.Body != nil && a.BodyBase64 != nil:
		return maintenance.Resolution{}, errors.New(`give "body" or "body_base64", not both`)
	case a.Body != nil:
		resp.Body = []byte(*a.Body)
	case a.BodyBase64 != nil:
		b, err := base64.StdEncoding.DecodeString(*a.BodyBase64)
		if err != nil {
			return maintenance.Resolution{}, fmt.Errorf("body_base64: %w", err)
		}
		resp.Body = b
	}
	if len(resp.Body) > maxBody {
		resp.Body, resp.BodyOmitted = nil, true
	}
	return maintenance.Resolution{Outcome: maintenance.Happened, Response: resp}, nil
}

// checkStatus accepts the statuses a settled request can replay.
func checkStatus(status int) error {
	if status < 200 || status > 599 {
		return fmt.Errorf("status %d: want a final status from 200 to 599", status)
	}
	return nil
}

// replayable keeps the headers a stored answer may carry; never nil.
func replayable(h http.Header) http.Header {
	if h = httpfield.Replayable(h); h == nil {
		h = http.Header{}
	}
	return h
}

// addHeader adds a header of a settled response, refusing names that are
// not tokens and values that would split the header on the wire; the
// caller filters the result through replayable.
func addHeader(h http.Header, name string, values ...string) error {
	if !validToken(name) {
		return fmt.Errorf("header name %q is not a valid field name", name)
	}
	for _, v := range values {
		if strings.ContainsAny(v, "\r\n\x00") {
			return fmt.Errorf("header %s: value holds a line break or NUL", name)
		}
	}
	name = http.CanonicalHeaderKey(name)
	for _, v := range values {
		h.Add(name, strings.TrimSpace(v))
	}
	return nil
}
