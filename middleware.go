package idem

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idem-go/idem/internal/httpfield"
	"github.com/idem-go/idem/store"
)

// Middleware protects next: requests with a protected method go through
// the idempotency protocol (Handle, with Config.Route naming the route),
// the others pass through untouched.
//
// Put it inside the mux (around each route's handler, or with the mux's own
// middleware hook) so that r.Pattern names the route; outside the mux the
// scope falls back to the URL path.
func (e *Engine) Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.handle(w, r, "", true, next)
	})
}

// Handle serves one request through the protocol with route as its route
// pattern, for framework adapters that know the route themselves (gin's
// c.FullPath(), echo's c.Path()). next runs the framework's handler chain;
// to have a handler's error answer recorded, render it inside next. Handle
// reports whether next ran: false means the engine answered itself (a
// refusal, a replay, 409 ...), and a framework should stop its chain.
//
// What the client gets:
//   - a method not in Config.Methods: next runs untouched (methods are
//     matched without regard to case).
//   - a first execution: next runs with a writer that buffers its answer;
//     the answer is sent once its record is stored, so a client that gets
//     it and retries at once gets it replayed, never 409. Answers larger
//     than Config.MaxResponseBytes, answers that call Flush, and event
//     streams (Content-Type text/event-stream) are sent as they are
//     written instead: the client may see them before they are stored.
//   - a replay: the stored status, headers and body, plus
//     Idempotent-Replayed: true (and Idempotent-Body-Omitted: true when the
//     body was too large to keep).
//   - anything else: a problem document (see WriteProblem, Run and
//     docs/problems.md).
//
// The request target (the escaped path and the query, compared as sorted pairs) is
// part of the fingerprint: the same key on another resource or with
// another query is refused as reused.
func (e *Engine) Handle(w http.ResponseWriter, r *http.Request, route string, next http.Handler) bool {
	return e.handle(w, r, route, false, next)
}

func (e *Engine) handle(w http.ResponseWriter, r *http.Request, route string, configRoute bool, next http.Handler) bool {
	method, ok := e.cfg.protected(r.Method)
	if !ok {
		next.ServeHTTP(w, r)
		return true
	}
	if configRoute {
		route = e.cfg.Route(r)
	}
	// Not pooled: some frameworks keep the writer they were given and
	// write to it after the handler returned (echo's error handler under
	// echo.WrapMiddleware). A pooled recorder would then write into another
	// request's answer; this one passes such late writes to its own client.
	h := &httpCall{w: w, r: r, next: next, e: e}
	keys := r.Header[e.cfg.KeyHeader]
	if e.cfg.EchoKey && len(keys) > 0 {
		// Set before the handler runs, so it is on the answer whatever the
		// verdict, streamed answers included.
		w.Header()[e.cfg.KeyHeader] = slices.Clone(keys)
	}
	c := Call{
		Tenant: e.cfg.Tenant(r), Method: method, Route: route, Target: r.URL.RequestURI(),
		Keys: keys, ContentType: firstValue(r.Header["Content-Type"]), Header: r.Header,
		ContentEncoding: joinValues(r.Header["Content-Encoding"]),
	}
	a := e.run(r.Context(), &c, h)
	switch a.Verdict {
	case Executed:
		rec := &h.onRun.rec
		if !rec.streaming {
			setExpires(w.Header(), a.Expires)
		}
		rec.send()
	case Passed:
	case Replayed:
		keep := ""
		if e.cfg.EchoKey {
			// The stored answer holds the key as the first request spelled
			// it ("k" or k); this client is told its own spelling, set
			// above.
			keep = e.cfg.KeyHeader
		}
		replay(w, a.Response, a.Expires, e.cfg.Profile == ProfileStripe, keep)
	case Accepted:
		w.Header().Set("Location", a.Location)
		e.WriteProblem(w, a.Problem)
	default:
		e.WriteProblem(w, a.Problem)
	}
	if h.onRun != nil {
		h.onRun.rec.done = true
	}
	return h.ran
}

// joinValues is a list-valued field's field lines as one list.
func joinValues(values []string) string {
	if len(values) == 1 {
		return values[0]
	}
	return strings.Join(values, ",")
}

