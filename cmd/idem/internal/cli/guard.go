package cli

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/idem-go/idem"
)

// proxyProblem is one way the proxy refuses a request before the engine
// sees it. Its type is idem.ProblemBase + slug, documented with the
// engine's in docs/problems.md.
type proxyProblem struct {
	slug   string
	status int
	title  string
	retry  bool // comes with Retry-After
}

var (
	probMethodCase = proxyProblem{slug: "method-not-upper-case", status: http.StatusBadRequest,
		title: "The request method must be upper case (POST, not post): methods are case-sensitive"}
	probTenantMissing = proxyProblem{slug: "tenant-missing", status: http.StatusUnauthorized,
		title: "The request carries none of the credentials the proxy tells callers apart by"}
	probTenantInvalid = proxyProblem{slug: "tenant-invalid", status: http.StatusBadRequest,
		title: "The tenant header does not hold a valid tenant id"}
	probTargetInvalid = proxyProblem{slug: "target-invalid", status: http.StatusBadRequest,
		title: "The request target holds bytes that must be percent-encoded"}
	probPathEscapes = proxyProblem{slug: "path-dot-segment", status: http.StatusBadRequest,
		title: "The request path holds a . or .. segment, which could leave the upstream's base path"}
	probTargetTooLong = proxyProblem{slug: "target-too-long", status: http.StatusRequestURITooLong,
		title: "The request target is too long for an idempotent request"}
	probOverloaded = proxyProblem{slug: "overloaded", status: http.StatusServiceUnavailable, retry: true,
		title: "Too many request bodies are held at once; the request was not processed"}
	probStoreDown = proxyProblem{slug: "store-unavailable", status: http.StatusServiceUnavailable, retry: true,
		title: "Idempotency store is unavailable; the request was not processed"}
	probUpstreamUnreachable = proxyProblem{slug: "upstream-unreachable", status: http.StatusBadGateway, retry: true,
		title: "The upstream could not be reached; the request was not sent to it and can be retried"}
	probUpstreamFailed = proxyProblem{slug: "upstream-failed", status: http.StatusBadGateway,
		title: "The upstream failed after the request was sent; its outcome is unknown"}
)

// writeProxyProblem answers p in the profile's error shape, with
// Retry-After (whole seconds, at least 1) when p comes with one. detail
// may be empty.
func writeProxyProblem(w http.ResponseWriter, profile idem.Profile, retryAfter time.Duration, p proxyProblem, detail string) {
	typ := idem.ProblemBase + p.slug
	if p.slug == "" {
		typ = "about:blank"
	}
	if p.retry {
		w.Header().Set("Retry-After", strconv.Itoa(max(1, int(retryAfter.Round(time.Second)/time.Second))))
	}
	var body []byte
	if profile == idem.ProfileStripe {
		w.Header().Set("Content-Type", "application/json")
		msg := p.title
		if detail != "" {
			msg += ": " + detail
		}
		errType := "idempotency_error"
		if p.slug == "" {
			errType = "api_error"
		} else {
			// Stripe's SDKs follow it before their own rules (which
			// retry every 409 and 5xx).
			w.Header().Set("Stripe-Should-Retry", strconv.FormatBool(p.retry))
		}
		body, _ = json.Marshal(map[string]any{"error": map[string]string{"type": errType, "code": p.slug, "message": msg}})
	} else {
		w.Header().Set("Content-Type", "application/problem+json")
		doc := map[string]any{"type": typ, "title": p.title, "status": p.status}
		if detail != "" {
			doc["detail"] = detail
		}
		body, _ = json.Marshal(doc)
	}
	w.WriteHeader(p.status)
	w.Write(body)
}

// refuse answers p and counts it by reason.
func (p *Proxy) refuse(w http.ResponseWriter, r *http.Request, prob proxyProblem, detail string) {
	if r.ContentLength != 0 {
		// The body was not read: net/http would read what is left of
		// it before the next request, waiting on a client that may stall.
		w.Header().Set("Connection", "close")
	}
	p.refusals.Add(r.Context(), 1, metric.WithAttributes(attribute.String("reason", prob.slug)))
	writeProxyProblem(w, p.cfg.Profile, p.cfg.RetryAfter, prob, detail)
}

