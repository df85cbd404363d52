package idem

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/idem-go/idem/internal/header"
	"github.com/idem-go/idem/store"
)

type ctxKey struct{}

// FromContext returns the Execution of the request being handled under an
// idempotency key, or nil when the request is not (an unprotected method,
// or no key on a route where it is optional).
func FromContext(ctx context.Context) *Execution {
	x, _ := ctx.Value(ctxKey{}).(*Execution)
	return x
}

// NewContext returns ctx carrying x; for engines driven without the
// middleware (queues, gRPC).
func NewContext(ctx context.Context, x *Execution) context.Context {
	return context.WithValue(ctx, ctxKey{}, x)
}

// Middleware protects next: requests with a protected method go through
// the idempotency protocol, the others pass through untouched.
//
// Put it inside the mux (around each route's handler, or with the mux's own
// middleware hook) so that r.Pattern names the route; outside the mux the
// scope falls back to the URL path.
func (e *Engine) Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.serve(w, r, next)
	})
}

func (e *Engine) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	if !e.cfg.methods[r.Method] || FromContext(r.Context()) != nil {
		next.ServeHTTP(w, r)
		return
	}
	key, err := header.Parse(r.Header["Idempotency-Key"])
	switch {
	case errors.Is(err, header.ErrMissing):
		if !e.cfg.keyRequired {
			next.ServeHTTP(w, r)
			return
		}
		e.refuse(r, w, probKeyMissing, "")
		return
	case errors.Is(err, header.ErrRepeated):
		e.refuse(r, w, probKeyRepeated, "")
		return
	case err != nil:
		e.refuse(r, w, probKeyMalformed, err.Error())
		return
	}
	body, err := readBody(r, e.cfg.MaxBodyBytes)
	if err != nil {
		if errors.Is(err, errBodyTooLarge) {
			e.refuse(r, w, probBodyTooLarge, fmt.Sprintf("the limit is %d bytes", e.cfg.MaxBodyBytes))
		} else {
			e.refuse(r, w, probBodyUnreadable, err.Error())
		}
		return
	}
	route := e.cfg.Route(r)
	fp, err := e.Fingerprint(r.Method, route, r.Header.Get("Content-Type"), body)
	if err != nil {
		e.refuse(r, w, probInvalidBody, err.Error())
		return
	}
	req := Request{Tenant: e.cfg.Tenant(r), Method: r.Method, Route: route, Key: key, Fingerprint: fp}
	ctx := r.Context()
	d, err := e.Begin(ctx, req)
	if err == nil && d.Verdict == InProgress && e.cfg.Wait > 0 {
		d, err = e.Await(ctx, req, e.cfg.Wait)
	}
	if err != nil {
		e.log.Error("idem: store failed before the handler ran; refused with 503", "key", key, "err", err)
		e.writeProblem(w, probStore, 0, "")
		return
	}
	switch d.Verdict {
	case Execute:
		e.execute(w, r, body, d.Exec, next)
	case Replay:
		replay(w, d.Record.Response)
	case Mismatch:
		e.log.Warn("idem: key reused with a different request", "scope", d.Record.Scope, "key", key)
		e.writeProblem(w, probMismatch, e.cfg.MismatchStatus, "")
	case InProgress:
		e.writeProblem(w, probInProgress, 0, "")
	case OutcomeUnknown:
		e.writeProblem(w, probUnknown, 0, "")
	}
}

// refuse answers a malformed request and counts it.
func (e *Engine) refuse(r *http.Request, w http.ResponseWriter, p problem, detail string) {
	e.obs.reserve(r.Context(), "rejected")
	e.writeProblem(w, p, 0, detail)
}

var errBodyTooLarge = errors.New("body too large")

// readBody reads at most limit bytes of the body and puts an identical
// body back on r for the handler.
func readBody(r *http.Request, limit int64) ([]byte, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	if r.ContentLength > limit {
		return nil, errBodyTooLarge
	}
	rb := &replayBody{}
	var b []byte
	if r.ContentLength > 0 {
		// The common case: one exact allocation, then a read that must
		// find the end of the body.
		b = make([]byte, r.ContentLength)
		if _, err := io.ReadFull(r.Body, b); err != nil {
			return nil, err
		}
		if n, _ := r.Body.Read(rb.probe[:]); n > 0 {
			return nil, errors.New("body longer than its Content-Length")
		}
	} else {
		buf := bytes.NewBuffer(nil)
		n, err := buf.ReadFrom(io.LimitReader(r.Body, limit+1))
		if err != nil {
			return nil, err
		}
		if n > limit {
			return nil, errBodyTooLarge
		}
		b = buf.Bytes()
	}
	rb.Reset(b)
	r.Body = rb
	return b, nil
}

// replayBody hands the already-read body to the handler.
type replayBody struct {
	bytes.Reader
	probe [1]byte
}

func (*replayBody) Close() error { return nil }

func (e *Engine) execute(w http.ResponseWriter, r *http.Request, body []byte, x *Execution, next http.Handler) {
	ctx := x.attach(r.Context())
	rec := &x.rec
	rec.ResponseWriter, rec.limit = w, e.cfg.MaxResponseBytes
	r2 := r.WithContext(ctx)
	defer func() {
		if p := recover(); p != nil {
			x.MarkUnknown(ctx, fmt.Sprintf("handler panicked: %v", p))
			panic(p)
		}
	}()
	next.ServeHTTP(rec, r2)
	e.settle(ctx, x, rec)
}

