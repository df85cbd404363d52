package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/http/httputil"
	"net/url"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem"
)

// parseUpstream checks the --upstream URL: http or https, with a host.
func parseUpstream(raw string) (*url.URL, error) {
	if raw == "" {
		return nil, errors.New("proxy: an upstream URL is required (--upstream http://host:port)")
	}
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("proxy: --upstream %q: want an http:// or https:// URL with a host", raw)
	}
	return u, nil
}

// newTransport tunes the upstream transport for a proxy: Go's default keeps
// 2 idle connections per host, which makes a busy proxy dial for most
// requests.
func newTransport(responseTimeout time.Duration) *http.Transport {
	if responseTimeout < 0 {
		responseTimeout = 0
	}
	return &http.Transport{
		// No Proxy: the upstream is addressed directly, whatever
		// HTTP_PROXY says in the proxy's environment.
		DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:          1024,
		MaxIdleConnsPerHost:   512,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
		ResponseHeaderTimeout: responseTimeout,
		ForceAttemptHTTP2:     true,
	}
}

// copyBuffers lends the reverse proxy the buffers it copies response
// bodies through, instead of a new 32 KiB buffer per request.
type copyBuffers struct{}

var copyBufferPool = sync.Pool{New: func() any { return new([32 << 10]byte) }}

func (copyBuffers) Get() []byte { return copyBufferPool.Get().(*[32 << 10]byte)[:] }

func (copyBuffers) Put(b []byte) {
	if cap(b) == 32<<10 {
		copyBufferPool.Put((*[32 << 10]byte)(b[:32<<10]))
	}
}

// sentKey marks, in an outgoing request's context, whether the transport
// wrote the request: the line between "never sent" and "maybe executed".
type sentKey struct{}

func (p *Proxy) rewrite(pr *httputil.ProxyRequest) {
	pr.SetURL(p.upstream)
	pr.SetXForwarded()
	if !p.spansOff {
		injectTrace(pr.Out)
	}
	if idem.FromContext(pr.In.Context()) == nil {
		return // not under a key: an ordinary reverse proxy request
	}
	// A client that gives up must not cut the upstream call short: the
	// call runs to its end so the outcome is recorded and the client's
	// retry gets a replay instead of an unknown outcome.
	ctx := context.WithoutCancel(pr.Out.Context())
	sent := new(atomic.Bool)
	ctx = context.WithValue(ctx, sentKey{}, sent)
	// WroteRequest fires once the request is handed to the connection,
	// also when the write failed part way: from then on the upstream may
	// have acted on it, so every later failure is an unknown outcome.
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		WroteRequest: func(httptrace.WroteRequestInfo) { sent.Store(true) },
	})
	pr.Out = pr.Out.WithContext(ctx)
	hideKeyFromTransport(pr.Out.Header)
	// The engine read the whole body before the upstream is called, and
	// the client got its 100 Continue then: passed on, the expectation
	// only holds the body back until the transport's
	// ExpectContinueTimeout at an upstream that sends no 100 Continue.
	pr.Out.Header.Del("Expect")
	// A protocol switch hands the connection over to bytes the engine
	// could neither store nor replay, and the upstream may act on them:
	// under a key the offer is declined, as a server may (RFC 9110
	// §7.8), and the upstream answers in HTTP/1.1. Connection holds
	// nothing else here: the reverse proxy set it for the offer alone.
	if pr.Out.Header.Get("Upgrade") != "" {
		pr.Out.Header.Del("Upgrade")
		pr.Out.Header.Del("Connection")
	}
	if pr.Out.Body != nil && isNopCloser(pr.In.Body) {
		// The engine hands the handler the body it read as an io.NopCloser
		// over a *bytes.Reader, which the transport writes in the same
		// write as the request's head; the reverse proxy wraps it in a
		// type of its own, for which the transport flushes the head first
		// (a second write, and a second read and wakeup on the upstream).
		// The wrapper keeps the transport from closing the incoming body,
		// and closing a NopCloser does nothing: the body goes out as the
		// engine made it.
		pr.Out.Body = pr.In.Body
	}
}