type tenantKey struct{}

// tenantFromContext is the engine's Tenant: the guard named it.
func tenantFromContext(r *http.Request) string {
	t, _ := r.Context().Value(tenantKey{}).(string)
	return t
}

// guard is the proxy's handler. In order: it bounds the time to receive
// the body; refuses a method that is not upper case (an upstream that
// matches methods without regard to case would otherwise run an
// unprotected "post"); and for a keyed request on a protected method names
// the tenant (401 without one), checks the route, and reserves the body's
// memory (503 over the bound) before the engine reads it. Protected
// requests get 503 while the store is not open; the others pass to the
// upstream.
func (p *Proxy) guard(w http.ResponseWriter, r *http.Request) {
	if p.cfg.BodyTimeout > 0 {
		r = limitBodyTime(w, r, p.cfg.BodyTimeout)
	}
	if !upperToken(r.Method) {
		p.refuse(w, r, probMethodCase, "")
		return
	}
	if p.basePath && hasDotSegment(r.URL.Path) {
		p.refuse(w, r, probPathEscapes, "")
		return
	}
	if p.serveStatus(w, r) {
		return
	}
	h, protected, unprotected := p.handlerFor(r)
	if unprotected || (!protected && h == nil) {
		p.rp.ServeHTTP(w, r)
		return
	}
	if !protected {
		h.ServeHTTP(w, r)
		return
	}
	if len(r.Header[p.cfg.KeyHeader]) > 0 {
		var release func()
		if r, release = p.admitKeyed(w, r); r == nil {
			return
		}
		defer release()
	}
	if h == nil {
		p.refuse(w, r, probStoreDown, "")
		return
	}
	h.ServeHTTP(w, r)
}

// handlerFor returns the handler of r once the store is open (nil
// before), whether r's method is protected there, and whether r is on a
// route that is not protected at all (straight to the upstream). An
// asynchronous route (--async or "async" in the config file) is matched
// before the other routes: its engine is the asynchronous one, with the
// settings of its route if it has one.
func (p *Proxy) handlerFor(r *http.Request) (h http.Handler, protected, unprotected bool) {
	g := p.guarded.Load()
	protected = p.protected[r.Method]
	if i, ok := p.async.match(r); ok {
		if g == nil {
			return nil, true, false
		}
		if i >= 0 {
			return g.routes[i], true, false
		}
		return g.async, true, false
	}
	if i, ok := p.routes.match(r); ok {
		rt := &p.routes.routes[i]
		if rt.Unprotected {
			return nil, false, true
		}
		if rt.method != "" {
			protected = r.Method == rt.method
		}
		if g != nil {
			h = g.routes[i]
		}
		return h, protected, false
	}
	if g != nil {
		h = g.main
	}
	return h, protected, false
}

// admitKeyed names the tenant of the keyed request r (401 without one),
// checks its route, and reserves its body's memory (503 over the bound)
// before the engine reads it. It returns the request to serve, with its
// tenant, and the release of the memory; a nil request was refused.
func (p *Proxy) admitKeyed(w http.ResponseWriter, r *http.Request) (*http.Request, func()) {
	tenant, err := p.tenants.tenant(r)
	switch {
	case errors.Is(err, errNoTenant):
		p.log.Warn("idem proxy: keyed request without a tenant source; refused with 401",
			"method", r.Method, "path", r.URL.Path, "tenant_from", p.tenants.String())
		p.refuse(w, r, probTenantMissing, "send one of: "+p.tenants.String())
		return nil, nil
	case err != nil:
		p.refuse(w, r, probTenantInvalid, err.Error())
		return nil, nil
	}
	if prob, bad := checkRoute(proxyRoute(r)); bad {
		p.refuse(w, r, prob, "")
		return nil, nil
	}
	r = r.WithContext(context.WithValue(r.Context(), tenantKey{}, tenant))
	n := p.bodyWeight(r)
	if n <= 0 {
		return r, func() {}
	}
	if !p.buffers.TryAcquire(n) {
		p.log.Warn("idem proxy: too many bodies held at once; refused with 503",
			"max_buffered_bytes", p.cfg.MaxBufferedBytes, "body_bytes", n)
		p.refuse(w, r, probOverloaded, "")
		return nil, nil
	}
	p.buffered.Add(n)
	return r, func() {
		p.buffered.Add(-n)
		p.buffers.Release(n)
	}
}