// settle records what the handler did: the response policy of DESIGN §4.
func (e *Engine) settle(ctx context.Context, x *Execution, rec *recorder) {
	if x.FinishDeclared(ctx) {
		return
	}
	switch {
	case !rec.wroteHeader && ctx.Err() != nil:
		// The client left and the handler gave up without an answer: it
		// may have been part way through its effects.
		x.MarkUnknown(ctx, "client disconnected before a response was written")
		return
	case rec.writeErr != nil:
		// The handler may have stopped writing when the client went away:
		// what was captured might be a truncated answer, which must never
		// be replayed as if it were whole.
		x.MarkUnknown(ctx, "writing the response failed: "+rec.writeErr.Error())
		return
	}
	status := rec.status
	if !rec.wroteHeader {
		status = http.StatusOK // what net/http sends for a silent handler
	}
	if !e.storable(status) {
		x.Release(ctx, "status "+strconv.Itoa(status))
		return
	}
	resp := store.Response{Status: status, Header: rec.header, Body: rec.body, BodyOmitted: rec.omitted}
	if resp.Body == nil && !resp.BodyOmitted {
		resp.Body = []byte{}
	}
	x.Complete(ctx, resp)
}

// storable reports whether a status is the final answer of a request
// (stored and replayed) rather than a failure a retry should run again.
func (e *Engine) storable(status int) bool {
	if e.cfg.StoreServerErrors {
		return true
	}
	switch status {
	case http.StatusRequestTimeout, http.StatusTooEarly, http.StatusTooManyRequests:
		return false
	}
	return status < 500
}

var (
	replayedTrue = []string{"true"}
	omittedTrue  = []string{"true"}
)

// replay writes a stored response, byte for byte.
func replay(w http.ResponseWriter, resp *store.Response) {
	h := w.Header()
	for k, v := range resp.Header {
		// A full slice expression: a later Add appends to a copy, never to
		// the stored record's backing array.
		h[k] = v[:len(v):len(v)]
	}
	h["Idempotent-Replayed"] = replayedTrue
	if resp.BodyOmitted {
		h["Idempotent-Body-Omitted"] = omittedTrue
		delete(h, "Content-Length")
	}
	w.WriteHeader(resp.Status)
	w.Write(resp.Body)
}

// Headers never stored for replay: hop-by-hop headers (RFC 9110 §7.6.1),
// cookies (a replay must not hand one caller's session to a retry), and
// Date (the replay gets its own).
var unreplayable = map[string]bool{
	"Connection": true, "Keep-Alive": true, "Proxy-Authenticate": true, "Proxy-Authorization": true,
	"Proxy-Connection": true, "Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true,
	"Set-Cookie": true, "Set-Cookie2": true, "Date": true, "Idempotent-Replayed": true, "Idempotent-Body-Omitted": true,
}

// replayableHeader copies h without the headers a replay must not carry,
// including those named by Connection. The value slices are shared with h,
// capped so that an Add on either side copies instead of writing into the
// other; net/http treats header values as immutable once set.
func replayableHeader(h http.Header) http.Header {
	if len(h) == 0 {
		return nil
	}
	named := h["Connection"]
	out := make(http.Header, len(h))
	for k, v := range h {
		if unreplayable[k] || listed(named, k) {
			continue
		}
		out[k] = v[:len(v):len(v)]
	}
	return out
}

func listed(connection []string, name string) bool {
	for _, line := range connection {
		for _, tok := range bytes.Split([]byte(line), []byte(",")) {
			if http.CanonicalHeaderKey(string(bytes.TrimSpace(tok))) == name {
				return true
			}
		}
	}
	return false
}

// recorder passes the response through to the client while keeping a copy
// for the store. It keeps Flush working for streaming handlers.
type recorder struct {
	http.ResponseWriter
	status      int
	wroteHeader bool
	header      http.Header // replayable headers, snapshot at WriteHeader
	body        []byte
	limit       int
	omitted     bool
	// writeErr is the first error writing to the client: the handler may
	// have stopped early, so the captured body may not be its answer.
	writeErr error
}

func (rw *recorder) WriteHeader(code int) {
	if rw.wroteHeader {
		rw.ResponseWriter.WriteHeader(code) // let net/http report the superfluous call
		return
	}
	if code >= 100 && code < 200 && code != http.StatusSwitchingProtocols {
		rw.ResponseWriter.WriteHeader(code) // informational: not the answer
		return
	}
	rw.wroteHeader = true
	rw.status = code
	rw.header = replayableHeader(rw.ResponseWriter.Header())
	rw.ResponseWriter.WriteHeader(code)
}

func (rw *recorder) Write(b []byte) (int, error) {
	if !rw.wroteHeader {
		rw.WriteHeader(http.StatusOK)
	}
	if !rw.omitted {
		if len(rw.body)+len(b) > rw.limit {
			rw.omitted = true
			rw.body = nil
		} else {
			// Sized by append: most handlers write once, and the copy is
			// kept for the record's whole retention.
			rw.body = append(rw.body, b...)
		}
	}
	n, err := rw.ResponseWriter.Write(b)
	if err != nil && rw.writeErr == nil {
		rw.writeErr = err
	}
	return n, err
}

// Flush sends what was written so far; capture continues.
func (rw *recorder) Flush() {
	if !rw.wroteHeader {
		rw.WriteHeader(http.StatusOK)
	}
	http.NewResponseController(rw.ResponseWriter).Flush()
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (rw *recorder) Unwrap() http.ResponseWriter { return rw.ResponseWriter }