// nopCloserTypes are the types io.NopCloser returns (with and without
// WriteTo).
var nopCloserTypes = [...]reflect.Type{
	reflect.TypeOf(io.NopCloser(nil)),
	reflect.TypeOf(io.NopCloser(bytes.NewReader(nil))),
}

func isNopCloser(r io.Reader) bool {
	t := reflect.TypeOf(r)
	return t == nopCloserTypes[0] || t == nopCloserTypes[1]
}

// hideKeyFromTransport stops net/http's Transport from silently sending
// the request a second time. The Transport treats a request carrying an
// Idempotency-Key (and no body to rewind) as replayable and re-sends it when
// a reused connection fails after the write: exactly the case where the
// upstream may already have executed it. Field names are case-insensitive
// on the wire, so spelling the names in lower case keeps them for the
// upstream while the Transport, which looks them up in canonical form, no
// longer sees them.
func hideKeyFromTransport(h http.Header) {
	for _, name := range [...]string{"Idempotency-Key", "X-Idempotency-Key"} {
		if v, ok := h[name]; ok {
			delete(h, name)
			h[strings.ToLower(name)] = v
		}
	}
}

// markCutAnswers makes an answer whose body breaks off (the upstream died
// part way, a length it did not keep) uncertain under a key: the upstream
// ran the request, and what came back is not its whole answer. On the
// client's path the reverse proxy also aborts the handler; a worker's
// request (an asynchronous route) has no server behind it, and the
// reverse proxy then only logs the failure and returns, as if the answer
// were whole.
func markCutAnswers(res *http.Response) error {
	if x := idem.FromContext(res.Request.Context()); x != nil {
		res.Body = &cutBody{ReadCloser: res.Body, x: x}
	}
	return nil
}

type cutBody struct {
	io.ReadCloser
	x *idem.Execution
}

func (b *cutBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && err != io.EOF {
		b.x.Uncertain("the upstream's answer broke off: " + err.Error())
	}
	return n, err
}

// upstreamError answers a request the upstream did not answer. The 502 is a
// 5xx, so under the response policy the engine releases the key (a retry
// runs again) unless the request may have reached the upstream: then the
// record becomes unknown and the upstream is never called again for it.
func (p *Proxy) upstreamError(w http.ResponseWriter, r *http.Request, err error) {
	x := idem.FromContext(r.Context())
	sent, _ := r.Context().Value(sentKey{}).(*atomic.Bool)
	prob, detail := proxyProblem{status: http.StatusBadGateway, title: "Bad Gateway"}, ""
	switch {
	case x != nil && sent != nil && sent.Load():
		prob = probUpstreamFailed
		x.Uncertain("upstream failed after the request was sent: " + err.Error())
		p.log.Warn("idem proxy: upstream failed after the request was sent; outcome unknown",
			"method", r.Method, "path", r.URL.Path, "key", x.Key(), "fence", x.Fence(), "err", err)
		detail = "The upstream failed after the request was sent; its outcome is unknown, so it will not be executed again until it is reconciled."
	case x != nil:
		prob = probUpstreamUnreachable
		// Released whatever the response policy: with --store-server-errors
		// the 502 would be kept and replayed, though nothing ran.
		x.NotExecuted("upstream unreachable before the request was sent: " + err.Error())
		p.log.Warn("idem proxy: upstream unreachable; the key is released for a retry",
			"method", r.Method, "path", r.URL.Path, "key", x.Key(), "err", err)
		detail = "The request could not be sent to the upstream and was not executed; it can be retried."
	default:
		p.log.Warn("idem proxy: upstream request failed", "method", r.Method, "path", r.URL.Path, "err", err)
		detail = "The upstream did not answer."
	}
	writeProxyProblem(w, p.cfg.Profile, p.cfg.RetryAfter, prob, detail)
}