// firstValue is h.Get(name)'s answer for a name in canonical form, from
// h[name]: Get would canonicalise the name again on every request.
func firstValue(values []string) string {
	if len(values) == 0 {
		return ""
	}
	return values[0]
}

// httpCall is the HTTP side of one call: the request, the handler and,
// once the handler runs under a key, the recorder of its answer. A replay
// or a refusal never runs the handler: the part only a run needs is
// allocated apart, so they allocate and clear a quarter of the bytes.
type httpCall struct {
	w    http.ResponseWriter // the client's
	r    *http.Request
	next http.Handler
	// e configures the recorder of a run: its limit, log and clock.
	e     *Engine
	onRun *httpRun
	in    bodyReader
	// cctx is the first reservation's call context.
	cctx callCtx
	ran  bool
}

// httpRun is what a run of the handler under a key needs, in one
// allocation: the recorder, the Execution and the request the handler
// gets (r with the context carrying the Execution).
type httpRun struct {
	rec  recorder
	exec Execution
	req  http.Request
}

func (h *httpCall) reserveCtx() *callCtx { return &h.cctx }

func (h *httpCall) execution() *Execution { return &h.started().exec }

// started returns the run's state, allocating it at the first call.
func (h *httpCall) started() *httpRun {
	if h.onRun == nil {
		h.onRun = new(httpRun)
		h.onRun.rec.init(h.w, h.e)
	}
	return h.onRun
}

func (h *httpCall) body(limit int64) ([]byte, error) { return h.in.read(h.r, limit) }

func (h *httpCall) pass(context.Context) {
	h.ran = true
	h.next.ServeHTTP(h.w, h.r)
}

func (h *httpCall) run(ctx context.Context) Result {
	h.ran = true
	x := h.started()
	rec := &x.rec
	x.req = *h.r.WithContext(ctx) // inlined: the copy WithContext makes stays on the stack
	h.next.ServeHTTP(rec, &x.req)
	res := Result{Streamed: rec.streaming}
	switch {
	case !rec.wroteHeader && ctx.Err() != nil:
		// The client left and the handler gave up without an answer: it
		// may have been part way through its effects.
		res.Outcome, res.Reason = Unknown, "client disconnected before a response was written"
	case rec.writeErr != nil:
		// The handler may have stopped writing when the client went away:
		// what was captured might be a truncated answer, which must never
		// be replayed as if it were whole.
		res.Outcome, res.Reason = Unknown, "writing the response failed: "+rec.writeErr.Error()
	}
	status := rec.status
	if !rec.wroteHeader {
		status = http.StatusOK // what net/http sends for a silent handler
	}
	hdr := rec.header
	if !rec.streaming {
		// Sent after this, as the handler left it.
		hdr = rec.w.Header()
	}
	res.Response = store.Response{Status: status, Header: hdr, Body: rec.body, BodyOmitted: rec.omitted}
	return res
}

// bodyReader reads one request's body. A body of known length gets one
// allocation of its size. (An array in the per-request state for small
// bodies saved that allocation, but every request, body or not, then
// allocated and cleared the array: in a process whose heap holds many
// records, each byte allocated costs the garbage collector more than an
// allocation does.)
type bodyReader struct {
	rd    bytes.Reader
	probe [1]byte
}