// bodyWeight is what the engine may hold of r's body: its Content-Length,
// or MaxBody when unknown, at most MaxBody (a longer body is refused once
// MaxBody bytes were read).
func (p *Proxy) bodyWeight(r *http.Request) int64 {
	if r.Body == nil || r.Body == http.NoBody {
		return 0
	}
	if r.ContentLength < 0 || r.ContentLength > p.cfg.MaxBodyBytes {
		return p.cfg.MaxBodyBytes
	}
	return r.ContentLength
}

// upperToken reports whether m is a method token without lower-case
// letters. Methods are case-sensitive and every standard one is upper
// case; refusing the others keeps an upstream that compares methods
// without regard to case from running an unprotected "post".
func upperToken(m string) bool {
	if !validToken(m) {
		return false
	}
	for i := 0; i < len(m); i++ {
		if m[i] >= 'a' && m[i] <= 'z' {
			return false
		}
	}
	return true
}

// limitBodyTime gives r's body d to arrive, and returns the request to
// serve. The deadline is on the connection's reads, so it is lifted once
// the body was read to its end: a later read (net/http watches for the
// client leaving while the handler runs) must not fail on it and cancel
// the request. The body is wrapped in a copy of r: net/http decides what
// to do with an unread body by looking at the one it made.
func limitBodyTime(w http.ResponseWriter, r *http.Request, d time.Duration) *http.Request {
	if r.Body == nil || r.Body == http.NoBody {
		return r
	}
	rc := http.NewResponseController(w)
	if rc.SetReadDeadline(time.Now().Add(d)) != nil {
		return r
	}
	r = r.WithContext(r.Context())
	r.Body = &deadlineBody{ReadCloser: r.Body, rc: rc}
	return r
}

type deadlineBody struct {
	io.ReadCloser
	rc   *http.ResponseController
	done bool
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF && !b.done {
		b.done = true
		b.rc.SetReadDeadline(time.Time{})
	}
	return n, err
}

// hasDotSegment reports whether a decoded request path has a "." or ".."
// segment, a backslash taken as a separator too (some servers read it as
// one) and a segment's ";params" left out (Tomcat and Jetty drop them
// before resolving dots, so they read /..;/admin as /../admin). The
// reverse proxy appends the path to the upstream's base path as it is, so
// an upstream that resolves dot-segments would serve /base/../admin as
// /admin.
func hasDotSegment(path string) bool {
	for seg := range strings.FieldsFuncSeq(path, func(c rune) bool { return c == '/' || c == '\\' }) {
		if seg, _, _ = strings.Cut(seg, ";"); seg == "." || seg == ".." {
			return true
		}
	}
	return false
}

// proxyRoute is the route of a proxied request: its path as sent, plus the
// query when there is one. The engine fingerprints method, route and body;
// an upstream may act on the query, so two requests that differ only there
// must not share a record (the engine's default route drops the query).
// The path is always ASCII (net/url escapes what was not); checkRoute
// bounds the whole before it reaches a scope.
func proxyRoute(r *http.Request) string {
	route := r.URL.EscapedPath()
	if r.URL.RawQuery != "" {
		route += "?" + r.URL.RawQuery
	}
	return route
}

// maxRouteBytes bounds the route of a keyed request: with the method and
// the longest tenant id (maxTrustedTenant, or a hashed source's label), its
// scope stays within what every store accepts (store.MaxScopeBytes).
const maxRouteBytes = 640

// checkRoute refuses a route that must not become part of a scope: raw
// bytes outside visible ASCII (RFC 3986 wants them percent-encoded; a
// query may carry them through net/http as sent, even invalid UTF-8),
// and routes longer than maxRouteBytes.
func checkRoute(route string) (problem proxyProblem, bad bool) {
	for i := 0; i < len(route); i++ {
		if c := route[i]; c <= ' ' || c >= 0x7f {
			return probTargetInvalid, true
		}
	}
	if len(route) > maxRouteBytes {
		return probTargetTooLong, true
	}
	return proxyProblem{}, false
}