// read reads the body, at most limit bytes, and puts an identical body
// back on r for the handler. The buffer grows as bytes arrive: a declared
// Content-Length sizes only the first allocation, up to a small bound, so a
// client cannot make the server reserve memory it never sends.
func (br *bodyReader) read(r *http.Request, limit int64) ([]byte, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	if r.ContentLength > limit {
		return nil, errBodyTooLarge
	}
	size := int64(initialBodyBuffer)
	if r.ContentLength >= 0 {
		size = min(size, r.ContentLength)
	}
	b := make([]byte, 0, size)
	for {
		if len(b) == cap(b) {
			// Full: probe for more before growing, so that a body of
			// exactly its Content-Length (the common case) costs one
			// allocation.
			n, err := r.Body.Read(br.probe[:])
			if n > 0 {
				if int64(len(b)) >= limit {
					return nil, errBodyTooLarge
				}
				b = append(b, br.probe[0])
			}
			if err == io.EOF {
				break
			}
			if err != nil {
				return nil, err
			}
			continue
		}
		n, err := r.Body.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if int64(len(b)) > limit {
			return nil, errBodyTooLarge
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
	}
	if r.ContentLength >= 0 && int64(len(b)) > r.ContentLength {
		return nil, errors.New("body longer than its Content-Length")
	}
	// io.NopCloser over a *bytes.Reader: the one shape of a body that
	// net/http's Transport, told the body's length, sends in the same write
	// as the request's head. A handler that forwards r.Body with an
	// http.Client (a proxy) then costs the peer one read, not two.
	br.rd.Reset(b)
	r.Body = io.NopCloser(&br.rd)
	return b, nil
}

// initialBodyBuffer bounds the first allocation for a request body.
const initialBodyBuffer = 4 << 10

var (
	replayedTrue = []string{"true"}
	omittedTrue  = []string{"true"}
)

// replay writes a stored answer, byte for byte, naming the record's
// expiry (ExpiresHeader). Its headers pass the filter of
// httpfield.Replayable again, whoever stored them. Under the stripe
// profile a stored Request-Id is also sent as Original-Request, the header
// in which Stripe names the request whose answer a replay carries. The
// stored header named keep ("" for none) is not replayed: w already holds
// this request's own.
func replay(w http.ResponseWriter, resp *store.Response, expires time.Time, stripe bool, keep string) {
	var buf [8]storedField // most answers have fewer fields: no allocation
	fields, ok := replayFields(resp.Header, keep, buf[:0])
	if !ok {
		// Drops the fields the Connection field names, and that field.
		fields, _ = replayFields(httpfield.Replayable(resp.Header), keep, buf[:0])
	}
	h := w.Header()
	for _, f := range fields {
		// A full slice expression: a later Add appends to a copy, never to
		// the stored record's backing array.
		h[f.name] = f.values[:len(f.values):len(f.values)]
	}
	h["Idempotent-Replayed"] = replayedTrue
	if stripe {
		if id := h.Get("Request-Id"); id != "" {
			h.Set("Original-Request", id)
		}
	}
	setExpires(h, expires) // over a stored header of that name
	if resp.BodyOmitted {
		h["Idempotent-Body-Omitted"] = omittedTrue
	}
	w.WriteHeader(resp.Status)
	w.Write(resp.Body)
}

// storedField is one field of a stored answer.
type storedField struct {
	name   string
	values []string
}

// replayFields appends to out the fields of a stored answer that a replay
// writes: all but keep, those whose name httpfield.ReplayableName refuses
// and those with values httpfield.Valid refuses. It reports false, at the
// first Connection field in any spelling, when src must go through
// httpfield.Replayable first, which drops the fields that one names: one
// pass over src for the usual answer, which has none.
func replayFields(src http.Header, keep string, out []storedField) ([]storedField, bool) {
	for k, v := range src {
		if len(k) == len("Connection") && strings.EqualFold(k, "Connection") {
			return out, false
		}
		if k == keep || !httpfield.ReplayableName(k) || !httpfield.Valid(k, v) {
			continue
		}
		out = append(out, storedField{k, v})
	}
	return out, true
}

// recorder captures a handler's answer. It buffers it until the engine
// stored it (send writes it then), and switches to sending as written for
// answers that cannot wait: larger than the stored-size limit, flushed, or
// event streams.
type recorder struct {
	w   http.ResponseWriter // the client's
	log *slog.Logger
	// clk and ttl date the expiry header of a streamed answer.
	clk clock
	ttl time.Duration
	// writeErr is the first error writing to the client: the handler may
	// have stopped early, so the captured body may not be its answer.
	writeErr error
	header   http.Header
	body     []byte
	status   int
	limit    int
	// The flags together, so that they share one word.
	wroteHeader bool
	// streaming: the answer goes to the client as it is written; header
	// is then the replayable snapshot of what was sent.
	streaming bool
	omitted   bool
	// done: the engine has recorded the answer and Handle returned; what
	// is written now goes straight to the client and is not stored.
	done   bool
	warned bool
}

func (rw *recorder) init(w http.ResponseWriter, e *Engine) {
	rw.w, rw.limit, rw.log = w, e.cfg.MaxResponseBytes, e.log
	rw.clk, rw.ttl = e.clk, e.cfg.TTL
}

func (rw *recorder) Header() http.Header { return rw.w.Header() }

// late reports a write after Handle returned, once: its bytes reach the
// client but not the record, so retries will replay something else.
func (rw *recorder) late() {
	if !rw.warned {
		rw.warned = true
		rw.log.Warn("idem: the handler's writer was used after the handler returned; " +
			"that output is not part of the stored answer (with a framework that writes errors after its " +
			"middleware returns, use its adapter: contrib/echoidem, contrib/ginidem)")
	}
}

func (rw *recorder) WriteHeader(code int) {
	if rw.done {
		rw.late()
		rw.w.WriteHeader(code)
		return
	}
	if rw.wroteHeader {
		if rw.streaming {
			rw.w.WriteHeader(code) // let net/http report the superfluous call
		}
		return
	}
	if code >= 100 && code < 200 && code != http.StatusSwitchingProtocols {
		rw.w.WriteHeader(code) // informational: not the answer
		return
	}
	rw.wroteHeader = true
	rw.status = code
	h := rw.w.Header()
	if code == http.StatusSwitchingProtocols || httpfield.IsEventStream(h) {
		rw.stream()
		return
	}
	if cl := h["Content-Length"]; len(cl) == 1 {
		// The handler announced its size: one allocation of the right one.
		if n, err := strconv.Atoi(cl[0]); err == nil && n > 0 && n <= rw.limit {
			rw.body = make([]byte, 0, n)
		}
	}
}

// stream switches to sending as written: the header now, and what was
// buffered.
func (rw *recorder) stream() {
	rw.streaming = true
	rw.header = httpfield.Replayable(rw.w.Header())
	if rw.clk != nil {
		// Sent before the answer is stored: the record will expire a
		// TTL after its completion, later than this.
		setExpires(rw.w.Header(), rw.clk.Now().Add(rw.ttl))
	}
	rw.w.WriteHeader(rw.status)
	if len(rw.body) > 0 {
		if _, err := rw.w.Write(rw.body); err != nil && rw.writeErr == nil {
			rw.writeErr = err
		}
	}
}

func (rw *recorder) Write(b []byte) (int, error) {
	if rw.done {
		rw.late()
		return rw.w.Write(b)
	}
	if !rw.wroteHeader {
		rw.WriteHeader(http.StatusOK)
	}
	fits := !rw.omitted && len(rw.body)+len(b) <= rw.limit
	if !rw.streaming {
		if fits {
			// The buffer is the stored body: no copy is made later.
			rw.body = append(rw.body, b...)
			return len(b), nil
		}
		rw.stream()
	}
	if fits {
		rw.body = append(rw.body, b...)
	} else {
		rw.omitted, rw.body = true, nil
	}
	n, err := rw.w.Write(b)
	if err != nil && rw.writeErr == nil {
		rw.writeErr = err
	}
	return n, err
}

// Flush sends what was written so far and streams from then on; capture
// continues.
func (rw *recorder) Flush() {
	if rw.done {
		http.NewResponseController(rw.w).Flush()
		return
	}
	if !rw.wroteHeader {
		rw.WriteHeader(http.StatusOK)
	}
	if !rw.streaming {
		rw.stream()
	}
	http.NewResponseController(rw.w).Flush()
}

// send writes a buffered answer once the engine recorded it.
func (rw *recorder) send() {
	if rw.streaming {
		return
	}
	status := rw.status
	if !rw.wroteHeader {
		status = http.StatusOK
	}
	rw.w.WriteHeader(status)
	if len(rw.body) > 0 {
		rw.w.Write(rw.body)
	}
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (rw *recorder) Unwrap() http.ResponseWriter { return rw.w }

// ErrHijack is what a handler under an idempotency key gets when it tries
// to take over its connection (http.Hijacker, or Hijack through an
// http.ResponseController): whatever it would then send goes around the
// engine, which could neither record it nor replay it. The handler can
// still answer through the ResponseWriter.
var ErrHijack = errors.New("idem: a request under an idempotency key cannot hijack its connection")

// Hijack refuses (see ErrHijack). Without it, ResponseController would
// reach the client's writer through Unwrap, and the engine would store the
// empty answer it saw.
func (rw *recorder) Hijack() (net.Conn, *bufio.ReadWriter, error) { return nil, nil, ErrHijack }
